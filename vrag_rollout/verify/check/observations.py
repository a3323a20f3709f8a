"""Observation checks ("observations"): the loss-masked blocks of a response, decoded.

Contract: in the text action format, `check_observations(row, oracle)` checks that every
masked-out block of the response decodes to `<result>…</result>`, and that no sampled run goes
on after a `</search>`/`</fetch>` (the rollout stops there). In the native tool-call format,
`check_native_observations(row, oracle)` checks that every masked block follows a sampled end
of turn and ends by opening the next assistant turn, as the model's own chat template writes it.
Both decode with the model's tokenizer (special tokens kept).
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from .oracle import ModelOracle
from .report import Failure
from .rows import Row

TOOL_CLOSE_TAGS = ("</search>", "</fetch>")
REGION_CLOSE_TAGS = ("</crop>", "</bbox>")  # stops too, in a batch rolled out with the region action
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"


def _loss_runs(flags: Sequence[int] | torch.Tensor, used: int) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the loss mask over the first `used` flags (one tensor op finds
    where the value changes, not a Python loop per token)."""
    if used <= 0 or len(flags) == 0:
        return []
    flags = torch.as_tensor(flags[:used], dtype=torch.long)
    changes = ((flags[1:] != flags[:-1]).nonzero().flatten() + 1).tolist()
    starts, ends = [0, *changes], [*changes, len(flags)]
    values = flags[starts].tolist()
    return list(zip(values, starts, ends))


def check_native_observations(row: Row, oracle: ModelOracle) -> list[Failure]:
    """Native tool-call format: every masked block follows a sampled end of turn and ends by
    opening the next assistant turn, as the model's own chat template writes it."""
    s, P = row.index, row.prompt_len
    used = int(row.real.sum())
    # Decoded as tensor slices: the tokenizer converts a tensor with one .tolist(), where a list
    # of ints is type-checked element by element (most of a long response's decoding time).
    tokens, flags = row.responses[:used], row.sampled[:used].long()
    header = oracle.generation_header()
    fails: list[Failure] = []
    for value, start, end in _loss_runs(flags, used):
        if value:
            continue
        if start == 0 or int(tokens[start - 1]) not in oracle.eos_ids:
            fails.append(Failure("observations", s, P + start, "a tool turn that does not follow a sampled end of turn"))
        text = oracle.tokenizer.decode(tokens[start:end], skip_special_tokens=False)
        if not text.endswith(header):
            fails.append(Failure("observations", s, P + end - 1,
                                 f"the tool turn at {P + start} does not open the next assistant turn ({header!r})"))
    return fails


def check_observations(row: Row, oracle: ModelOracle, regions: bool = False) -> list[Failure]:
    s, P = row.index, row.prompt_len
    used = int(row.real.sum())
    tokens, flags = row.responses[:used], row.sampled[:used].long()  # tensors: see check_native_observations
    decode = functools.partial(oracle.tokenizer.decode, skip_special_tokens=False)
    fails: list[Failure] = []
    for value, start, end in _loss_runs(flags, used):
        if value == 0:
            text = decode(tokens[start:end])
            # Named position: the loss-masked token that cut the block, when there is one.
            if not text.startswith(RESULT_OPEN):
                where = P + start - 1 if start else P + start
                fails.append(Failure("observations", s, where, f"the masked block at {P + start} does not start with "
                                     f"{RESULT_OPEN} ({text[:24]!r}): the token before it is in the loss mask?"))
            if not text.endswith(RESULT_CLOSE):
                where = P + end if end < used else P + end - 1
                fails.append(Failure("observations", s, where, f"the masked block at {P + start} does not end with "
                                     f"{RESULT_CLOSE} ({text[-24:]!r}): the token after it is in the loss mask?"))
            continue
        run = tokens[start:end]
        text = decode(run)
        for tag in TOOL_CLOSE_TAGS + (REGION_CLOSE_TAGS if regions else ()):
            if tag not in text:
                continue
            # The usual run ends with its one tool call: no prefix of it can hold the (ASCII) tag
            # with a token left after (that token's text would follow the tag), so the search
            # below could only end at the run's end. Skipping it saves ~10 decodes a turn.
            if text.endswith(tag) and text.count(tag) == 1:
                break
            lo, hi = 1, len(run)  # smallest prefix whose text holds the tag
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if tag in decode(run[:mid]) else (mid + 1, hi)
            if lo < len(run) and decode(run[lo:]).strip():
                fails.append(Failure("observations", s, P + start + lo,
                                     f"sampled tokens go on after the tool call {tag} (the rollout stops there): "
                                     "observation tokens in the loss mask?"))
            break
    return fails
