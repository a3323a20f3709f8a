"""One GRPO update of the Hugging Face policy from a rollout batch, with verl's own update math.

Contract:

- The batch is the rollout's output DataProto: `input_ids` = prompt (left-padded) + `responses`
  (right-padded), `attention_mask`, `response_mask` (every response token, sampled or observed),
  `loss_mask` (1 only on the tokens the policy sampled), non-tensor `multi_modal_data` (the
  sample's images in order: the prompt's, then the retrieved pages'), `meta_info["logit_bias"]`
  (the tokens the engine banned), and the n samples of a prompt on adjacent rows.
- `token_level_rewards` puts each sample's scalar reward on its last response token (verl's layout).
- `grpo_advantages` is `verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`, called as
  verl's `ray_trainer.compute_advantage` calls it, with group index = row // n.
- `policy_loss` is the loss of `core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)`
  (vanilla: PPO clip, dual clip) aggregated with `config.loss_agg_mode` ("token-mean"), called as
  verl's `workers/utils/losses.ppo_loss` calls it; `config` is verl's own `ActorConfig`.
  verl's `response_mask` means "tokens the model generated" (its agent loop sets 0 on tool
  responses): that is our `loss_mask`, and it is what we pass, for advantages and loss alike.
- `response_log_probs` is the HF model's log-prob of every sampled (`loss_mask`) response token,
  (B, R), 0 on observation tokens and padding (never trained on, so never computed):
  one forward pass per sample over its unpadded tokens with its images through the processor's
  image processor (the model computes its own M-RoPE positions), with the engine's logit bias and
  temperature applied, i.e. the distribution the rollout sampled from.
- Under an action grammar (`meta_info["action_grammar"]`) the engine sampled from the grammar's
  renormalised distribution. Where the grammar allowed one token only, the engine's logprob is
  exactly 0 and so is the constrained policy's, whatever the weights: `response_log_probs` gives
  those tokens a constant 0 (no gradient), as the constrained policy's own log-prob would, instead
  of pushing the unconstrained probability of a token the grammar forces anyway. (A freely chosen
  token whose engine logprob rounds to exactly 0 in fp32 is treated alike; its gradient is ~0.)
  Where the grammar left a choice, the model's unconstrained log-prob stands in for the
  constrained one (the allowed set is not in the batch).
- `grpo_step` does one update (old log-probs = the current model's, detached: one on-policy step)
  and clips the gradient norm at `config.optim.clip_grad` as verl's FSDP engine does.

Invariant: an observation token (loss_mask 0) never reaches the gradient: the loss's gradient with
respect to its log-prob (hence its logits) is exactly zero.

Pure: no I/O; the model, optimizer and batch are the caller's.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..logit_bias import dense_logit_bias
from ..core.pages import pixels
from .segment_credit import episode_credit
from .segments import episode_advantages, episode_ids, episode_weights

IMAGE_PAD = "<|image_pad|>"


def actor_config(n: int, **overrides: Any) -> Any:
    """verl's `ActorConfig` with its defaults (clip_ratio 0.2, "token-mean", vanilla loss,
    optim.clip_grad 1.0); `overrides` are its fields."""
    from verl.workers.config import ActorConfig

    fields = dict(strategy="fsdp", rollout_n=n, ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=1)
    return ActorConfig(**{**fields, **overrides})


def token_level_rewards(batch: Any, rewards: Any) -> torch.Tensor:
    """(B, R): each sample's reward on its last response token, zero elsewhere."""
    response_mask = batch.batch["response_mask"]
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = response_mask.sum(-1).long() - 1
    rows = torch.arange(len(out))
    out[rows, last] = torch.as_tensor(rewards, dtype=torch.float32)
    return out


def group_index(batch_size: int, n: int) -> np.ndarray:
    """verl's `uid`: the prompt a sample answers (the n samples of a prompt are adjacent)."""
    if batch_size % n:
        raise ValueError(f"batch of {batch_size} is not a whole number of groups of n={n}")
    return np.arange(batch_size) // n


