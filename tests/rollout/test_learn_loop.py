"""The closed GRPO loop (`training/learn.py`, wired by `devkit/learn_job.py`) learns, on the
tiny Qwen2-VL's engine, the find-the-page task (`devkit/learn_task.py`):

- the reward over the last steps is clearly above the first steps, and every post-sync logprob gap
  is within 1e-3 (the engine served each step's new weights);
- control 1, the same start with the advantage's sign flipped: the reward falls;
- control 2, observation tokens put into the loss mask on purpose: in the real run the gradient at
  every observation position is exactly zero, in the control it is not;
- the outputs: one well-formed metrics line per step, `reward.png`, `final/` (the trained weights
  in HF format) and `eval.pt`, which the forward check passes against `final/` and fails against
  the initial model (the engine really served trained weights);
- a skipped sync fails the run.

The two 12-step runs (the real one and control 1) run in a process of their own with its own
engine, beside the other tests (`learn_runs.py`, tests/background.py); the other runs here use
the session's engine, which is synced back to the original weights (and checked) after them:
other tests share it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from tests import background
from tests.rollout.learn_runs import SETTINGS, STEPS, fixture_retriever, learn_from_the_start, learn_runs
from vrag_rollout.devkit.learn_job import run_learn
from vrag_rollout.engine.weights import SYNC_TOLERANCE, check_synced, sync_weights
from vrag_rollout.training import grpo
from vrag_rollout.training.learn import (GAP_TOLERANCE, MOVEMENT_FACTOR, STEP_FIELDS, LearnError, check_record,
                                         no_signal, reward_summary)
from vrag_rollout.verify.check import run_check

MIN_GAIN = 0.2


@pytest.fixture(scope="module")
def original(tiny_model_dir, tiny_processor, tiny_llm):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    yield model
    sync_weights(tiny_llm, model)
    check_synced(tiny_llm, model, tiny_processor)


@pytest.fixture(scope="module")
@background.uses(learn_runs)
def runs(tmp_path_factory):
    return background.result(learn_runs, tmp_path_factory)


@pytest.fixture(scope="module")
def run(runs):
    """The real run: records, summary, metrics lines, per-step (gradient, loss mask, response mask),
    `trained` weights, `final_dir`, `eval_path`, the run's own check `report`, the engine's gap to
    the original model before and after."""
    return runs["run"]


@pytest.fixture(scope="module")
def flipped(runs):
    """Control 1: the same start and settings, every advantage negated (verl's, then times -1)."""
    return runs["flipped"]


# --- it learns, and the controls do not ----------------------------------------------------------

def test_the_reward_rises(run):
    summary = run["summary"]
    assert summary["gain"] >= MIN_GAIN, summary
    rewards = [r["reward_mean"] for r in run["records"]]
    assert summary == reward_summary(run["records"]) and summary["window"] == STEPS // 4
    assert max(rewards[-summary["window"]:]) > max(rewards[:summary["window"]]), rewards


def test_control_flipped_advantages_the_reward_falls(run, flipped):
    assert flipped["summary"]["gain"] < 0, flipped["summary"]
    assert flipped["summary"]["last"] < run["summary"]["first"] < run["summary"]["last"]
    # the same start: both runs' first rollouts come from the same weights and seeds
    assert flipped["records"][0]["reward_mean"] == run["records"][0]["reward_mean"]


def test_segmented_episodes_learn_with_one_advantage_per_episode(runs):
    """Under a context policy episodes train as several rows: the reward still rises, and every
    row of an episode carries its episode's one advantage on its own sampled tokens."""
    segmented = runs["segmented"]
    assert segmented["summary"]["gain"] >= MIN_GAIN, segmented["summary"]
    assert len(segmented["segments"]) == STEPS
    cut = 0  # episodes of several rows (a step whose episodes all fetched one page has none)
    for episode_ids, advantages, trained in segmented["segments"]:
        for episode in set(episode_ids.tolist()):
            rows = [r for r, e in enumerate(episode_ids) if e == episode]
            cut += len(rows) > 1
            values = torch.cat([advantages[r][trained[r]] for r in rows])
            assert torch.allclose(values, values[:1].expand_as(values)), (episode, values)
    assert cut > 0


def test_observation_tokens_get_exactly_zero_gradient_in_the_real_run(run):
    assert len(run["steps"]) == STEPS
    observed_total = 0
    for grad, sampled, response in run["steps"]:
        observed = response & ~sampled
        observed_total += int(observed.sum())
        assert (grad[observed] == 0).all()
        assert (grad[~response] == 0).all()
    assert observed_total > 0, "the run's episodes must hold observation tokens (fetched pages)"


def test_control_observations_in_the_mask_get_a_gradient(tmp_path, tiny_model_dir, tiny_processor, tiny_llm,
                                                         original, run):
    """Control 2: the loss over `response_mask` (sampled and observed tokens) instead of `loss_mask`.
    One step is enough: it is the real run's first rollout (the same start and seeds), whose
    episodes fetched pages (the first step of `make learn` shows retrieval), and a step without
    observation tokens fails the first assertion rather than pass."""
    real = grpo.grpo_loss
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo, "grpo_loss", lambda *args, **kwargs: real(*args, **{**kwargs, "mask_key": "response_mask"}))
        control = learn_from_the_start(tmp_path, tiny_model_dir, tiny_processor, tiny_llm, original, steps=1,
                                       evaluate=False)
    observed_grads = [grad[response & ~sampled] for grad, sampled, response in control["steps"]]
    assert sum(len(g) for g in observed_grads) > 0
    assert any((g != 0).any() for g in observed_grads)


