"""Corpus scope end to end (issue 37's acceptance): questions converted `--from vidoseek` (corpus
scope by default) over an index of the sample corpus plus documents generated here roll out on
the real engine against the real retriever, served on loopback, in both action formats. The
batch passes the independent `check`, its pages come from several documents, each fetch read the
document of the last page shown before it (read back from the saved text alone), and the reward
counts a gold page as its (document, page)."""

from __future__ import annotations

import json
import re

import pytest

from tests.own_documents import OWN_DOCUMENTS, write_pdfs
from tests.rollout.agent_helpers import make_agent
from tests.rollout.test_dataset import question
from tests.rollout.test_sources import write_jsonl
from vrag_rollout.core.reward import score_response
from vrag_rollout.data import dataset, questions
from vrag_rollout.data.prompts import build_prompts
from vrag_rollout.devkit.demo import acting_grammar, one_of
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.saved_batch import from_dataproto

MAX_PAGE = 3


def asked() -> list[tuple[str, str, int]]:
    """(query, doc id, page): one fact of each sample document and one of each generated one."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    chosen, docs = [], set()
    for fact, (doc, page) in sorted(SAMPLE_FACTS.items()):
        if doc not in docs and page <= MAX_PAGE:
            chosen.append((fact, doc, page))
            docs.add(doc)
    chosen += [(pages[0].rstrip(".").lower(), doc, 1) for doc, pages in OWN_DOCUMENTS.items()]
    return chosen


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from retriever_server.indexing.indexer import build_index
    from retriever_server.sample_corpus import write_sample_corpus

    root = tmp_path_factory.mktemp("corpus")
    pdfs = write_sample_corpus(root / "sample") + write_pdfs(root / "generated", OWN_DOCUMENTS)
    index = build_index(pdfs, root / "index", min_pixels=32 * 28 * 28, max_pixels=128 * 28 * 28, progress=False)
    src = write_jsonl(root / "vidoseek.jsonl", [question(f"q{i}", f"{doc}.pdf", [page], f"Which page says {q}?",
                                                         str(page)) for i, (q, doc, page) in enumerate(asked())])
    return index, src


def shown_docs(output) -> set:
    return {page.rpartition("_")[0] for turns in output.non_tensor_batch["page_ids"] for turn in turns for page in turn}


def fetches_read_the_current_document(text: str, page_ids: list) -> int:
    """Checks, from the tags format's saved text alone, that each fetch that was answered with a
    page showed page N of the document of the last page shown before it; returns how many."""
    actions = re.findall(r"<(search|fetch)>(?:(?:image|text), (\d+))?", text)
    current, checked = None, 0
    for (kind, page), shown in zip(actions, page_ids):
        if kind == "fetch" and shown:
            assert current is not None and shown == [f"{current}_{page}"], (text, page_ids)
            checked += 1
        if shown:
            current = shown[-1].rpartition("_")[0]
    return checked


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_a_corpus_scope_rollout_passes_check_with_pages_of_several_documents(
        action_format, corpus, tmp_path, tiny_model_dir, tiny_processor, tiny_llm):
    from retriever_server.api.testing import serve_in_thread

    index, src = corpus
    out = tmp_path / "corpus.parquet"
    report = dataset.convert_dataset(src, out, index_dir=index, source_format="vidoseek", action_format=action_format)
    assert report.scope == "corpus" and report.written == len(asked()) and not report.missing_documents
    samples, truths = questions.read_questions(out)
    assert {s.doc_id for s in samples} == {None} and questions.written_for(samples) == (action_format, False)

    queries = one_of([q for q, _, _ in asked()])
    with serve_in_thread(index) as url:
        client = RetrieverClient(url)
        try:
            agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=3,
                               action_format=action_format, prompt_length=1536, response_length=512,
                               **acting_grammar(action_format, queries, MAX_PAGE))
            output = agent.generate_sequences(build_prompts(samples, tokenizer=tiny_processor.tokenizer,
                                                            processor=tiny_processor, config=agent.config))
        finally:
            client.close()
    report = check_batch(from_dataproto(output, processor=tiny_processor, model_path=tiny_model_dir,
                                        config=agent.config), tiny_model_dir)
    assert report.ok, report.human()
    assert list(output.non_tensor_batch["doc_id"]) == [None] * len(output)
    assert len(shown_docs(output)) >= 3, shown_docs(output)

    width, fetched, gold_shown = output.batch["responses"].shape[1], 0, 0
    for row in range(len(output)):
        used = output.batch["attention_mask"][row, -width:].bool()
        text = tiny_processor.tokenizer.decode(output.batch["responses"][row][used].tolist(), skip_special_tokens=True)
        pages = [list(turn) for turn in output.non_tensor_batch["page_ids"][row]]
        if action_format == "tags":
            fetched += fetches_read_the_current_document(text, pages)
        truth = truths[row // 2]
        (gold_doc, gold_page), = truth["gold_pages"]
        shown = {p for turn in pages for p in turn}
        scored = score_response(text, json.dumps({**truth, "page_ids": pages}))
        # the gold page counts only as that document's page: another document's page N is not gold
        assert (scored["retrieval"] > 0) == (f"{gold_doc}_{gold_page}" in shown), (row, pages, scored)
        gold_shown += f"{gold_doc}_{gold_page}" in shown
    assert gold_shown, "some episode was shown its gold page"
    if action_format == "tags":
        assert fetched, "some fetch read a page in corpus scope"
