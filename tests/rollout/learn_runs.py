"""The learn loop test's two long runs (tests/rollout/test_learn_loop.py), in a process of their own.

`learn_runs(work_dir, job)` is background work (tests/background.py): it runs this module as a
script, ``python -m tests.rollout.learn_runs WORK_DIR``, beside the in-process tests. The script
starts its own engine on the tiny Qwen2-VL with the session engines' settings
(`tests.conftest.ENGINE_ARGS`) and, from the original weights, runs

- `run`: the real loop, `STEPS` steps with the final evaluation, with the engine's logprob gap to
  the original model before and after it;
- `flipped`: control 1, the same start and settings with every advantage negated;
- `segmented`: the same start and settings under a context policy (`SEGMENTED`): episodes cut
  into rows by context edits, each step's episode ids and advantages recorded;

then saves what the tests read (records, summary, metrics lines, each step's log-prob gradient and
masks, the trained weights, the outputs' paths) to ``WORK_DIR/runs.pt``. Its own engine is used by
nothing else, so it is not synced back.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

STEPS = 12  # measured: the reward rises from 0.15 to about 0.8 by then (docs/learning.md)
SETTINGS = dict(steps=STEPS, batch_size=3, n=8, lr=1e-3, seed=0)
SEGMENTED = dict(context_keep_pages=1)  # the segmented run's context policy
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 3600


def fixture_retriever():
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.retrieval.client import RetrieverClient
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    return RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))


def learn_from_the_start(out, tiny_model_dir, tiny_processor, tiny_llm, original, **settings):
    """A run from the original weights, recording each step's log-prob gradient and masks:
    `result["steps"]` holds (gradient, loss mask, response mask) per step."""
    from vrag_rollout.devkit.learn_job import run_learn
    from vrag_rollout.engine.weights import sync_weights
    from vrag_rollout.training import grpo

    sync_weights(tiny_llm, original)  # a previous run left its trained weights in the engine
    steps, segments, real_loss = [], [], grpo.grpo_loss

    def recording_loss(*args, **kwargs):
        loss, log_prob, advantages, metrics = real_loss(*args, **kwargs)
        log_prob.retain_grad()
        batch = args[2]
        steps.append((log_prob, batch.batch["loss_mask"].bool(), batch.batch["response_mask"].bool()))
        if "episode_id" in batch.non_tensor_batch:  # a segmented step: its rows' episodes and advantages
            segments.append((batch.non_tensor_batch["episode_id"].copy(), advantages.detach().clone(),
                             batch.batch["loss_mask"].bool().clone()))
        return loss, log_prob, advantages, metrics

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo, "grpo_loss", recording_loss)
        result = run_learn(out, **{**SETTINGS, **settings}, model_dir=tiny_model_dir, processor=tiny_processor,
                           llm=tiny_llm, retriever=fixture_retriever(), progress=False)
    result["steps"] = [(log_prob.grad, sampled, response) for log_prob, sampled, response in steps]
    result["segments"] = segments
    result["lines"] = (out / "metrics.jsonl").read_text().splitlines()
    return result


def learn_runs(work: Path, job) -> dict:
    """{"run": ..., "flipped": ...} (module docstring), computed by this module's script in `work`."""
    import torch

    command = (f"PYTHONPATH={shlex.quote(str(ROOT))}${{PYTHONPATH:+:$PYTHONPATH}} "
               f"{shlex.quote(sys.executable)} -m tests.rollout.learn_runs {shlex.quote(str(work))}")
    code, out, err = job.run_command(command, work, 1, TIMEOUT_S)
    if code != 0:
        raise RuntimeError(f"the learn runs failed (exit status {code}):\n{out[-2000:]}\n{err[-4000:]}")
    print(out)
    return torch.load(work / "runs.pt", weights_only=False)


def main(work: Path) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tests.conftest import ENGINE_ARGS
    from vrag_rollout.devkit.tiny_model import build_tiny_qwen2vl, default_model_dir
    from vrag_rollout.engine.llm import create_llm
    from vrag_rollout.engine.weights import logprob_gap
    from vrag_rollout.training import grpo

    model_dir = build_tiny_qwen2vl(default_model_dir())
    processor = AutoProcessor.from_pretrained(model_dir)
    llm = create_llm(model=str(model_dir), **ENGINE_ARGS)
    original = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()

    before = logprob_gap(llm, original, processor)
    run = learn_from_the_start(work / "learn", model_dir, processor, llm, original)
    after = logprob_gap(llm, original, processor)
    print(f"learn: {run['summary']}; original-model gap before {before:.3e}, after {after:.3e}")

    real = grpo.grpo_advantages
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo, "grpo_advantages", lambda *args, **kwargs: -real(*args, **kwargs))
        flipped = learn_from_the_start(work / "flipped", model_dir, processor, llm, original, evaluate=False)
    print(f"flipped advantages: {flipped['summary']}")

    # the same task with a context policy: the first search's first page is a stub from turn 2 on,
    # so episodes train as several rows (each weighed as one episode)
    segmented = learn_from_the_start(work / "segmented", model_dir, processor, llm, original, evaluate=False,
                                     context=SEGMENTED)
    print(f"segmented episodes: {segmented['summary']}")

    kept = ("records", "summary", "lines", "steps", "final_dir", "eval_path")
    saved = {
        "run": {**{key: run[key] for key in kept}, "gap_before": before, "gap_after": after,
                "trained": {name: p.detach().clone() for name, p in run["hf_model"].named_parameters()},
                "report": SimpleNamespace(ok=run["report"].ok, text=run["report"].human())},
        "flipped": {key: flipped[key] for key in ("records", "summary")},
        "segmented": {key: segmented[key] for key in ("records", "summary", "segments")},
    }
    torch.save(saved, work / "runs.pt.tmp")
    os.replace(work / "runs.pt.tmp", work / "runs.pt")


if __name__ == "__main__":
    from vrag_rollout.engine.llm import configure_cpu_defaults

    configure_cpu_defaults()  # before anything imports vLLM, as tests/conftest.py
    main(Path(sys.argv[1]))