# --- the engine served every step's weights ------------------------------------------------------

def test_every_post_sync_gap_is_within_tolerance(run):
    gaps = [json.loads(line)["logprob_gap_max"] for line in run["lines"]]
    assert len(gaps) == STEPS and all(0 <= gap <= SYNC_TOLERANCE for gap in gaps), gaps
    assert run["gap_before"] <= SYNC_TOLERANCE < run["gap_after"], (run["gap_before"], run["gap_after"])


def test_a_skipped_sync_fails_the_run(tmp_path, monkeypatch, tiny_model_dir, tiny_processor, tiny_llm, original, run):
    """The planted fault: the same wiring with `sync_weights` a no-op. The engine keeps the original
    weights, the HF model moves, and the first step's check fails the run before writing its line."""
    from vrag_rollout.engine import weights

    sync_weights(tiny_llm, original)
    monkeypatch.setattr(weights, "sync_weights", lambda llm, model: 0)
    with pytest.raises(LearnError, match="logprob gap"):
        run_learn(tmp_path, **{**SETTINGS, "steps": 2}, model_dir=tiny_model_dir, processor=tiny_processor,
                  llm=tiny_llm, retriever=fixture_retriever(), progress=False)
    [line] = (tmp_path / "metrics.jsonl").read_text().splitlines()  # the failing step's line, then the stop
    record = json.loads(line)
    assert record["logprob_gap_max"] == record["policy_movement"] > GAP_TOLERANCE


def test_a_learning_rate_too_small_for_the_sync_check_is_refused(tmp_path, monkeypatch, tiny_model_dir,
                                                                  tiny_processor, tiny_llm, original, run):
    """At lr 1e-7 an update moves the probe's logprobs by about 1e-4: a skipped sync would pass a
    1e-3 gap check. The run must say the check has no power rather than pass."""
    from vrag_rollout.engine import weights

    sync_weights(tiny_llm, original)
    monkeypatch.setattr(weights, "sync_weights", lambda llm, model: 0)
    with pytest.raises(LearnError, match="moved the policy by only .* Raise the learning rate"):
        run_learn(tmp_path, **{**SETTINGS, "steps": 1, "lr": 1e-7}, model_dir=tiny_model_dir,
                  processor=tiny_processor, llm=tiny_llm, retriever=fixture_retriever(), progress=False,
                  evaluate=False)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["policy_movement"] < MOVEMENT_FACTOR * GAP_TOLERANCE and record["grad_norm"] > 0


def test_learn_on_a_released_model_keeps_every_post_sync_gap_small(tmp_path, released_qwen2vl):
    """`learn --model DIR` on the released shape: the sync at the released logits width (151,936
    rows, a tied LM head) is served, every step's gap under 1e-3, and the policy really moved (the
    gap check had power). The shared engine is synced back to the original weights after."""
    model = released_qwen2vl
    original = AutoModelForImageTextToText.from_pretrained(model.model_dir, dtype=torch.float32).eval()
    try:
        result = run_learn(tmp_path, **{**SETTINGS, "steps": 2, "batch_size": 2, "n": 4}, model_dir=model.model_dir,
                           processor=model.processor, llm=model.llm, retriever=fixture_retriever(), progress=False,
                           evaluate=False)
        records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert records == result["records"] and len(records) == 2
        assert all(0 <= record["logprob_gap_max"] <= SYNC_TOLERANCE for record in records), records
        assert all(record["policy_movement"] > GAP_TOLERANCE for record in records), records
    finally:
        sync_weights(model.llm, original)
        check_synced(model.llm, original, model.processor)


# --- the outputs ---------------------------------------------------------------------------------

