"""Per-turn logprob drift (`verify/drift.py`): hand-worked numbers, what it leaves out, and its
signature on a real batch: images swapped at equal sizes (the defect no structural check can see)
leave the turns before the swap as they were and move the turns after it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.verify.helpers import response_image_runs, rows_with_response_images, token_id
from vrag_rollout.verify.drift import batch_drift, turn_drift


def test_hand_worked_means_maxima_and_worst_sample_turns():
    actor = torch.zeros(2, 6)
    rollout = torch.tensor([[0.0, 0.0, 9.0, 0.5, 0.0, 7.0],   # 9.0 is masked out, 7.0 is padding (turn 0)
                            [0.0, 0.1, 0.0, 0.0, -0.2, 0.0]])
    turns = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 2, 2, 3, 0]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    drift = turn_drift(actor, rollout, turns, mask, worst=2)
    # turn 1: gaps 0, 0 | 0, 0.1 -> mean 0.025; turn 2: 0.5, 0 | 0, 0 -> 0.125; turn 3: 0.2
    assert drift.tokens == {1: 4, 2: 4, 3: 1}
    assert drift.mean == pytest.approx({1: 0.025, 2: 0.125, 3: 0.2})
    assert drift.max == pytest.approx({1: 0.1, 2: 0.5, 3: 0.2})
    assert [(s, t) for s, t, _ in drift.worst] == [(0, 2), (1, 3)]  # sample 0's turn 2 averages 0.25
    metrics = drift.metrics()
    assert metrics["guard/drift/max"] == pytest.approx(0.5) and metrics["guard/drift/worst_turn"] == 3
    assert metrics["guard/drift/turn_2/mean"] == pytest.approx(0.125)


def test_nothing_to_compare_and_bad_shapes():
    zeros = torch.zeros(1, 3)
    assert turn_drift(zeros, zeros, torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 3)).metrics() == {}
    with pytest.raises(ValueError, match="four"):
        turn_drift(zeros, torch.zeros(1, 4), zeros, zeros)


def test_batch_drift_needs_rollout_logprobs_of_an_unconstrained_distribution():
    tensors = {"rollout_log_probs": torch.tensor([[0.0, -1.0]]), "turn_ids": torch.tensor([[1, 1]]),
               "loss_mask": torch.tensor([[1, 1]])}
    actor = torch.tensor([[-2.0, -1.5]])
    free = batch_drift(SimpleNamespace(batch=tensors, meta_info={}), actor)
    assert free.tokens == {1: 2} and free.max[1] == pytest.approx(2.0)
    assert batch_drift(SimpleNamespace(batch=tensors, meta_info={"action_grammar": True}), actor) is None
    assert batch_drift(SimpleNamespace(batch={"loss_mask": tensors["loss_mask"]}, meta_info={}), actor) is None


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_images_swapped_at_equal_size_move_only_the_turns_after_the_swap(grammar_rollout, tiny_processor, hf_model):
    from vrag_rollout.training.grpo import response_log_probs
    from vrag_rollout.verify.saved_batch import load_rollout

    saved = load_rollout(grammar_rollout.path)
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    images = {s: saved.decoded_images(s) for s in range(len(saved))}
    prompt_images = {s: len(images[s]) - len(response_image_runs(saved, s, image_pad)) for s in images}
    candidates = [s for s in rows_with_response_images(saved, image_pad)
                  if len(images[s]) - prompt_images[s] >= 2
                  and images[s][prompt_images[s]].size == images[s][prompt_images[s] + 1].size
                  and images[s][prompt_images[s]].tobytes() != images[s][prompt_images[s] + 1].tobytes()]
    assert candidates, "the grammar rollout shows no sample two distinct pages of one size"
    row = candidates[0]
    first = prompt_images[row]

    def batch(swapped: bool) -> SimpleNamespace:
        shown = list(images[row])
        if swapped:
            shown[first], shown[first + 1] = shown[first + 1], shown[first]
        columns = {"multi_modal_data": np.array([{"images": shown}], dtype=object)}
        tensors = {key: value[row:row + 1] for key, value in saved.tensors.items()}
        return SimpleNamespace(batch=tensors, non_tensor_batch=columns, meta_info=dict(saved.meta))

    # The rollout's own log-probs here are a grammar's (constrained) distribution's; the clean
    # batch's forward stands in for them, i.e. for an engine that agrees with the trainer.
    with torch.no_grad():
        clean = response_log_probs(hf_model, tiny_processor, batch(False), grammar_rollout.config.temperature)
        planted = response_log_probs(hf_model, tiny_processor, batch(True), grammar_rollout.config.temperature)
    clean_batch = batch(False)
    clean_batch.batch["rollout_log_probs"] = clean
    clean_batch.meta_info["action_grammar"] = False
    drift = batch_drift(clean_batch, planted)
    swap_turn = int(saved.tensors["turn_ids"][row, response_image_runs(saved, row, image_pad)[0][0]])
    before = [t for t in drift.turns if t <= swap_turn]
    after = [t for t in drift.turns if t > swap_turn]
    assert before and after, (swap_turn, drift.turns)
    assert max(drift.max[t] for t in before) < 1e-6, drift.lines()  # before the swap: the same inputs
    assert all(drift.mean[t] > 10 * max(1e-7, max(drift.max[b] for b in before)) for t in after), drift.lines()
    assert drift.worst[0][:2] in {(0, t) for t in after} and drift.metrics()["guard/drift/worst_turn"] in after
