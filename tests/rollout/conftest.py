"""Shared fixtures for rollout tests: the tiny Qwen2-VL directory and one vLLM engine per session."""

from __future__ import annotations

import os

import pytest

from vrag_rollout.tiny_model import build_tiny_qwen2vl, default_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The cached tiny model (built once, reused across sessions)."""
    return build_tiny_qwen2vl(default_model_dir())


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir):
    """One in-process vLLM engine on CPU for the whole session (loading it costs ~15 s)."""
    # Must be set before vLLM reads its environment.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    vllm = pytest.importorskip("vllm")
    llm = vllm.LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        max_model_len=4096,
        enforce_eager=True,
        limit_mm_per_prompt={"image": 8, "video": 0},
        seed=0,
    )
    yield llm
    del llm
