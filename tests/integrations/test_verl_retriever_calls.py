"""The retriever calls of `vrag_agent` per trajectory, on verl's path, in both scopes.

verl runs one loop per trajectory, concurrently, in each worker process. The preflight (is the
retriever there, does it serve the rows' documents: `GET /documents`, the whole index's listing)
is a per-process fact, not a per-trajectory one: one listing serves every trajectory of the
process, whichever documents they name, and in corpus scope (rows without a document) too.
The policy's own calls are one search and one fetch per trajectory, whatever the scope.

verl's own `AgentLoopWorker` runs the loop (as `local_worker` builds it) on a scripted server
(search, fetch, answer: no engine); the retriever is the recorded sample retrieval, serving the
listing and corpus searches as the server does, with every request and item counted.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from vrag_rollout.data.prompts import PromptSample  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.engine.stand_ins.token_server import TokenAnswer  # noqa: E402
from vrag_rollout.integrations.verl import agent_loop  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.retrieval.client import RetrieverClient  # noqa: E402
from vrag_rollout.retrieval.fixtures import Fixtures, FixtureTransport  # noqa: E402
from vrag_rollout.rollout.driver import EpisodeDriver  # noqa: E402

DOCS = ("annual_report", "product_guide", "safety_manual")
QUERY = "board approved the Lisbon expansion"  # recorded for every document
CORPUS_HITS = "safety_manual"  # whose recorded hits a corpus search answers with
TRAJECTORIES = 8


class CountingIndex(FixtureTransport):
    """The recorded retrieval as a server answers it: `GET /documents` lists the documents, a
    corpus search (no document) answers with one document's recorded hits. Counts requests per
    route (`requests`) and items per route (`items`)."""

    def __init__(self, fixtures: Fixtures):
        super().__init__(fixtures, source=str(SAMPLE_RETRIEVAL))
        self.items: collections.Counter = collections.Counter()

    def get(self, path, timeout):
        with self._count_lock:
            self.requests[path] += 1
        if path == "/documents":
            return {"documents": [{"doc_id": doc, "num_pages": 6} for doc in DOCS]}
        return super().get(path, timeout)

    def post(self, path, body, timeout):
        with self._count_lock:
            self.items[path] += len(body.get("query") or body.get("page") or ())
        return super().post(path, body, timeout)

    def _search(self, doc_id, query, top_n):
        return super()._search(CORPUS_HITS if doc_id is None else doc_id, query, top_n)


class ScriptedServer:
    """verl's server manager, answering each trajectory's turns from a script (no engine)."""

    TURNS = (f"<think>look</think><search>{QUERY}</search>", "<think>read</think><fetch>image, 2</fetch>",
             "<think>done</think><answer>2</answer>")

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.turns: collections.Counter = collections.Counter()
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
        turn = self.turns[request_id]
        self.turns[request_id] += 1
        await asyncio.sleep(0)  # the other trajectories' coroutines go on meanwhile, as with a server
        ids = self.tokenizer.encode(self.TURNS[turn], add_special_tokens=False)
        ids += [self.end] if turn == len(self.TURNS) - 1 else []
        return TokenAnswer(ids, [-0.5] * len(ids), "completed")


@pytest.fixture
def index(monkeypatch):
    """Every driver built from here on uses a fresh counting index (and no driver is reused)."""
    counting = CountingIndex(Fixtures.load(SAMPLE_RETRIEVAL))
    monkeypatch.setattr(agent_loop, "_drivers", {})
    monkeypatch.setattr(EpisodeDriver, "_default_retriever", lambda self: RetrieverClient(None, transport=counting))
    return counting


def run_trajectories(model_dir, processor, doc_ids) -> object:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = demo_config(**demo_page_band(processor), n=1, retriever_fixtures=str(SAMPLE_RETRIEVAL),
                         action_regex=None, first_turn_action_regex=None)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    worker = local_worker(model_dir, None, settings, worker_class=AgentLoopWorker)
    worker.llm_client = ScriptedServer(worker.tokenizer)
    samples = [PromptSample(question=f"Which page says the board approved it? ({i})", doc_id=doc)
               for i, doc in enumerate(doc_ids)]
    return asyncio.run(worker.generate_sequences(prompt_rows(samples, "tags")))


@pytest.mark.parametrize("scope", ["document", "corpus"])
def test_one_listing_per_process_and_one_search_and_fetch_per_trajectory(tiny_model_dir, tiny_processor, index,
                                                                         scope):
    doc_ids = [DOCS[i % len(DOCS)] if scope == "document" else None for i in range(TRAJECTORIES)]
    out = run_trajectories(tiny_model_dir, tiny_processor, doc_ids)
    pages = [[page for turn in row for page in turn] for row in out.non_tensor_batch["page_ids"]]
    assert all(len(shown) == 3 for shown in pages), pages  # two hits, then the fetched page
    assert index.requests["/documents"] == 1, dict(index.requests)
    assert index.items["/batch_search"] == TRAJECTORIES and index.items["/batch_fetch"] == TRAJECTORIES
    run_trajectories(tiny_model_dir, tiny_processor, doc_ids)  # the process's next step: no new listing
    assert index.requests["/documents"] == 1, dict(index.requests)


def test_a_document_the_listing_lacks_is_asked_about_again(tiny_model_dir, tiny_processor, index):
    """The listing is cached, not frozen: a row naming a document it lacks lists again (the index
    may have been reloaded with it), and the preflight still refuses what the retriever lacks."""
    from vrag_rollout.retrieval.preflight import RetrieverPreflightError

    run_trajectories(tiny_model_dir, tiny_processor, [DOCS[0]])
    with pytest.raises(RetrieverPreflightError, match="does not serve 1 document.*no_such_doc"):
        run_trajectories(tiny_model_dir, tiny_processor, ["no_such_doc"])
    assert index.requests["/documents"] == 2
