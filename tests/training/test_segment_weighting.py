"""An episode cut into segments by context edits trains exactly as the same episode as one row:
the same advantage on the same sampled tokens, the same loss and the same gradient, under verl's
token-mean and sequence-mean aggregations. Row-based GRPO (the known pitfall) is shown to weigh
the cut episode about three times instead, so the test can fail."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vrag_rollout.training.grpo import actor_config, episode_policy_loss, grpo_advantages, policy_loss

R = 12
N = 2
# sampled tokens per episode (as one row): episode 0 is cut into three segments of 4 tokens each
LENGTHS = [12, 5, 9, 7]
REWARDS = [1.0, 0.0, 0.5, 2.0]


def batch_of(masks, sampled, episode_ids=None):
    masks = torch.tensor(masks, dtype=torch.long)
    non_tensors = {} if episode_ids is None else {"episode_id": np.array(episode_ids, dtype=np.int64)}
    tensors = {"loss_mask": masks, "response_mask": torch.tensor(sampled, dtype=torch.long).clamp(max=1)
               | masks, "responses": torch.zeros_like(masks)}
    return SimpleNamespace(batch=tensors, non_tensor_batch=non_tensors, meta_info={})


def one_row_layout():
    masks = [[1] * n + [0] * (R - n) for n in LENGTHS]
    return batch_of(masks, masks), list(REWARDS)


def segmented_layout():
    """Episode 0 in three rows: row k's context is the first 4k tokens (sampled, out of the loss)."""
    masks, sampled = [], []
    for k in range(3):
        masks.append([0] * (4 * k) + [1] * 4 + [0] * (R - 4 * k - 4))
        sampled.append([1] * (4 * k + 4) + [0] * (R - 4 * k - 4))
    for n in LENGTHS[1:]:
        masks.append([1] * n + [0] * (R - n))
        sampled.append(masks[-1])
    # the earlier segments' rewards are not the episode's: they must be ignored
    rewards = [-7.0, 99.0, REWARDS[0], *REWARDS[1:]]
    return batch_of(masks, sampled, [0, 0, 0, 1, 2, 3]), rewards


def token_values(seed=0):
    """(log_prob, old_log_prob) per episode token, the same tokens in both layouts."""
    g = torch.Generator().manual_seed(seed)
    new = -torch.rand((4, R), generator=g) * 2
    old = new + (torch.rand((4, R), generator=g) - 0.5) * 0.6  # ratios off 1: clipping plays a part
    return new, old


def layout_values(values, segmented):
    """The (B, R) tensor of `values` (one row per episode) in the segmented layout's rows."""
    if not segmented:
        return values.clone()
    return torch.cat([values[:1].repeat(3, 1), values[1:]])


def loss_and_grad(layout, mode, row_based=False):
    batch, rewards = layout()
    segmented = "episode_id" in batch.non_tensor_batch
    new, old = token_values()
    log_prob = layout_values(new, segmented).requires_grad_(True)
    config = actor_config(N, loss_agg_mode=mode)
    mask = batch.batch["loss_mask"]
    if row_based:  # the pitfall: every row its own sample of its prompt's group
        from verl.trainer.ppo import core_algos

        index = np.array([0, 0, 0, 0, 1, 1]) if segmented else np.arange(4) // N
        scores = torch.zeros(mask.shape)
        scores[:, 0] = torch.tensor(rewards)
        advantages, _ = core_algos.compute_grpo_outcome_advantage(scores, mask, index)
        loss, _ = policy_loss(log_prob, layout_values(old, segmented), advantages, mask, config)
    else:
        advantages = grpo_advantages(batch, rewards, N)
        loss, _ = episode_policy_loss(log_prob, layout_values(old, segmented), advantages, batch, config)
    loss.backward()
    # the gradient per episode token: the segmented rows' trained tokens folded back into one row
    grad = log_prob.grad * mask
    if segmented:
        grad = torch.cat([grad[:3].sum(0, keepdim=True), grad[3:]])
    return float(loss.detach()), grad, advantages


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_cut_episode_trains_as_one_row(mode):
    loss_one, grad_one, adv_one = loss_and_grad(one_row_layout, mode)
    loss_cut, grad_cut, adv_cut = loss_and_grad(segmented_layout, mode)
    assert loss_cut == pytest.approx(loss_one, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(grad_cut, grad_one, rtol=1e-5, atol=1e-7)
    # the same advantage on every trained token of the episode, whichever row holds it
    assert torch.allclose(adv_cut[:3].sum(0), adv_one[0])
    assert torch.equal(adv_cut[3:], adv_one[1:])


def test_row_based_grpo_weighs_a_cut_episode_about_three_times():
    """The pitfall, so the test above can fail: by rows, the episode enters its group three times
    and a sequence mean counts it three times."""
    _, grad_one, _ = loss_and_grad(one_row_layout, "seq-mean-token-mean")
    _, grad_rows, _ = loss_and_grad(segmented_layout, "seq-mean-token-mean", row_based=True)
    assert not torch.allclose(grad_rows, grad_one, rtol=1e-3)
    # the cut episode's share of the gradient, against the uncut episode of the same group
    share = lambda g: float(g[0].abs().sum() / g[1].abs().sum())  # noqa: E731
    assert share(grad_rows) > 2 * share(grad_one)


def test_without_segments_advantages_are_verls_own_grpo():
    from verl.trainer.ppo import core_algos

    batch, rewards = one_row_layout()
    mask = batch.batch["loss_mask"]
    scores = torch.zeros(mask.shape)
    scores[torch.arange(4), mask.sum(-1) - 1] = torch.tensor(rewards)
    expected, _ = core_algos.compute_grpo_outcome_advantage(scores, mask, np.arange(4) // N)
    assert torch.equal(grpo_advantages(batch, rewards, N), expected)
