"""Session-wide fixtures: the tiny Qwen2-VL model, one vLLM engine, the recorded retrieval."""

from __future__ import annotations

from pathlib import Path

import pytest

from vrag_rollout.engine import configure_cpu_defaults, create_llm
from vrag_rollout.tiny_model import build_tiny_qwen2vl, default_model_dir

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE_RETRIEVAL = FIXTURES / "sample_retrieval.json"

configure_cpu_defaults()  # before anything imports vLLM


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The cached tiny model (built once, reused across sessions)."""
    return build_tiny_qwen2vl(default_model_dir())


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir):
    """One in-process vLLM engine on CPU for the whole session (every rollout test shares it)."""
    llm = create_llm(
        model=str(tiny_model_dir),
        dtype="float32",
        max_model_len=2048,
        max_num_batched_tokens=4096,
        enforce_eager=True,
        limit_mm_per_prompt={"image": 8, "video": 0},
        seed=0,
    )
    yield llm
    del llm
