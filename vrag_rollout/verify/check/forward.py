"""The forward check ("forward", optional): rollout logprobs against a transformers forward pass.

Contract: `check_forward(saved, oracle, rows, processed, tolerance)` runs the model's causal LM
(fp32) on each sample's attended tokens (with the processor outputs from `images.check_images`)
and compares `rollout_log_probs` with the forward logprobs of the sampled (loss-masked) tokens,
in the distribution vLLM reported (`meta_info["rollout_log_probs_mode"]`): "raw_logprobs", the
model's softmax, or "processed_logprobs", the one sampled from (logits plus the logit bias,
recorded in `meta_info["logit_bias"]` or else the documented `BANNED_BIAS` on every vision
special token, over the config's temperature, within its top-k / top-p). It fails when the max
gap exceeds `tolerance`. Under an action grammar the rollout's logprobs are those of the
constrained distribution: where the batch records its grammars (`action_regex`,
`first_turn_action_regex` in its config) and xgrammar is installed, the grammar is replayed
(`grammar_replay.py`) and every token is compared in the distribution its turn's grammar left,
failed as without a grammar (a sampled token the grammar does not allow fails too); otherwise the
gap is reported, not failed, and the one property that holds (a constrained logprob is never
below the unconstrained one) is checked instead. A grammar on the
first turn only (`first_turn_action_regex` without `action_regex`) constrains the tokens of turn 1
(`turn_ids`): every later turn is compared and failed as without a grammar (`stats["free_tokens"]`,
`stats["free_max_gap"]`). It returns (failures, stats for `Report.forward` or None, notes).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import torch

from ..saved_batch import SavedBatch
from .grammar_replay import GrammarReplay
from .oracle import ModelOracle, token_types
from .report import Failure
from .rows import Row, first_bad

# When a batch does not record its logit bias: the documented ban (README, EasyR1 issue #110) of
# every vision special token, found by name among the tokenizer's added tokens.
_BANNED_NAME = re.compile(r"^<\|(vision|image|video|object_ref|box|quad)_[a-z]+\|>$")
BANNED_BIAS = -100.0


def check_forward(saved: SavedBatch, oracle: ModelOracle, rows: list[Row], processed: dict,
                  tolerance: float) -> tuple[list[Failure], Optional[dict], list[str]]:
    t = saved.tensors
    key = "rollout_log_probs" if "rollout_log_probs" in t else None
    if key is None:
        missing = "the batch has no rollout_log_probs (roll out with calculate_log_probs=True)"
        return [Failure("forward", None, None, missing)], None, []
    grammar = bool(saved.action_grammar)
    first_turn_only = grammar and _first_turn_grammar_only(saved)
    turn_ids = t.get("turn_ids") if first_turn_only else None
    # the grammar as vLLM applied it, where the batch records it: grammar turns compared exactly
    replay = GrammarReplay.of(saved, oracle.tokenizer, oracle.logits_width,
                                                       oracle.eos_ids) if grammar else None
    rejected: list[Failure] = []
    free_gaps: list[torch.Tensor] = []
    free_worst = (0.0, None, None)
    distribution = _SampledDistribution.of(saved, oracle)
    if distribution.problem:
        return [Failure("forward", None, None, distribution.problem)], None, distribution.notes
    model = oracle.language_model()
    gaps, below, worst = [], [], (0.0, None, None)
    for row in rows:
        valid = row.attention.bool()
        ids = row.ids[valid][None]
        types = torch.zeros_like(ids, dtype=torch.int32)
        types[ids == oracle.image_pad] = 1
        kwargs: dict[str, Any] = token_types(model.forward, types)
        outputs = processed.get(row.index)
        if outputs is not None:
            kwargs.update(pixel_values=outputs["pixel_values"], image_grid_thw=outputs["image_grid_thw"])
        start = int(row.attention[: row.prompt_len].sum())  # compact index of response position 0
        sampled = row.loss[: int(row.real.sum())].nonzero().flatten()
        if not len(sampled):
            continue
        # only the positions that predict response tokens (start - 1 on) go through the LM head
        keep = ids.shape[1] - start + 1  # sliced again after the call: transformers 4.x's Qwen2-VL ignores it
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=keep,
                           **kwargs).logits[0, -keep:].float()
        targets = row.responses[sampled]
        if replay is not None:  # each sampled token in the distribution its turn's grammar left
            picked = logits[sampled].contiguous()
            bad = replay.mask(picked, t["turn_ids"][row.index, sampled], targets)
            if bad is not None:
                rejected.append(Failure("forward", row.index, row.prompt_len + int(sampled[bad]),
                                        "a sampled token the recorded action grammar does not allow there: "
                                        "not the grammar the batch was sampled with, or the tokens changed"))
            forward = distribution.logprobs(picked)[torch.arange(len(sampled)), targets]
        else:
            forward = distribution.logprobs(logits)[sampled, targets]
        rollout = t[key][row.index, sampled].float()
        gap = (rollout - forward).abs()
        gaps.append(gap)
        k = int(gap.argmax())
        if float(gap[k]) > worst[0]:
            worst = (float(gap[k]), row.index, row.prompt_len + int(sampled[k]))
        if turn_ids is not None:  # the turns after the first sampled freely: compared as without a grammar
            free = turn_ids[row.index, sampled] > 1
            if bool(free.any()):
                free_gaps.append(gap[free])
                j = int(gap.masked_fill(~free, -1.0).argmax())
                if float(gap[j]) > free_worst[0]:
                    free_worst = (float(gap[j]), row.index, row.prompt_len + int(sampled[j]))
        if grammar and replay is None:
            low = first_bad(rollout < forward - tolerance)
            if low is not None:
                below.append(Failure("forward", row.index, row.prompt_len + int(sampled[low]),
                                     f"constrained rollout logprob {float(rollout[low]):.4f} is below the "
                                     f"unconstrained forward logprob {float(forward[low]):.4f}: not the same model "
                                     "or sequence"))
    every = torch.cat(gaps) if gaps else torch.zeros(0)
    stats = {
        "tokens": int(every.numel()),
        "max_gap": float(every.max()) if every.numel() else 0.0,
        "mean_gap": float(every.mean()) if every.numel() else 0.0,
        "max_gap_sample": worst[1],
        "max_gap_position": worst[2],
        "tolerance": tolerance,
        "grammar": grammar,
        "grammar_replayed": replay is not None,
        "compared": key,
        "mode": distribution.mode,
    }
    notes, fails = list(distribution.notes), list(below) + rejected
    if turn_ids is not None:
        free_every = torch.cat(free_gaps) if free_gaps else torch.zeros(0)
        stats["free_tokens"] = int(free_every.numel())
        stats["free_max_gap"] = float(free_every.max()) if free_every.numel() else 0.0
        if stats["free_max_gap"] > tolerance:
            fails.append(Failure("forward", free_worst[1], free_worst[2], f"a token sampled without the grammar "
                                 f"(after turn 1) differs from the forward pass by {stats['free_max_gap']:.4g} > "
                                 f"{tolerance:g}"))
        notes.append(f"the grammar constrained turn 1 only: {stats['free_tokens']} tokens of later turns compared "
                     f"(max gap {stats['free_max_gap']:.3g})")
    if replay is not None:
        notes.append("the action grammar the batch records was replayed (xgrammar, as vLLM applies it): every "
                     "sampled token compared in the distribution its turn's grammar left")
        if stats["max_gap"] > tolerance:
            fails.append(Failure("forward", worst[1], worst[2], f"rollout logprob differs from the forward pass "
                                 f"under the replayed grammar by {stats['max_gap']:.4g} > {tolerance:g} "
                                 f"(mean {stats['mean_gap']:.3g})"))
    elif grammar:
        notes.append("an action grammar (action_regex) was active: rollout logprobs are those of the "
                     "grammar-constrained distribution and differ from the unconstrained forward pass by design "
                     "(up to several nats); the gap is reported, not failed")
    elif stats["max_gap"] > tolerance:
        unknown = (" (the batch does not record whether an action grammar was active; under one, gaps of several "
                   "nats are expected)") if saved.action_grammar is None else ""
        fails.append(Failure("forward", worst[1], worst[2], f"rollout logprob differs from the forward pass by "
                             f"{stats['max_gap']:.4g} > {tolerance:g} (mean {stats['mean_gap']:.3g}){unknown}"))
    return fails, stats, notes


def _first_turn_grammar_only(saved: SavedBatch) -> bool:
    """Whether the batch's config constrained the first turn only (and says so)."""
    config = saved.config or {}
    return bool(config.get("first_turn_action_regex")) and not config.get("action_regex") and "turn_ids" in saved.tensors