def test_one_well_formed_metrics_line_per_step(run):
    records = [json.loads(line) for line in run["lines"]]
    assert records == run["records"] and [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert tuple(record) == STEP_FIELDS
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in record.values()), record
        assert 0 <= record["reward_mean"] <= 1 and record["turns_mean"] >= 1 and record["kl_to_initial"] >= 0
        assert all(0 <= record[f"reward_{part}"] <= 1 for part in ("accuracy", "f1", "format", "retrieval"))
        assert min(record["seconds_rollout"], record["seconds_update"], record["seconds_sync"]) > 0
        assert record["policy_movement"] >= MOVEMENT_FACTOR * GAP_TOLERANCE > record["logprob_gap_max"]
    assert records[0]["kl_to_initial"] < 1e-6 < records[-1]["kl_to_initial"]  # step 1 samples the initial weights
    assert any(r["pages_shown_mean"] > 0 for r in records)
    # the live guard (on by default) inspected every sample of every step and found nothing: no false
    # alarm, nothing dropped, so the curve is the unguarded loop's
    samples = SETTINGS["batch_size"] * SETTINGS["n"]
    assert all(r["guard_checked"] == samples and r["guard_bad"] == r["guard_dropped"] == 0 for r in records)


def test_the_plot_is_written(run):
    with Image.open(run["eval_path"].parent / "reward.png") as image:
        assert image.format == "PNG" and image.width > 300 and image.height > 200


def test_final_holds_the_trained_weights(run, original):
    final = AutoModelForImageTextToText.from_pretrained(run["final_dir"], dtype=torch.float32)
    trained = run["trained"]  # the run's HF model's parameters after its last step
    assert all(torch.equal(p, trained[name]) for name, p in final.named_parameters())
    moved = sum(float((trained[name].detach() - p.detach()).abs().sum()) for name, p in original.named_parameters())
    assert moved > 0


def test_eval_batch_passes_the_forward_check_on_final_and_fails_on_the_initial_model(run, tiny_model_dir):
    assert run["report"].ok
    on_final = run_check(run["eval_path"], run["final_dir"], forward=True)
    assert on_final.ok, on_final.human()
    recorded = run_check(run["eval_path"], forward=True)  # no --model: the batch records final/
    assert recorded.ok and recorded.model_dir == str(run["final_dir"])
    on_initial = run_check(run["eval_path"], tiny_model_dir, forward=True)
    assert not on_initial.ok
    assert set(on_initial.by_check()) == {"forward"}, on_initial.human()


