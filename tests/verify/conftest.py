"""Real rollout batches for the check/view tests, built once per session on the shared engine.

`grammar_rollout`: the demo's action grammar, retrieval replayed from the recorded fixture, so
episodes search, fetch and see pages. `free_rollout`: no grammar, rollout logprobs recorded, two
prompt images of the same size per prompt (for the forward-pass checks). `tempered_rollout`: no
grammar, temperature 0.7, top-k 50, top-p 0.9.
"""

from __future__ import annotations

import pytest

from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import Rollout, drawing, roll
from vrag_rollout.data.prompts import PromptSample


@pytest.fixture(scope="session")
def grammar_rollout(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory) -> Rollout:
    path = tmp_path_factory.mktemp("saved") / "grammar.pt"
    return roll(tiny_model_dir, tiny_processor, tiny_llm, sample_prompts(6), path, calculate_log_probs=True)


@pytest.fixture(scope="session")
def free_rollout(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory) -> Rollout:
    path = tmp_path_factory.mktemp("saved") / "free.pt"
    samples = [
        PromptSample(question="Which page covers revenue?", doc_id="annual_report",
                     images=[drawing(168, 196, 2 * i), drawing(168, 196, 2 * i + 1)])
        for i in range(2)
    ]
    return roll(tiny_model_dir, tiny_processor, tiny_llm, samples, path,
                calculate_log_probs=True, action_regex=None, response_length=48)


@pytest.fixture(scope="session")
def tempered_rollout(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory) -> Rollout:
    """No grammar, temperature 0.7, top-k 50, top-p 0.9: vLLM reports the processed distribution."""
    path = tmp_path_factory.mktemp("saved") / "tempered.pt"
    samples = [PromptSample(question="Which page covers revenue?", doc_id="annual_report",
                            images=[drawing(168, 196, 0)])]
    return roll(tiny_model_dir, tiny_processor, tiny_llm, samples, path, calculate_log_probs=True,
                action_regex=None, response_length=48, temperature=0.7, top_k=50, top_p=0.9)