class _SampledDistribution:
    """The distribution vLLM reported logprobs of, per its `logprobs_mode`: "raw_logprobs" is the
    model's own softmax; "processed_logprobs" the one sampled from: logits plus the logit bias,
    divided by the temperature (not at temperature 0), restricted to top-k / top-p."""

    def __init__(self, mode: str, bias: dict[int, float], temperature: float, top_k: int, top_p: float,
                 notes: list[str], problem: Optional[str] = None):
        self.mode, self.bias, self.temperature, self.top_k, self.top_p = mode, bias, temperature, top_k, top_p
        self.notes, self.problem = notes, problem

    @classmethod
    def of(cls, saved: SavedBatch, oracle: ModelOracle) -> "_SampledDistribution":
        notes: list[str] = []
        mode = saved.meta.get("rollout_log_probs_mode")
        if mode in (None, "unknown"):
            notes.append("the batch does not record vLLM's logprobs_mode: compared as raw_logprobs")
            mode = "raw_logprobs"
        config = saved.config
        temperature = float(config.get("temperature", 1.0) if config.get("temperature") is not None else 1.0)
        top_k = int(config.get("top_k") if config.get("top_k") is not None else -1)
        top_p = float(config.get("top_p") if config.get("top_p") is not None else 1.0)
        recorded = saved.meta.get("logit_bias")
        if recorded is not None:
            bias = {int(token): float(value) for token, value in dict(recorded).items()}
        else:
            bias = {token: BANNED_BIAS for name, token in oracle.tokenizer.get_added_vocab().items()
                    if _BANNED_NAME.match(name)}
            # and the padded embedding rows past the tokenizer (no text decodes to them)
            bias.update(dict.fromkeys(range(len(oracle.tokenizer), oracle.logits_width), BANNED_BIAS))
            if mode == "processed_logprobs":
                notes.append(f"the batch does not record its logit bias: assumed {BANNED_BIAS:g} on the "
                             f"{len(bias)} vision special tokens")
        problem = None
        if mode not in ("raw_logprobs", "processed_logprobs"):
            problem = f"rollout_log_probs were recorded in vLLM's {mode!r} mode (not logprobs): nothing to compare"
        return cls(mode, bias, temperature, top_k, top_p, notes, problem)

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """(L, V) fp32 logits -> (L, V) logprobs of this distribution."""
        if self.mode == "raw_logprobs":
            return torch.log_softmax(logits, dim=-1)
        logits = logits.clone()
        if self.bias:
            tokens = torch.tensor(list(self.bias), dtype=torch.long)
            keep = tokens < logits.shape[-1]
            logits[:, tokens[keep]] += torch.tensor(list(self.bias.values()), dtype=logits.dtype)[keep]
        if self.temperature < 1e-5:  # greedy: vLLM reports the logprobs before any temperature
            return torch.log_softmax(logits, dim=-1)
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(logits, dim=-1, descending=True)
            before = torch.softmax(ordered, dim=-1).cumsum(dim=-1) - torch.softmax(ordered, dim=-1)
            drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before >= self.top_p)
            logits = logits.masked_fill(drop, float("-inf"))
        return torch.log_softmax(logits, dim=-1)
