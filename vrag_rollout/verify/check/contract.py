"""Structural checks ("contract"): tensor shapes, masks and tokens, from the batch alone.

Contract: `check_shapes(saved)` checks tensor widths (`responses` R wide, `input_ids` /
`attention_mask` / `position_ids` P+R, `position_ids` (B, L) or (B, 3|4, L)), the config's
`response_length` and per-sample columns as long as the batch; it returns (failures, notes) and
the per-sample checks run only when it found no failure. `check_row_contract(row, prompts,
eos_ids, native)` checks one sample: `input_ids == prompts + responses`, 0/1 masks, a
left-padded prompt with an attended token, real response tokens (`attention_mask`'s response
part) contiguous from response position 0, `loss_mask` ⊆ `response_mask` ⊆ that part
(`response_mask` equal to it, or to `loss_mask` in EasyR1's layout), nothing after the first
EOS (in the native tool-call format an EOS may end an assistant turn before a masked tool
turn), and an EOS last when the sample says it ended on one (`answered`, `eos`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..saved_batch import SavedBatch
from .report import Failure
from .rows import Row, first_bad

REQUIRED_TENSORS = ("prompts", "responses", "input_ids", "attention_mask", "response_mask", "position_ids")
EOS_REASONS = ("answered", "eos")


def check_shapes(saved: SavedBatch) -> tuple[list[Failure], list[str]]:
    t, fails, notes = saved.tensors, [], []
    missing = [key for key in REQUIRED_TENSORS if key not in t]
    if missing:
        return [Failure("contract", None, None, f"missing tensors {missing}")], notes
    size, prompt_len = t["prompts"].shape
    resp_len = t["responses"].shape[1]
    want = {
        "responses": (size, resp_len),
        "input_ids": (size, prompt_len + resp_len),
        "attention_mask": (size, prompt_len + resp_len),
        "response_mask": (size, resp_len),
        "loss_mask": (size, resp_len),
        "rollout_log_probs": (size, resp_len),
        "turn_ids": (size, resp_len),
    }
    for key, shape in want.items():
        if key in t and tuple(t[key].shape) != shape:
            fails.append(Failure("contract", None, None, f"{key} has shape {tuple(t[key].shape)}, expected {shape}"))
    pos = t["position_ids"]
    width = prompt_len + resp_len
    if not (tuple(pos.shape) == (size, width)
            or (pos.dim() == 3 and pos.shape[0] == size and pos.shape[1] in (3, 4) and pos.shape[2] == width)):
        fails.append(Failure("contract", None, None, f"position_ids has shape {tuple(pos.shape)}, expected "
                             f"({size}, [4 or 3,] {prompt_len + resp_len})"))
    configured = saved.config.get("response_length")
    if isinstance(configured, int) and configured > 0 and configured != resp_len:
        fails.append(Failure("contract", None, None, f"responses are {resp_len} wide, the config's response_length "
                             f"is {configured}{over_budget(t, prompt_len, configured)}"))
    if len(saved.images) != size:
        fails.append(Failure("contract", None, None, f"{len(saved.images)} image lists for {size} samples"))
    for name, values in saved.columns.items():
        if len(values) != size:
            fails.append(Failure("contract", None, None, f"column {name!r} has {len(values)} rows, the batch {size}"))
    if "loss_mask" not in t:
        notes.append("no loss_mask: response_mask is taken as the loss mask")
    return fails, notes


def over_budget(tensors: dict, prompt_len: int, budget: int) -> str:
    """The samples whose real response is longer than `budget` tokens, as a message tail ("" when
    none is, or the mask cannot be read)."""
    mask = tensors.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return ""
    used = mask[:, prompt_len:].long().sum(dim=1)
    over = (used > budget).nonzero().flatten().tolist()
    if not over:
        return ""
    shown = ", ".join(f"sample {s} ({int(used[s])} tokens)" for s in over[:8])
    return f"; over the budget: {shown}" + (f" and {len(over) - 8} more" if len(over) > 8 else "")


def check_log_probs(row: Row, log_probs: Optional[torch.Tensor]) -> list[Failure]:
    """The rollout's log-probs of the real response tokens are finite and at most 0: a NaN or an
    infinity there poisons every importance ratio and drift metric the trainer computes from it."""
    if log_probs is None:
        return []
    used = int(row.real.long().sum())
    values = log_probs[:used].double()
    bad = first_bad(~torch.isfinite(values) | (values > 1e-6))
    if bad is None:
        return []
    return [Failure("contract", row.index, row.prompt_len + bad,
                    f"rollout_log_probs holds {float(values[bad])} at a real response token (a log-probability "
                    "is finite and at most 0)")]


def check_row_contract(row: Row, prompts: torch.Tensor, eos_ids: set[int], native: bool = False) -> list[Failure]:
    fails: list[Failure] = []
    s, P = row.index, row.prompt_len

    def fail(position: Optional[int], message: str) -> None:
        fails.append(Failure("contract", s, position, message))

    full = torch.cat([prompts, row.responses])
    bad = first_bad(row.ids != full)
    if bad is not None:
        fail(bad, f"input_ids {int(row.ids[bad])} != prompts+responses {int(full[bad])}")
    masks = (("attention_mask", row.attention), ("response_mask", row.response_mask), ("loss_mask", row.loss))
    for name, mask in masks:
        bad = first_bad((mask != 0) & (mask != 1))
        if bad is not None:
            fail(bad + (0 if name == "attention_mask" else P), f"{name} holds {mask[bad].item()}, not 0/1")
    prompt_mask = row.attention[:P].long()
    bad = first_bad(torch.diff(prompt_mask) < 0)
    if bad is not None:
        fail(bad + 1, "prompt is not left-padded: attention_mask drops to 0 after a real token")
    if int(prompt_mask.sum()) == 0:
        fail(0, "prompt has no attended token")
    real = row.real.long()
    bad = first_bad(torch.diff(real) > 0)
    if bad is not None:
        fail(P + bad + 1, "response tokens are not contiguous from response position 0 (a real token after padding)")
    for inner, outer, message in (
        (row.response_mask, row.real, "response_mask is 1 where attention_mask is 0"),
        (row.loss, row.response_mask, "loss_mask is 1 where response_mask is 0"),
    ):
        bad = first_bad((inner.long() == 1) & (outer.long() == 0))
        if bad is not None:
            fail(P + bad, message)
    if not torch.equal(row.response_mask.long(), real) and not torch.equal(row.response_mask.long(), row.loss.long()):
        bad = first_bad(row.response_mask.long() != real)
        fail(P + bad, "response_mask differs from attention_mask's response part (and is not the loss mask either)")
    used = int(real.sum())
    tokens = row.responses[:used]
    bad = first_eos_overrun(tokens, row.sampled[:used].long(), eos_ids, native, used)
    if bad is not None:
        fail(P + bad + 1, f"the response runs past its EOS at position {P + bad}")
    if row.reason in EOS_REASONS and (len(tokens) == 0 or int(tokens[-1]) not in eos_ids):
        fail(P + max(used - 1, 0), f"termination_reason {row.reason!r} but the last response token is not an EOS")
    return fails


def eos_flags(tokens: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """Per token, whether it is one of `eos_ids` (one tensor op, not a Python loop per token)."""
    return torch.isin(tokens, torch.tensor(sorted(eos_ids), dtype=tokens.dtype))


def first_eos_overrun(tokens: torch.Tensor, loss: torch.Tensor, eos_ids: set[int], native: bool,
                      used: int) -> Optional[int]:
    """The first EOS with a response token after it, among the `used` real `tokens` (`loss`:
    their loss mask as integers), or None. In the native tool-call format each assistant turn ends with an
    EOS and a tool turn (masked, with end-of-turn tokens of its own) follows it, so an EOS that
    is masked, or followed by a masked token, is not an overrun; anything else after an EOS is a
    response running past its end."""
    # Candidates: positions before the last real one (the last has nothing after it).
    overrun = eos_flags(tokens, eos_ids)[:max(used - 1, 0)]
    if native:
        count = len(overrun)
        following = torch.cat([loss[1:], loss.new_ones(1)])  # past the row: no masked token follows
        overrun = overrun & (loss[:count] != 0) & (following[:count] != 0)
    return first_bad(overrun)


def check_padded_rows(row: Row, tokenizer_size: int) -> list[Failure]:
    """A response token at or past the tokenizer's size is a padded embedding row (released
    checkpoints pad the vocabulary): no text decodes to it, so a rollout must never sample one."""
    used = int(row.real.sum())
    bad = first_bad(row.responses[:used] >= tokenizer_size)
    if bad is None:
        return []
    return [Failure("contract", row.index, row.prompt_len + bad,
                    f"token id {int(row.responses[bad])} is a padded row of the embedding, past the tokenizer's "
                    f"{tokenizer_size} tokens: no text decodes to it (the rollout must ban ids >= len(tokenizer))")]
