"""`vrag-rollout learn`: the closed GRPO loop (`training/learn.py`) wired to the real pieces on CPU.

The tiny model of the demo (or a local checkpoint), its processor, the HF policy loaded from the
same directory in fp32, `vLLMRolloutAgent` with `calculate_log_probs=True` on the demo's config
(grammar-constrained actions, the demo questions, the embedded retriever on the sample corpus or
recorded fixtures), the project's reward against each question's page (`SAMPLE_FACTS`), verl's
GRPO step, and after every step `engine.weights.sync_weights` + `check_synced` on the engine the
rollout uses (a gap over 1e-3 raises, failing the run). Writes `out_dir/metrics.jsonl`.

`run_learn` takes an already running engine (`llm=`) and a retriever client (`retriever=`) so a
test can run the same wiring on its shared engine; by default it builds both.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from ..data.prompts import PromptSample


def learn_questions(count: int) -> tuple[list[PromptSample], list[dict]]:
    """The first `count` demo questions and their ground truths (answer: the page number)."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    from .demo import demo_questions

    by_question = {f"Which page covers {q}?": (doc, page) for q, (doc, page) in SAMPLE_FACTS.items()}
    samples = demo_questions()[:count]
    truths = []
    for sample in samples:
        doc, page = by_question[sample.question]
        truths.append({"answer": str(page), "doc_id": doc, "gold_pages": [page]})
    return samples, truths


def check_settings(*, steps: int, batch_size: int, n: int, max_turns: int, response_length: int,
                   temperature: float, lr: float) -> None:
    """Refuse settings the loop cannot learn from, before any model or engine is loaded."""
    problems = [f"{name} must be >= {low}, got {value}" for name, value, low in
                (("steps", steps, 1), ("batch_size", batch_size, 1), ("max_turns", max_turns, 1),
                 ("response_length", response_length, 1)) if value < low]
    if n < 2:
        problems.append(f"n must be >= 2 (GRPO compares the samples of a question with each other), got {n}")
    if not temperature > 0:
        problems.append(f"temperature must be > 0, got {temperature}")
    if not lr > 0:
        problems.append(f"lr must be > 0, got {lr}")
    if problems:
        raise ValueError("vrag-rollout learn: " + "; ".join(problems))


def run_learn(out_dir: Path, *, steps: int = 3, batch_size: int = 2, n: int = 4, max_turns: int = 3,
              response_length: int = 384, temperature: float = 1.0, lr: float = 1e-4, seed: int = 0,
              family: Optional[str] = None, model: Optional[str] = None, model_dir: Optional[Path] = None,
              processor: Any = None, llm: Any = None, retriever: Any = None, retriever_url: Optional[str] = None,
              fixtures: Optional[str] = None, log: Any = print) -> dict:
    """Run the loop; returns {"records", "hf_model", "llm", "agent", "model_dir", "processor"}."""
    check_settings(steps=steps, batch_size=batch_size, n=n, max_turns=max_turns,
                   response_length=response_length, temperature=temperature, lr=lr)
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..engine.llm import configure_cpu_defaults
    from ..engine.weights import check_synced, sync_weights
    from ..rollout.agent import vLLMRolloutAgent
    from ..training.learn import episode_rewards, learn
    from .demo import cache_dir, demo_config, demo_model, demo_page_band, demo_prompts, prepare_index

    configure_cpu_defaults()
    torch.manual_seed(seed)
    if model_dir is None:
        model_dir, _family = demo_model(family, model)
    processor = processor or AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    hf_model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    with ExitStack() as stack:
        if retriever is None and retriever_url is None and fixtures is None:
            from retriever_server.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(prepare_index(cache_dir())))
        config = demo_config(n=n, max_turns=max_turns, response_length=response_length, temperature=temperature,
                             seed=seed, calculate_log_probs=True,
                             retriever_url=retriever_url or "http://127.0.0.1:8002", retriever_fixtures=fixtures,
                             **demo_page_band(processor))
        agent = vLLMRolloutAgent(str(model_dir), config, tokenizer, processor, inference_engine=llm,
                                 retriever=retriever)
        engine = agent.inference_engine
        samples, truths = learn_questions(batch_size)
        prompts = demo_prompts(tokenizer, processor, samples, config)

        def sync(policy: Any) -> float:
            sync_weights(engine, policy)
            return check_synced(engine, policy, processor)

        records = learn(
            prompts, rollout=agent.generate_sequences, sync=sync,
            reward=lambda batch: episode_rewards(batch, tokenizer, truths),
            hf_model=hf_model, optimizer=torch.optim.AdamW(hf_model.parameters(), lr=lr, weight_decay=0.0),
            processor=processor, n=n, temperature=temperature, steps=steps, out_dir=Path(out_dir), log=log,
        )
    if log is not None:
        log(f"wrote {len(records)} steps to {Path(out_dir) / 'metrics.jsonl'}")
    return {"records": records, "hf_model": hf_model, "llm": engine, "agent": agent, "model_dir": model_dir,
            "processor": processor}
