"""The closed GRPO loop (`training/learn.py`, wired by `devkit/learn_job.py`) on the session's tiny
engine: each step writes one well-formed metrics line, every post-sync logprob gap is within 1e-3,
the HF weights move, and the engine serves the moved weights (its gap to the ORIGINAL model is
above 1e-3 after the run, and within it before: the control). The loop's gap check fails a run.
The engine is synced back to the original weights (and checked) at the end: other tests share it."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from transformers import AutoModelForImageTextToText

from tests.conftest import SAMPLE_RETRIEVAL
from vrag_rollout.devkit.learn_job import run_learn
from vrag_rollout.engine.weights import SYNC_TOLERANCE, check_synced, logprob_gap, sync_weights
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.training.learn import GAP_TOLERANCE, STEP_FIELDS, LearnError, check_record

STEPS = 3


@pytest.fixture(scope="module")
def original(tiny_model_dir, tiny_processor, tiny_llm):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    yield model
    sync_weights(tiny_llm, model)
    check_synced(tiny_llm, model, tiny_processor)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, tiny_processor, tiny_llm, original):
    before = logprob_gap(tiny_llm, original, tiny_processor)
    out = tmp_path_factory.mktemp("learn")
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    started = time.perf_counter()
    result = run_learn(out, steps=STEPS, model_dir=tiny_model_dir, processor=tiny_processor, llm=tiny_llm,
                       retriever=retriever)
    result["seconds"] = time.perf_counter() - started
    result["gap_before"] = before
    result["gap_after"] = logprob_gap(tiny_llm, original, tiny_processor)
    result["lines"] = (out / "metrics.jsonl").read_text().splitlines()
    print(f"\nlearn: {STEPS} steps in {result['seconds']:.1f}s; original-model gap before {before:.3e}, "
          f"after {result['gap_after']:.3e}")
    for line in result["lines"]:
        print(line)
    return result


def test_the_engine_is_shared_and_on_the_original_weights_first(run, tiny_llm):
    assert run["llm"] is tiny_llm
    assert run["gap_before"] <= SYNC_TOLERANCE  # control for the "serves the new weights" check below


def test_one_well_formed_metrics_line_per_step(run):
    records = [json.loads(line) for line in run["lines"]]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert tuple(record) == STEP_FIELDS
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in record.values()), record
        assert 0 <= record["reward_mean"] and record["turns_mean"] >= 1 and record["grad_norm"] >= 0
        assert min(record["seconds_rollout"], record["seconds_update"], record["seconds_sync"]) > 0
    assert records == run["records"]


def test_every_post_sync_gap_is_within_tolerance(run):
    gaps = [json.loads(line)["logprob_gap_max"] for line in run["lines"]]
    assert len(gaps) == STEPS and all(0 <= gap <= SYNC_TOLERANCE for gap in gaps), gaps


def test_the_hf_weights_moved(run, original):
    trained = dict(run["hf_model"].named_parameters())
    moved = sum(float((trained[name].detach() - p.detach()).abs().sum()) for name, p in original.named_parameters())
    assert moved > 0
    assert any(r["advantage_std"] > 0 and r["grad_norm"] > 0 for r in run["records"])


def test_the_engine_serves_the_moved_weights(run):
    assert run["gap_after"] > SYNC_TOLERANCE, run["gap_after"]


def test_a_skipped_sync_fails_the_run(run, tmp_path, monkeypatch, tiny_model_dir, tiny_processor, tiny_llm,
                                      original):
    """The planted fault: the same wiring with `sync_weights` a no-op. The engine keeps the original
    weights, the HF model moves, and the first step's check fails the run after writing its line."""
    from vrag_rollout.engine import weights

    sync_weights(tiny_llm, original)  # after `run`: start from the original weights again
    monkeypatch.setattr(weights, "sync_weights", lambda llm, model: 0)
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    with pytest.raises(weights.WeightSyncError, match="logprob gap"):
        run_learn(tmp_path, steps=STEPS, model_dir=tiny_model_dir, processor=tiny_processor, llm=tiny_llm,
                  retriever=retriever)
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # the failed step wrote no line


def test_a_gap_over_tolerance_fails_the_run():
    record = dict.fromkeys(STEP_FIELDS, 0.0)
    record["step"] = 1
    check_record(record)
    record["logprob_gap_max"] = 2 * GAP_TOLERANCE
    with pytest.raises(LearnError, match="logprob gap"):
        check_record(record)
    record["logprob_gap_max"] = float("nan")
    with pytest.raises(LearnError):
        check_record(record)
    assert GAP_TOLERANCE == SYNC_TOLERANCE


@pytest.mark.parametrize("flag, value, message", [("--n", "1", "n must be >= 2"), ("--steps", "0", "steps must be >= 1"),
                                                  ("--lr", "-1", "lr must be > 0")])
def test_the_command_refuses_settings_it_cannot_learn_from(flag, value, message, capsys, tmp_path):
    from vrag_rollout.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["learn", "--out", str(tmp_path), flag, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran or was written
