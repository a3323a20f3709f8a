"""A training file converted from each public set's layout is consumed end to end: questions about
the sample corpus, written in the set's own released layout, go through `convert-dataset --from
<set> --index` (against the real sample index: documents and gold pages checked, page counts
recorded), `read_questions`, the prompts and a real rollout on the engine with the demo's
recorded retrieval; the project's `check` passes on the batch and the reward reads each row's
converted ground truth (its gold page is the one the sample corpus puts the fact on)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent
from tests.rollout.test_dataset import question as vidoseek_question
from tests.rollout.test_sources import longbench, longdoc, mmdocir_doc, mmdocir_q, slide_qa, write_jsonl
from vrag_rollout.core.reward import score_response
from vrag_rollout.data import dataset, questions
from vrag_rollout.data.prompts import build_prompts
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.saved_batch import from_dataproto

FACTS = 2  # questions per set


def facts() -> list[tuple[str, str, int]]:
    """(fact, doc id, page) from the sample corpus, two documents."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    chosen, docs = [], set()
    for fact, (doc, page) in sorted(SAMPLE_FACTS.items()):
        if doc not in docs:
            chosen.append((fact, doc, page))
            docs.add(doc)
    return chosen[:FACTS]


def written_in(layout: str, tmp_path):
    """The facts' questions in `layout`'s released file format (each set's own fields, page base
    and answer encoding), about the sample corpus documents."""
    asked = [(f"Which page covers {fact}?", doc, page) for fact, doc, page in facts()]
    if layout == "vidoseek":
        return write_jsonl(tmp_path / "vidoseek.jsonl", [vidoseek_question(f"v{i}", f"{doc}.pdf", [page], q, str(page))
                                                         for i, (q, doc, page) in enumerate(asked)])
    if layout == "slidevqa":
        return write_jsonl(tmp_path / "test.jsonl", [slide_qa(i, deck=doc, pages=[page], answer=str(page), question=q)
                                                     for i, (q, doc, page) in enumerate(asked)])
    if layout == "mmdocir":  # pages from 0
        return write_jsonl(tmp_path / "MMDocIR_annotations.jsonl",
                           [mmdocir_doc(f"{doc}.pdf", [mmdocir_q(q, str(page), [page - 1])]) for q, doc, page in asked])
    if layout == "longdocurl":
        return write_jsonl(tmp_path / "LongDocURL.jsonl", [longdoc(f"l{i}", doc, str(page), [page], "String", q)
                                                           for i, (q, doc, page) in enumerate(asked)])
    path = tmp_path / "samples.json"  # mmlongbench-doc: one JSON list, pages as a list in a string
    path.write_text(json.dumps([longbench(f"{doc}.pdf", q, str(page), f"[{page}]", "Str") for q, doc, page in asked]))
    return path


@pytest.fixture(scope="module")
def sample_index():
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    return prepare_index(cache_dir())


@pytest.mark.parametrize("layout", dataset.SOURCE_FORMATS)
def test_a_converted_set_rolls_out_and_checks(layout, tmp_path, sample_index, tiny_model_dir, tiny_processor, tiny_llm):
    out = tmp_path / "train.parquet"
    # document scope: the demo's recorded retrieval is per document (corpus scope: test_corpus_rollout)
    report = dataset.convert_dataset(written_in(layout, tmp_path), out, index_dir=sample_index, source_format=layout,
                                     scope="document")
    assert report.written == FACTS and not report.missing_documents and not report.pages_out_of_range, report
    assert all(count > 0 for count in pq.read_table(out).to_pydict()["page_count"])  # from the index
    samples, truths = questions.read_questions(out)
    assert [(t["doc_id"], t["gold_pages"]) for t in truths] == [(doc, [page]) for _, doc, page in facts()]

    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=3)
    output = agent.generate_sequences(build_prompts(samples, tokenizer=tiny_processor.tokenizer,
                                                    processor=tiny_processor, config=agent.config))
    report = check_batch(from_dataproto(output, processor=tiny_processor, model_path=tiny_model_dir,
                                        config=agent.config), tiny_model_dir)
    assert report.ok, report.human()
    width, golds = output.batch["responses"].shape[1], []
    for row in range(len(output)):
        truth = truths[row // 2]
        assert output.non_tensor_batch["doc_id"][row] == truth["doc_id"]
        used = output.batch["attention_mask"][row, -width:].bool()
        text = tiny_processor.tokenizer.decode(output.batch["responses"][row][used].tolist(), skip_special_tokens=True)
        pages = [list(turn) for turn in output.non_tensor_batch["page_ids"][row]]
        scored = score_response(text, {**truth, "page_ids": pages})
        shown_gold = f"{truth['doc_id']}_{truth['gold_pages'][0]}" in {p for turn in pages for p in turn}
        assert (scored["retrieval"] > 0) == shown_gold, (row, pages, scored)
        golds.append(shown_gold)
    assert any(golds), "some episode was shown its gold page (the retrieval part was read)"
