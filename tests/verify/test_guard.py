"""The live guard (`verify/guard.py`) on real rollout batches: clean batches pass, and each planted
defect marks exactly the sample `check` (the independent checker, on the same batch) fails; the
policy drops, stops or only reports."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.verify.helpers import (copy_sample, delete_response_token, observation_blocks, response_image_runs,
                                  rows_with_response_images, token_id)
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.guard import Guard, GuardFailure, apply
from vrag_rollout.verify.saved_batch import load_rollout


def trainer_batch(saved) -> SimpleNamespace:
    """The saved batch as the trainer holds it in memory: tensors, columns, PIL images."""
    columns = {name: np.array(values, dtype=object) for name, values in saved.columns.items()}
    columns["multi_modal_data"] = np.array([{"images": saved.decoded_images(s)} for s in range(len(saved))],
                                           dtype=object)
    return SimpleNamespace(batch=dict(saved.tensors), non_tensor_batch=columns, meta_info=dict(saved.meta))


@pytest.fixture(scope="module")
def guard(grammar_rollout):
    return Guard(grammar_rollout.model_dir, positions_fraction=1.0)


@pytest.fixture
def saved(grammar_rollout):
    return load_rollout(grammar_rollout.path)  # a fresh copy per test


def bad_per_check(saved, model_dir) -> set[int]:
    return {f.sample for f in check_batch(saved, model_dir).failures}


@pytest.mark.parametrize("name", ["grammar_rollout", "free_rollout", "tempered_rollout"])
def test_clean_batches_pass(name, request):
    rollout = request.getfixturevalue(name)
    report = Guard(rollout.model_dir, positions_fraction=1.0).inspect(rollout.output, rollout.config)
    assert report.ok, report.lines()
    assert report.positions_checked == list(range(len(rollout.output)))


def shift_positions(saved, processor):
    image_pad = token_id(processor, "<|image_pad|>")
    row = rows_with_response_images(saved, image_pad)[0]
    P = saved.tensors["prompts"].shape[1]
    saved.tensors["position_ids"][row, :, P + response_image_runs(saved, row, image_pad)[0][0]:] += 1
    return row


def cut_a_pad(saved, processor):
    image_pad = token_id(processor, "<|image_pad|>")
    row = rows_with_response_images(saved, image_pad)[0]
    delete_response_token(saved, row, response_image_runs(saved, row, image_pad)[0][1] - 1)
    return row


def observation_in_the_loss(saved, processor):
    row = next(r for r in range(len(saved)) if observation_blocks(saved, r))
    saved.tensors["loss_mask"][row, observation_blocks(saved, row)[0][0] + 1] = 1
    return row


def vision_token_sampled(saved, processor):
    row, P = 1, saved.tensors["prompts"].shape[1]
    position = int(saved.tensors["loss_mask"][row].nonzero()[2])
    for key, offset in (("responses", 0), ("input_ids", P)):
        saved.tensors[key][row, offset + position] = token_id(processor, "<|image_pad|>")
    return row


def past_the_eos(saved, processor):
    """Tokens kept after the episode's end (a split stop string's remainder, kept)."""
    P, R = saved.tensors["prompts"].shape[1], saved.tensors["responses"].shape[1]
    reasons = saved.columns["termination_reason"]
    row = next(r for r in range(len(saved)) if reasons[r] == "answered"
               and int(saved.tensors["response_mask"][r].sum()) < R - 3)
    used = int(saved.tensors["response_mask"][row].sum())
    for key in ("response_mask", "loss_mask"):
        saved.tensors[key][row, used:used + 3] = 1
    saved.tensors["attention_mask"][row, P + used:P + used + 3] = 1
    return row


def duplicated_group(saved, processor):
    first, second = 2, 3  # prompt 1's two samples
    copy_sample(saved, first, second)
    return first


DEFECTS = [shift_positions, cut_a_pad, observation_in_the_loss, vision_token_sampled, past_the_eos, duplicated_group]


@pytest.mark.parametrize("plant", DEFECTS, ids=[d.__name__ for d in DEFECTS])
def test_each_planted_defect_marks_the_sample_check_fails(plant, saved, guard, grammar_rollout, tiny_processor):
    row = plant(saved, tiny_processor)
    report = guard.inspect(trainer_batch(saved), grammar_rollout.config)
    assert report.bad_samples == [row], report.lines()
    assert bad_per_check(saved, grammar_rollout.model_dir) == {row}


def test_drop_masks_exactly_the_bad_samples_and_fail_stops(saved, guard, grammar_rollout, tiny_processor):
    rows = {observation_in_the_loss(saved, tiny_processor), vision_token_sampled(saved, tiny_processor)}
    batch = trainer_batch(saved)
    before = {key: batch.batch[key].clone() for key in ("response_mask", "loss_mask")}
    report = guard.inspect(batch, grammar_rollout.config)
    assert set(report.bad_samples) == rows
    with pytest.raises(GuardFailure, match=rf"guard: {len(rows)} of {len(saved)} samples fail"):
        apply(batch, report, "fail")
    assert apply(batch, report, "warn")["guard/dropped"] == 0
    assert all(torch.equal(batch.batch[key], before[key]) for key in before)
    metrics = apply(batch, report, "drop")
    assert metrics["guard/dropped"] == len(rows) and metrics["guard/bad"] == len(rows)
    for key, old in before.items():
        assert int(batch.batch[key][sorted(rows)].sum()) == 0
        kept = [s for s in range(len(saved)) if s not in rows]
        assert torch.equal(batch.batch[key][kept], old[kept])
    with pytest.raises(ValueError, match="guard must be one of"):
        apply(batch, report, "skip")


def test_positions_are_compared_on_the_chosen_fraction(grammar_rollout):
    report = Guard(grammar_rollout.model_dir, positions_fraction=0.25, seed=3).inspect(
        grammar_rollout.output, grammar_rollout.config)
    assert len(report.positions_checked) == round(0.25 * len(grammar_rollout.output))
    assert report.metrics()["guard/positions_checked"] == len(report.positions_checked)


def test_a_guarded_rollout_acts_on_every_batch_and_learn_records_it(saved, guard, grammar_rollout, tiny_processor):
    """What `vrag-rollout learn --guard` wires: the rollout's batch is inspected and acted on before
    the update, and the step's metrics line carries the counts."""
    from vrag_rollout.training.learn import guard_fields
    from vrag_rollout.verify.guard import guarded

    row = observation_in_the_loss(saved, tiny_processor)
    batch = guarded(lambda prompts: trainer_batch(saved), guard, "drop", grammar_rollout.config)(None)
    assert int(batch.batch["loss_mask"][row].sum()) == 0 and int(batch.batch["response_mask"][row].sum()) == 0
    assert guard_fields(batch) == {"guard_checked": float(len(saved)), "guard_bad": 1.0, "guard_dropped": 1.0}
    assert guard_fields(SimpleNamespace(meta_info={})) == {"guard_checked": 0.0, "guard_bad": 0.0,
                                                           "guard_dropped": 0.0}
    with pytest.raises(GuardFailure, match=f"sample {row}"):
        guarded(lambda prompts: trainer_batch(saved), guard, "fail", grammar_rollout.config)(None)
    with pytest.raises(ValueError, match="guard must be one of"):
        guarded(lambda prompts: None, guard, "strict")
