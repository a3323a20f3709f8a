"""Fail fast on a retriever that cannot serve the batch (`retrieval/preflight.py`, wired in
`vLLMRolloutAgent`): a dead retriever or a batch naming documents the index lacks is refused before
any sampling, with a message naming the fix ("fail", the default), or logged and run ("warn");
an unknown document counts as a request error, not a server failure; a batch whose retriever
items mostly failed logs a warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.rollout.agent_helpers import make_agent, prompt_batch
from vrag_rollout.config import AgentRolloutConfig
from vrag_rollout.data.prompts import PromptSample
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.preflight import (RetrieverPreflightError, failure_rate_warning, missing_documents,
                                              preflight_problem)

DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens


@pytest.fixture(scope="module")
def server_url():
    from retriever_server.api.testing import serve_in_thread
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    with serve_in_thread(prepare_index(cache_dir())) as url:
        yield url


def questions(*docs):
    return [PromptSample(question="Which page covers the board's approval?", doc_id=doc) for doc in docs]


@pytest.fixture
def engine_requests(monkeypatch):
    """Counts the requests either schedule sends to the engine: a refused batch sends none."""
    from vrag_rollout.engine import llm

    sent = []
    real_submit, real_generate = llm.ContinuousEngine.submit, llm.VLLMEngine.generate

    def submit(self, name, *args, **kwargs):
        sent.append(name)
        return real_submit(self, name, *args, **kwargs)

    def generate(self, prompts, params):
        sent.extend(range(len(prompts)))
        return real_generate(self, prompts, params)

    monkeypatch.setattr(llm.ContinuousEngine, "submit", submit)
    monkeypatch.setattr(llm.VLLMEngine, "generate", generate)
    return sent


# --- pure ---------------------------------------------------------------------------------------

def test_missing_documents_keeps_first_seen_order_and_skips_none():
    assert missing_documents({"a": 3}, ["b", None, "a", "c", "b"]) == ["b", "c"]


def test_failure_rate_warning_names_the_kinds_above_the_threshold():
    metrics = {"retriever/items": 8.0, "retriever/failures": 3.0, "retriever/failures/request": 3.0,
               "retriever/failures/server": 0.0}
    assert failure_rate_warning(metrics, 0.5) is None
    warning = failure_rate_warning(metrics, 0.25)
    assert "3 of 8 retriever items failed" in warning and "'request': 3.0" in warning and "server" not in warning
    assert failure_rate_warning({}, 0.0) is None


def test_the_config_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="retriever_preflight must be one of"):
        AgentRolloutConfig(retriever_preflight="maybe")
    with pytest.raises(ValueError, match="retriever_failure_warn_rate"):
        AgentRolloutConfig(retriever_failure_warn_rate=1.5)


# --- against the real server ----------------------------------------------------------------------

def sample_page_counts() -> dict:
    """{doc_id: pages} of the sample corpus's PDFs, counted by pypdfium2 (not by the index)."""
    import pypdfium2

    from vrag_rollout.devkit.demo import cache_dir

    counts = {}
    for pdf in sorted((cache_dir() / "sample-corpus").glob("*.pdf")):
        document = pypdfium2.PdfDocument(str(pdf))
        counts[pdf.stem] = len(document)
        document.close()
    return counts


@pytest.mark.process
def test_the_check_against_a_live_server(server_url):
    pages = sample_page_counts()
    with RetrieverClient(server_url) as client:
        known: dict = {}
        assert preflight_problem(client, ["annual_report", None, "safety_manual"], known) is None
        assert known == {"annual_report": pages["annual_report"], "safety_manual": pages["safety_manual"]}
        problem = preflight_problem(client, ["annual_report", "annual_reprot", "q3_memo"], known)
    assert "does not serve 2 document(s) of this batch: annual_reprot, q3_memo" in problem
    assert "vrag-retriever index" in problem and server_url in problem
    with RetrieverClient(DEAD_URL, retries=0, timeout=1.0) as dead:
        problem = preflight_problem(dead, ["annual_report"], {})
    assert "unreachable" in problem and "vrag-retriever serve" in problem