def test_your_own_questions_with_data(tmp_path, tiny_model_dir, tiny_processor, tiny_llm, original, run):
    """`--data`: the first rows of a converted dataset, scored against their own ground truths; the
    tiny model acts under the acting grammar and some group shows a reward difference within 3 steps
    (the acceptance asks 4), two of them before a checkpoint and one after `--resume`."""
    from vrag_rollout.data.dataset import convert_dataset

    rows = [{"uid": f"q{i}", "query": query, "reference_answer": answer,
             "meta_info": {"file_name": f"{doc}.pdf", "reference_page": [page]}}
            for i, (query, answer, doc, page) in enumerate([("Where is the muster point?", "car park", "safety_manual", 4),
                                                            ("What is E42?", "firmware reset", "product_guide", 4),
                                                            ("unused", "x", "annual_report", 1)])]
    (tmp_path / "qa.json").write_text(json.dumps(rows))
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    # converted against the index, as the README says: its page counts bound the pages a fetch asks for
    convert_dataset(tmp_path / "qa.json", tmp_path / "train.parquet", index_dir=prepare_index(cache_dir()))
    sync_weights(tiny_llm, original)
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.retrieval.client import RetrieverClient
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    # the grammar's searches are random words: replayed as unrecorded (an error observation), its fetches recorded
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL, strict=False))
    settings = dict(batch_size=2, n=2, response_length=96, model_dir=tiny_model_dir, processor=tiny_processor,
                    llm=tiny_llm, retriever=retriever, progress=False, data=tmp_path / "train.parquet", evaluate=False)
    out = tmp_path / "out"
    first = run_learn(out, steps=2, save_every=1, **settings)
    # checkpoints every 2 steps and after the last; every metrics line in TensorBoard too
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from vrag_rollout.devkit.learn_checkpoints import checkpoint_step, latest_checkpoint

    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00001", "step_00002"]
    assert checkpoint_step(latest_checkpoint(out)) == 2
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("learn/reward_mean")] == [1, 2]
    assert [e.value for e in events.Scalars("learn/reward_mean")] == pytest.approx(
        [r["reward_mean"] for r in first["records"]])
    # --resume: the latest checkpoint's weights into the model and the engine, then the steps after it
    import json as _json

    result = run_learn(out, steps=3, resume=True, **settings)
    records = result["records"]
    assert [r["step"] for r in records] == [1, 2, 3] and records[:2] == first["records"]
    assert [_json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # the tiny model acts under rollout's acting grammar: it retrieves, and some group's samples differ
    assert result["agent"].config.action_regex and result["agent"].config.first_turn_action_regex
    assert all(r["pages_shown_mean"] > 0 for r in records), records
    assert any(r["advantage_std"] > 0 for r in records), records
    assert len(records) == 3 and all(r["logprob_gap_max"] <= SYNC_TOLERANCE for r in records)
    assert result["questions"] == ["Where is the muster point?", "What is E42?"]
    assert result["truths"] == [{"answer": "car park", "doc_id": "safety_manual", "gold_pages": [4]},
                                {"answer": "firmware reset", "doc_id": "product_guide", "gold_pages": [4]}]


def test_check_without_model_refuses_a_batch_whose_model_is_not_here(run, tmp_path):
    from vrag_rollout.verify.check import CheckInputError

    saved = torch.load(run["eval_path"], weights_only=True)
    saved["model_path"] = str(tmp_path / "gone")
    torch.save(saved, tmp_path / "moved.pt")
    with pytest.raises(CheckInputError, match="records no model directory that exists here.*pass --model"):
        run_check(tmp_path / "moved.pt")


def test_check_against_another_family_says_which_tiny_model_to_build(run):
    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
    from vrag_rollout.verify.check import CheckInputError

    other = build_tiny_model(default_model_dir("qwen3-vl"), "qwen3-vl")
    with pytest.raises(CheckInputError, match="build-tiny-model --family qwen2-vl"):
        run_check(run["eval_path"], other)


# --- pure checks ----------------------------------------------------------------------------------

def test_a_gap_over_tolerance_fails_the_run():
    record = dict.fromkeys(STEP_FIELDS, 0.0)
    record["step"] = 1
    check_record(record)  # no gradient: nothing moved, nothing to prove
    record.update(grad_norm=1.0, policy_movement=MOVEMENT_FACTOR * GAP_TOLERANCE)
    check_record(record)
    record["policy_movement"] = 2 * GAP_TOLERANCE  # a no-op sync would pass: the check has no power
    with pytest.raises(LearnError, match="could not tell a missing weight sync"):
        check_record(record)
    record["policy_movement"] = 1.0
    record["logprob_gap_max"] = 2 * GAP_TOLERANCE
    with pytest.raises(LearnError, match="logprob gap"):
        check_record(record)
    record["logprob_gap_max"] = float("nan")
    with pytest.raises(LearnError):
        check_record(record)
    assert GAP_TOLERANCE == SYNC_TOLERANCE


@pytest.mark.parametrize("flag, value, message", [
    ("--n", "1", "n must be >= 2"), ("--steps", "0", "steps must be >= 1"), ("--lr", "-1", "lr must be > 0"),
    ("--batch-size", "4", "batch_size must be <= 3"), ("--data", "missing.parquet", "no such file"),
    ("--index", ".", "not a retriever index"),
])
def test_the_command_refuses_settings_it_cannot_learn_from(flag, value, message, capsys, tmp_path):
    from vrag_rollout.cli import main

    assert main(["learn", "--out", str(tmp_path), flag, value]) == 2
    said = capsys.readouterr().err
    assert message in said and said.startswith("vrag-rollout learn: error: ") and "usage:" not in said
    assert not any(tmp_path.iterdir())  # refused before anything ran or was written


def test_a_run_with_no_reward_difference_in_any_group_says_what_the_rewards_show():
    parts = {"reward_accuracy": 0.0, "reward_f1": 0.0, "reward_format": 0.0, "reward_retrieval": 0.0}
    idle = [{"advantage_std": 0.0, **parts, "turns_mean": 1.0, "pages_shown_mean": 0.0}] * 3
    said = no_signal(idle)
    assert said.startswith("no step had any reward difference") and "never wrote an action" in said
    assert "--grammar" in said and "accuracy 0.00, f1 0.00, format 0.00, retrieval 0.00" in said
    assert no_signal(idle[:1]).startswith("the step had no reward difference")
    acting = [{**idle[0], "turns_mean": 3.0, "pages_shown_mean": 2.0}]
    assert "no answer matched and no gold page was shown" in no_signal(acting)
    alike = [{**acting[0], "reward_format": 1.0}]
    assert "format 1.00" in no_signal(alike) and "more samples (--n)" in no_signal(alike)
    assert no_signal(idle + [{"advantage_std": 0.4}]) is None and no_signal([]) is None
