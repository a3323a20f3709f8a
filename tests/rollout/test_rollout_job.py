"""`vrag-rollout rollout`: the agent on a user's own documents and questions (written here, not the
sample corpus), saved as a batch that `check` passes and `view` shows (issue 33 item 1)."""

from __future__ import annotations

import json

import pytest

from tests.own_documents import OWN_DOCUMENTS, OWN_QUESTIONS, write_own_data


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    return write_own_data(tmp_path_factory.mktemp("own"))


def test_rollout_on_own_documents_and_questions_passes_check(own, tmp_path, tiny_model_dir, tiny_llm, capsys):
    from vrag_rollout.devkit.rollout_job import run_rollout
    from vrag_rollout.verify.check import run_check
    from vrag_rollout.verify.saved_batch import load_rollout

    out = tmp_path / "mine.pt"
    result = run_rollout(out, data=own.parquet, index=own.index, model=str(tiny_model_dir), n=2,
                         grammar=True, response_length=512, llm=tiny_llm)
    output = result["output"]
    assert len(output) == 2 * len(OWN_QUESTIONS)
    columns = output.non_tensor_batch
    assert list(columns["doc_id"]) == ["garden_plan", "garden_plan", "bike_manual", "bike_manual"]
    # the grammar's first turn retrieves (a search, or a fetch that may name a page past the end):
    # every page an episode was shown is of its own document, and each document's were shown
    shown_by_doc: dict = {}
    for doc, turns in zip(columns["doc_id"], columns["page_ids"]):
        shown = [page for turn in turns for page in turn]
        assert all(page.rsplit("_", 1)[0] == doc for page in shown), (doc, shown)
        assert all(1 <= int(page.rsplit("_", 1)[1]) <= len(OWN_DOCUMENTS[doc]) for page in shown)
        shown_by_doc.setdefault(doc, []).extend(shown)
    assert all(shown_by_doc[doc] for doc in OWN_DOCUMENTS), shown_by_doc
    truths = [json.loads(truth) for truth in columns["ground_truth"]]
    assert [t["answer"] for t in truths] == ["north fence", "north fence", "four bar", "four bar"]
    assert all(0.0 <= reward["overall"] <= 1.0 for reward in columns["reward"])

    report = run_check(out, tiny_model_dir)  # the independent checker, again, on the saved file
    assert report.ok, report.human()
    saved = load_rollout(out)
    assert saved.model_path == str(tiny_model_dir) and saved.action_grammar  # the grammar is recorded
    assert result["html"].is_file() and "Where do the compost bins sit?" in result["html"].read_text()
    printed = capsys.readouterr().out
    assert "PASS" in printed and "saved 4 samples" in printed


def test_questions_written_for_one_format_refuse_another(own):
    from vrag_rollout.data.questions import read_questions
    from vrag_rollout.devkit.job_checks import JobInputError
    from vrag_rollout.devkit.rollout_job import job_format

    samples, _truths = read_questions(own.parquet)
    assert job_format(samples, None, None) == ("tags", False)
    assert job_format(samples, "tags", None) == ("tags", False)
    with pytest.raises(JobInputError, match="written for tags.*convert-dataset --action-format tool_call"):
        job_format(samples, "tool_call", None)


def test_the_verl_layout_reads_back_the_same_questions(own, tmp_path):
    from vrag_rollout.data.dataset import convert_dataset
    from vrag_rollout.data.questions import read_questions

    convert_dataset(own.questions, tmp_path / "verl.parquet", layout="verl", action_format="tool_call")
    samples, truths = read_questions(tmp_path / "verl.parquet")
    easyr1_samples, easyr1_truths = read_questions(own.parquet)
    assert [s.question for s in samples] == [s.question for s in easyr1_samples]
    assert [s.doc_id for s in samples] == ["garden_plan", "bike_manual"]
    assert truths == easyr1_truths


def test_the_acting_grammar_fetches_only_pages_the_documents_have(own):
    import re

    from vrag_rollout.devkit.demo import FREE_QUERY, page_numbers, turn_regex
    from vrag_rollout.devkit.rollout_job import grammar_max_page, page_counts_of

    assert grammar_max_page(page_counts_of(own.parquet, 8), None) == 3
    assert grammar_max_page(None, own.partial_index) == 2
    assert grammar_max_page(None, None) == 9
    pages = re.compile(page_numbers(12))
    assert all(pages.fullmatch(str(n)) for n in range(1, 13)) and not pages.fullmatch("13")
    turn = re.compile(turn_regex("tags", FREE_QUERY, 3, answer=False))
    assert turn.fullmatch("<think>look</think><search>compost bins</search>")
    assert turn.fullmatch("<think>look</think><fetch>image, 3</fetch>")
    assert not turn.fullmatch("<think>look</think><fetch>image, 4</fetch>")
    assert not turn.fullmatch("<think>look</think><answer>north fence</answer>")
