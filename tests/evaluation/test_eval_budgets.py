"""`evaluate` under a visual budget and context edits (issue 49): the budget is part of the protocol
(recorded in the results header, so a resume under another budget is refused, and spelled out in
the report), set by its own flags; with context edits an episode is several rows of the saved
batch, and each question's record is its episode's, read from the episode's last row (a row an
edit closed is no episode: it has no answer and only part of the turns)."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.test_evaluate_job import converted, records_of, sample_index  # noqa: F401 (fixture)
from tests.evaluation.test_results_header import header
from vrag_rollout.cli import main
from vrag_rollout.devkit.evaluate_job import run_evaluation
from vrag_rollout.devkit.job_checks import JobInputError
from vrag_rollout.evaluation.protocol import BUDGET_FIELDS, Protocol
from vrag_rollout.evaluation.protocols import named
from vrag_rollout.evaluation.report import _protocol
from vrag_rollout.evaluation.results import ResultsFile, ResultsMismatch
from vrag_rollout.verify.saved_batch import load_rollout

BUDGET = {"search_page_max_pixels": 50176, "visual_token_budget": 512, "context_keep_turns": 2,
          "context_keep_pages": 3, "context_edit_form": "thumbnail", "context_edit_slack": 1}


def test_the_budget_is_a_protocol_switch_with_the_rollout_configs_names():
    from vrag_rollout.config import AgentRolloutConfig

    protocol = Protocol(**BUDGET)
    assert protocol.budget() == BUDGET and set(BUDGET) == set(BUDGET_FIELDS)
    defaults = AgentRolloutConfig()
    assert Protocol().budget() == {name: getattr(defaults, name) for name in BUDGET_FIELDS}  # off, as the config's
    for bad in ({"visual_token_budget": -1}, {"context_keep_turns": 1.5}, {"context_edit_form": "blur"},
                {"search_page_max_pixels": 0}, {"context_keep_pages": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Protocol(**bad)
    # over a named protocol, recorded as an override of it
    assert named("vrag-rl", {"context_keep_turns": 2}).overrides == {"context_keep_turns": 0}


@pytest.mark.parametrize("name", sorted(BUDGET))
def test_a_resume_under_another_budget_is_refused_naming_it(name, tmp_path):
    first = header(**BUDGET)
    assert all(first["protocol"][field] == value for field, value in BUDGET.items())
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, first).close()
    other = {**BUDGET, name: {"context_edit_form": "stub", "search_page_max_pixels": None}.get(name, 0)}
    with pytest.raises(ResultsMismatch, match=f"another protocol.{name} "):
        ResultsFile.open(path, header(**other))
    ResultsFile.open(path, header(**BUDGET)).close()  # the same budget resumes


def test_the_report_spells_out_the_budget():
    off = "\n".join(_protocol(header()))
    assert "`visual_token_budget`: 0 (no limit)" in off and "`context_keep_turns`: 0 (no context edit)" in off
    assert "`search_page_max_pixels`: none (search results at the page band)" in off
    on = "\n".join(_protocol(header(**BUDGET)))
    assert "`visual_token_budget`: 512" in on and "`context_keep_turns`: 2" in on
    assert "thumbnail (older images become thumbnails; an episode is several rows, scored from its last)" in on


def test_the_flags_set_the_protocols_budget(tmp_path, monkeypatch, capsys):
    seen = {}

    def caught(out, *, protocol, **kwargs):
        seen["protocol"] = protocol
        raise JobInputError("stop here")  # one line, exit 2: nothing rolled out

    monkeypatch.setattr("vrag_rollout.devkit.evaluate_job.run_evaluation", caught)
    argv = ["evaluate", "--data", str(tmp_path / "q.parquet"), "--index", str(tmp_path), "--out", str(tmp_path / "o")]
    flags = ["--search-page-max-pixels", "50176", "--visual-token-budget", "512", "--context-keep-turns", "2",
             "--context-keep-pages", "3", "--context-edit-form", "thumbnail", "--context-edit-slack", "1"]
    assert main(argv + flags) == 2 and "stop here" in capsys.readouterr().err
    assert seen["protocol"].budget() == BUDGET
    assert main(argv) == 2 and seen["protocol"].budget() == Protocol().budget()  # unset: off
    capsys.readouterr()
    assert main(argv + ["--visual-token-budget", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--visual-token-budget" in err and err.strip().count("\n") == 0 and "usage:" not in err


def test_under_context_edits_each_question_is_scored_from_its_episodes_last_row(
        tmp_path, sample_index, tiny_model_dir, tiny_llm):  # noqa: F811
    data, _scope = converted("mmlongbench-doc", tmp_path, sample_index)
    out = tmp_path / "eval"
    protocol = Protocol(max_turns=3, response_length=768, n=2, temperature=1.0, context_keep_pages=1)
    run_evaluation(out, data=data, model=str(tiny_model_dir), index=sample_index, grammar=True, protocol=protocol,
                   batch_size=4, llm=tiny_llm, progress=False)
    records = records_of(out)
    written = json.loads((out / "results.jsonl").read_text().splitlines()[0])["header"]
    assert written["protocol"]["context_keep_pages"] == 1
    questions = {r["question_id"] for r in records}
    assert len(records) == 2 * len(questions)  # one record per episode, not per row
    saved = {}
    cut = 0
    for record in records:
        batch = out / record["episode"]["batch"]
        batch = saved.setdefault(batch, load_rollout(batch.with_suffix(".pt")))
        columns, row = batch.columns, record["episode"]["row"]
        episode = columns["episode_id"][row]
        rows = [r for r, e in enumerate(columns["episode_id"]) if e == episode]
        assert row == rows[-1] and columns["termination_reason"][row] != "context_edit"
        assert record["termination"] == columns["termination_reason"][row]
        cut += len(rows) > 1
        # the episode's cost counts each row's own tokens once: every token it sampled
        loss = batch.tensors["loss_mask"]
        assert record["efficiency"]["sampled_tokens"] == sum(int(loss[r].sum()) for r in rows)
        assert record["turns"] == int(columns["num_turns"][row])
    assert cut, "no episode was cut by a context edit: nothing was shown"
    report = (out / "report.md").read_text()
    assert "`context_keep_pages`: 1" in report