def grpo_advantages(batch: Any, rewards: Any, n: int, mask_key: str = "loss_mask") -> torch.Tensor:
    """(B, R) GRPO advantages by verl (ray_trainer.compute_advantage, AdvantageEstimator.GRPO); a
    segmented batch's per episode (`segments.episode_advantages`)."""
    from verl.trainer.ppo import core_algos

    if episode_ids(batch) is not None:
        return episode_advantages(batch, rewards, n, mask_key)
    mask = batch.batch[mask_key]
    advantages, _returns = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards(batch, rewards),
        response_mask=mask,
        index=group_index(len(mask), n),
        norm_adv_by_std_in_grpo=True,
    )
    return advantages


def policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, config: Any) -> tuple[torch.Tensor, dict]:
    """verl's policy loss over `mask` (workers/utils/losses.ppo_loss's call)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    policy_loss_fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    return policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask.to(bool),
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )


def sample_images(batch: Any, row: int) -> list:
    entry = batch.non_tensor_batch.get("multi_modal_data")
    entry = None if entry is None else entry[row]
    return [pixels(image) for image in next(iter(entry.values()))] if entry else []


def response_log_probs(hf_model: Any, processor: Any, batch: Any, temperature: float) -> torch.Tensor:
    """(B, R) log-probs of the response tokens under `hf_model` (differentiable), 0 on padding."""
    tokens = batch.batch
    image_pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    prompt_width = tokens["input_ids"].shape[1] - tokens["responses"].shape[1]
    device = next(hf_model.parameters()).device
    rows = []
    takes_token_types = "mm_token_type_ids" in inspect.signature(hf_model.forward).parameters
    for row in range(len(tokens["input_ids"])):
        ids = tokens["input_ids"][row][tokens["attention_mask"][row].bool()].to(device)
        inputs = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None]}
        if takes_token_types:  # transformers 5.x
            inputs["mm_token_type_ids"] = (ids == image_pad).int()[None]
        images = sample_images(batch, row)
        if images:
            inputs.update(processor.image_processor(images=images, return_tensors="pt").to(device))
        prompt_len = int(tokens["attention_mask"][row][:prompt_width].sum())
        # Only the sampled tokens are ever trained on, so only their predictors go through the LM
        # head and the softmax (over a released vocabulary, the costliest part): the logits at
        # position p predict token p + 1.
        sampled = tokens["loss_mask"][row][: len(ids) - prompt_len].nonzero().flatten().to(device)
        predictors = prompt_len - 1 + sampled
        logits = hf_model(**inputs, logits_to_keep=predictors).logits[0]
        if logits.shape[0] != len(predictors):  # transformers 4.x's Qwen2-VL ignores logits_to_keep
            logits = logits[predictors]
        bias = dense_logit_bias(batch.meta_info.get("logit_bias", {}), logits.shape[-1], device)
        own = torch.log_softmax((logits.float() + bias) / temperature, dim=-1).gather(-1, ids[predictors + 1, None])[:, 0]
        rows.append(torch.zeros(tokens["responses"].shape[1], device=device).scatter(0, sampled, own))
    log_prob = torch.stack(rows)
    forced = grammar_forced(batch)
    return log_prob if forced is None else log_prob.masked_fill(forced.to(log_prob.device), 0.0)


def grammar_forced(batch: Any) -> Optional[torch.Tensor]:
    """(B, R) bool: sampled tokens the action grammar forced (engine logprob exactly 0), or None
    when no grammar was active or the batch has no rollout logprobs."""
    rollout_log_probs = batch.batch.get("rollout_log_probs") if hasattr(batch.batch, "get") else None
    if not batch.meta_info.get("action_grammar") or rollout_log_probs is None:
        return None
    return (rollout_log_probs == 0) & batch.batch["loss_mask"].bool()


def estimator_advantages(batch: Any, rewards: Any, n: int, mask_key: str = "loss_mask", estimator: str = "grpo",
                         turn_rewards: Optional[list] = None) -> torch.Tensor:
    """(B, R): `grpo_advantages` for "grpo" (of each row's summed `turn_rewards` when given: with
    per-turn rewards off, exactly `rewards`), else `training/turn_credit.credit_advantages`. A
    segmented batch (context edits) is credited per episode, as one row: "grpo" by
    `segments.episode_advantages` (each episode's reward, or summed turn rewards, read on its final
    row), "turn" and "gigpo" by `segment_credit.episode_credit` (the estimator over the final rows, each
    token's advantage given to the row that trained it)."""
    if estimator == "grpo":
        return grpo_advantages(batch, rewards if turn_rewards is None else [sum(row) for row in turn_rewards], n, mask_key)
    if episode_ids(batch) is not None:
        return episode_credit(estimator, batch, rewards, n, mask_key, turn_rewards)
    from .turn_credit import credit_advantages

    return credit_advantages(estimator, batch, rewards, n, mask_key, turn_rewards)


def grpo_loss(hf_model: Any, processor: Any, batch: Any, rewards: Any, n: int, temperature: float,
              config: Any, mask_key: str = "loss_mask",
              old_log_prob: Optional[torch.Tensor] = None, estimator: str = "grpo",
              turn_rewards: Optional[list] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(loss, log_prob, advantages, verl's metrics) over `batch.batch[mask_key]`; `estimator` and
    `turn_rewards` (per row, per turn) other than the defaults go to `training/turn_credit.py`."""
    log_prob = response_log_probs(hf_model, processor, batch, temperature)
    old = log_prob.detach() if old_log_prob is None else old_log_prob
    advantages = estimator_advantages(batch, rewards, n, mask_key, estimator, turn_rewards).to(log_prob.device)
    loss, metrics = episode_policy_loss(log_prob, old, advantages, batch, config, mask_key)
    return loss, log_prob, advantages, metrics


def episode_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, batch: Any,
                        config: Any, mask_key: str = "loss_mask") -> tuple[torch.Tensor, dict]:
    """`policy_loss` with each episode weighed as one row, however many rows a context policy cut
    it into (`segments.episode_weights`; the plain policy loss for a batch without segments)."""
    weights = episode_weights(batch, config.loss_agg_mode, mask_key)
    weighted = advantages if weights is None else advantages * weights.to(advantages.device)
    return policy_loss(log_prob, old_log_prob, weighted, batch.batch[mask_key].to(log_prob.device), config)


def kl_to_reference(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor) -> float:
    """verl's "low_var_kl" estimate of KL(policy || reference), the mean over `mask`'s tokens."""
    from verl.trainer.ppo.core_algos import kl_penalty

    kl = kl_penalty(log_prob.detach().float(), ref_log_prob.to(log_prob.device).float(), "low_var_kl")
    mask = mask.to(kl.device).bool()
    return float(kl[mask].mean()) if mask.any() else 0.0


def grpo_step(hf_model: Any, optimizer: Any, processor: Any, batch: Any, rewards: Any, n: int,
              temperature: float, config: Any = None, ref_log_prob: Optional[torch.Tensor] = None,
              on_log_prob: Optional[Callable[[torch.Tensor], None]] = None, estimator: str = "grpo",
              turn_rewards: Optional[list] = None) -> dict:
    """One GRPO update; returns {"loss", "advantage_std", "grad_norm", *verl's pg metrics} and, given
    the reference model's `response_log_probs`, "kl_to_reference" of the policy that sampled.
    `on_log_prob` receives the policy's (B, R) log-probs of the batch before the update (detached):
    the old log-probs a trainer compares with the rollout's."""
    config = actor_config(n) if config is None else config
    optimizer.zero_grad()
    loss, log_prob, advantages, metrics = grpo_loss(hf_model, processor, batch, rewards, n, temperature, config,
                                                    estimator=estimator, turn_rewards=turn_rewards)
    if on_log_prob is not None:
        on_log_prob(log_prob.detach())
    if ref_log_prob is not None:
        metrics = {**metrics, "kl_to_reference": kl_to_reference(log_prob, ref_log_prob, batch.batch["loss_mask"])}
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(hf_model.parameters(), max_norm=config.optim.clip_grad)
    if torch.isfinite(grad_norm):  # verl skips a non-finite step
        optimizer.step()
    optimizer.zero_grad()
    sampled = batch.batch["loss_mask"].bool()
    return {"loss": float(loss.detach()), "advantage_std": float(advantages[sampled].std()),
            "grad_norm": float(grad_norm), **metrics}


__all__ = ["actor_config", "episode_policy_loss", "grammar_forced", "grpo_advantages", "grpo_loss", "grpo_step", "kl_to_reference", "policy_loss",
           "response_log_probs", "token_level_rewards"]