@pytest.mark.process
def test_page_counts_the_data_recorded_must_match_the_served_ones(server_url):
    pages = sample_page_counts()
    docs = ["annual_report", "annual_report", "safety_manual", None]
    right = [pages["annual_report"], pages["annual_report"], None, 7]  # None: not recorded for that row
    with RetrieverClient(server_url) as client:
        assert preflight_problem(client, docs, {}, right) is None
        wrong = [pages["annual_report"] + 1, pages["annual_report"] + 1, pages["safety_manual"], None]
        fresh = preflight_problem(client, docs, {}, wrong)
        known: dict = {}
        preflight_problem(client, docs, known)
        cached = preflight_problem(client, docs, known, wrong)  # answered from the cache: same verdict
    expected = (f"serves 1 document(s) of this batch with other page counts than the data recorded: annual_report "
                f"({pages['annual_report'] + 1} in the data, {pages['annual_report']} served)")
    assert expected in fresh and expected in cached
    assert "convert-dataset --index" in fresh and server_url in fresh


def test_a_batch_whose_page_counts_disagree_is_refused_before_sampling(server_url, tiny_model_dir, tiny_processor,
                                                                     tiny_llm, engine_requests):
    pages = sample_page_counts()
    with RetrieverClient(server_url) as client:
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=2)
        prompts = prompt_batch(tiny_processor, questions("annual_report", "safety_manual"), agent)
        prompts.non_tensor_batch["page_count"] = np.array([pages["annual_report"], pages["safety_manual"] - 1],
                                                          dtype=object)
        with pytest.raises(RetrieverPreflightError, match=r"safety_manual \(\d+ in the data, \d+ served\)"):
            agent.generate_sequences(prompts)
        assert engine_requests == []
        prompts.non_tensor_batch["page_count"][1] = pages["safety_manual"]  # the control: right counts run
        agent.generate_sequences(prompts)
    assert engine_requests


def test_a_batch_with_an_unknown_document_is_refused_before_sampling(server_url, tiny_model_dir, tiny_processor,
                                                                      tiny_llm, engine_requests):
    with RetrieverClient(server_url) as client:
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=2)
        prompts = prompt_batch(tiny_processor, questions("annual_report", "no_such_doc"), agent)
        with pytest.raises(RetrieverPreflightError, match="does not serve 1 document"):
            agent.generate_sequences(prompts)
        assert engine_requests == []
        agent.config.retriever_preflight = "off"  # the control: without the check the batch runs
        agent.generate_sequences(prompts)
    assert engine_requests


def test_a_dead_retriever_is_refused_before_sampling(tiny_model_dir, tiny_processor, tiny_llm, engine_requests):
    with RetrieverClient(DEAD_URL, retries=0, timeout=1.0) as client:
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=2)
        with pytest.raises(RetrieverPreflightError, match="unreachable.*vrag-retriever serve"):
            agent.generate_sequences(prompt_batch(tiny_processor, questions("annual_report"), agent))
    assert engine_requests == []


def test_warn_mode_goes_on_and_counts_the_unknown_document_as_a_request_error(server_url, tiny_model_dir,
                                                                             tiny_processor, tiny_llm, caplog):
    with RetrieverClient(server_url) as client, caplog.at_level(logging.WARNING, logger="vrag_rollout.rollout"):
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=4, max_turns=3,
                           retriever_preflight="warn", retriever_failure_warn_rate=0.0)
        output = agent.generate_sequences(prompt_batch(tiny_processor, questions("no_such_doc"), agent))
    metrics = output.meta_info["metrics"]
    assert metrics["retriever/failures"] > 0, "the demo grammar searches or fetches within 3 turns"
    assert metrics["retriever/failures/request"] == metrics["retriever/failures"]
    assert metrics["retriever/failures/server"] == 0
    messages = [record.getMessage() for record in caplog.records]
    assert any("retriever preflight: " in m and "no_such_doc" in m for m in messages), messages
    assert any("retriever items failed in this batch" in m for m in messages), messages
