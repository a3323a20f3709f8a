"""The check helpers written as tensor ops give exactly what the straightforward per-token loops
they replaced give (the loops live here as references), on random rows and on the edge cases:
an empty response, an all-observation response, EOS first and last, runs and vision blocks at
both ends of the row, broken and unattended blocks."""

from __future__ import annotations

import functools
import random
from types import SimpleNamespace

import pytest
import torch

from vrag_rollout.verify.check.contract import first_eos_overrun
from vrag_rollout.verify.check.images import vision_blocks, vision_in_loss
from vrag_rollout.verify.check.observations import _loss_runs, check_observations
from vrag_rollout.verify.check.report import Failure
from vrag_rollout.verify.check.rows import Row

START, PAD, END, VIDEO, EOS, TEXT = 10, 11, 12, 13, 2, 5
ORACLE = SimpleNamespace(vision_start=START, image_pad=PAD, vision_end=END, video_pad=VIDEO,
                         vision_ids={START, PAD, END, VIDEO}, eos_ids={EOS, 3})


# ---- references: the per-token loops ----
def loss_runs_reference(flags: list[int], used: int) -> list[tuple[int, int, int]]:
    out, start = [], 0
    for i in range(1, used + 1):
        if i == used or flags[i] != flags[start]:
            out.append((flags[start], start, i))
            start = i
    return out


def eos_overrun_reference(tokens: list[int], loss: list[int], eos_ids: set[int], native: bool, used: int):
    for i, token in enumerate(tokens):
        if token in eos_ids and i < used - 1 and not (native and (loss[i] == 0 or loss[i + 1] == 0)):
            return i
    return None


def vision_blocks_reference(row: Row, oracle) -> tuple[list, list]:
    s, ids, attended = row.index, row.ids.tolist(), row.attention.tolist()
    fails, blocks, i, inside = [], [], 0, set()
    while i < len(ids):
        if attended[i] and ids[i] == oracle.vision_start:
            j = i + 1
            while j < len(ids) and ids[j] == oracle.image_pad and attended[j]:
                j += 1
            if j > i + 1 and j < len(ids) and ids[j] == oracle.vision_end and attended[j]:
                blocks.append((i + 1, j))
                inside.update(range(i, j + 1))
                i = j + 1
                continue
            what = "image pads then" if j > i + 1 else "an image pad and"
            fails.append(Failure("image_tokens", s, j, f"vision start at {i} is not followed by {what} a vision end "
                                 f"(found token {ids[j] if j < len(ids) else 'end'})"))
            inside.update(range(i, j))
            i = j
            continue
        i += 1
    for p, token in enumerate(ids):
        if token in oracle.vision_ids and p not in inside:
            kind = "video token (videos are not supported)" if token == oracle.video_pad else "stray vision token"
            fails.append(Failure("image_tokens", s, p, f"{kind} {token}{'' if attended[p] else ' in padding'}"))
    return blocks, fails


def vision_in_loss_reference(row: Row, oracle) -> list[Failure]:
    return [Failure("image_tokens", row.index, p, "vision token in the loss mask (sampled or trained on)")
            for p in (row.loss.nonzero().flatten() + row.prompt_len).tolist() if int(row.ids[p]) in oracle.vision_ids]


def observations_reference(row: Row, tokenizer, regions: bool = False) -> list[Failure]:
    """The text-format observation check with its full prefix search on every sampled run."""
    from vrag_rollout.verify.check.observations import REGION_CLOSE_TAGS, RESULT_CLOSE, RESULT_OPEN, TOOL_CLOSE_TAGS

    s, P = row.index, row.prompt_len
    used = int(row.real.sum())
    tokens, flags = row.responses[:used].tolist(), row.loss[:used].long().tolist()
    decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
    fails = []
    for value, start, end in loss_runs_reference(flags, used):
        if value == 0:
            text = decode(tokens[start:end])
            if not text.startswith(RESULT_OPEN):
                fails.append(Failure("observations", s, P + start - 1 if start else P + start,
                                     f"the masked block at {P + start} does not start with "
                                     f"{RESULT_OPEN} ({text[:24]!r}): the token before it is in the loss mask?"))
            if not text.endswith(RESULT_CLOSE):
                fails.append(Failure("observations", s, P + end if end < used else P + end - 1,
                                     f"the masked block at {P + start} does not end with "
                                     f"{RESULT_CLOSE} ({text[-24:]!r}): the token after it is in the loss mask?"))
            continue
        run = tokens[start:end]
        text = decode(run)
        for tag in TOOL_CLOSE_TAGS + (REGION_CLOSE_TAGS if regions else ()):
            if tag not in text:
                continue
            lo, hi = 1, len(run)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if tag in decode(run[:mid]) else (mid + 1, hi)
            if lo < len(run) and decode(run[lo:]).strip():
                fails.append(Failure("observations", s, P + start + lo,
                                     f"sampled tokens go on after the tool call {tag} (the rollout stops there): "
                                     "observation tokens in the loss mask?"))
            break
    return fails


# ---- rows ----
def make_row(ids: list[int], attention: list[int], prompt_len: int, loss: list[int], index: int = 0) -> Row:
    assert len(loss) == len(ids) - prompt_len, "the loss mask covers the response"
    ids_t, attention_t = torch.tensor(ids, dtype=torch.long), torch.tensor(attention, dtype=torch.long)
    return Row(index=index, prompt_len=prompt_len, ids=ids_t, attention=attention_t, responses=ids_t[prompt_len:],
               real=attention_t[prompt_len:], response_mask=torch.tensor(loss, dtype=torch.long), loss=torch.tensor(loss, dtype=torch.long),
               positions=torch.arange(len(ids)), reason=None)


def random_flags(draw: random.Random, length: int) -> list[int]:
    """0/1 flags in runs of random lengths (so runs start and end anywhere, the ends included)."""
    flags: list[int] = []
    value = draw.randint(0, 1)
    while len(flags) < length:
        flags += [value] * draw.randint(1, 6)
        value = 1 - value
    return flags[:length]


def random_vision_row(draw: random.Random, length: int) -> Row:
    """Mostly text, with whole blocks, broken blocks, stray vision tokens and unattended stretches."""
    ids: list[int] = []
    while len(ids) < length:
        pick = draw.random()
        if pick < 0.3:
            ids += [START] + [PAD] * draw.randint(0, 4) + ([END] if draw.random() < 0.8 else [])
        elif pick < 0.4:
            ids.append(draw.choice([START, PAD, END, VIDEO]))
        else:
            ids += [TEXT] * draw.randint(1, 4)
    ids = ids[:length]
    attention = [0 if draw.random() < 0.08 else 1 for _ in ids]
    prompt_len = draw.randint(0, length)
    return make_row(ids, attention, prompt_len, random_flags(draw, length - prompt_len))


EDGE_FLAGS = [[], [0], [1], [0] * 7, [1] * 7, [0, 1], [1, 0], [1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 1, 1, 1, 0]]


@pytest.mark.parametrize("flags", EDGE_FLAGS)
def test_loss_runs_edges(flags):
    for used in range(-1, len(flags) + 1):
        assert _loss_runs(flags, used) == loss_runs_reference(flags, used)
        assert _loss_runs(torch.tensor(flags, dtype=torch.long), used) == loss_runs_reference(flags, used)


def test_loss_runs_random():
    draw = random.Random(0)
    for _ in range(300):
        flags = random_flags(draw, draw.randint(0, 40))
        used = draw.randint(0, len(flags))
        assert _loss_runs(flags, used) == loss_runs_reference(flags, used), (flags, used)


@pytest.mark.parametrize("native", [False, True])
def test_eos_overrun_edges_and_random(native):
    cases = [([], []), ([EOS], [1]), ([EOS, TEXT], [1, 1]), ([TEXT, EOS], [1, 1]), ([EOS] * 4, [1, 0, 1, 1]),
             ([TEXT, EOS, TEXT, EOS], [1, 1, 0, 0]), ([3, TEXT], [0, 1]), ([TEXT] * 5, [1] * 5)]
    draw = random.Random(1)
    for _ in range(300):
        length = draw.randint(0, 20)
        cases.append(([draw.choice([EOS, 3, TEXT, TEXT, TEXT]) for _ in range(length)], random_flags(draw, length)))
    for tokens, loss in cases:
        for used in {0, len(tokens), max(len(tokens) - 1, 0)}:
            want = eos_overrun_reference(tokens[:used], loss[:used], ORACLE.eos_ids, native, used)
            got = first_eos_overrun(torch.tensor(tokens[:used], dtype=torch.long),
                                    torch.tensor(loss[:used], dtype=torch.long), ORACLE.eos_ids, native, used)
            assert got == want, (tokens, loss, used)


def test_vision_blocks_and_loss_edges():
    rows = [
        make_row([], [], 0, []),  # empty row
        make_row([START, PAD, PAD, END], [1] * 4, 0, [0] * 4),  # a block filling the row
        make_row([TEXT, START, PAD, END], [1] * 4, 1, [0, 0, 0]),  # a block at the end, in the response
        make_row([START, PAD, PAD], [1] * 3, 0, [0] * 3),  # unclosed at the row's end
        make_row([START, END, START, PAD, END], [1] * 5, 0, [0] * 5),  # an empty block, then a good one
        make_row([START, PAD, END], [0, 1, 1], 0, [0, 1, 1]),  # unattended start: its pad and end are stray
        make_row([START, PAD, START, PAD, END], [1] * 5, 2, [1, 1, 1]),  # a start cutting a block; all in loss
        make_row([VIDEO, TEXT, PAD], [1, 1, 0], 1, [1, 1]),  # video token, a pad in padding
    ]
    for row in rows:
        assert vision_blocks(row, ORACLE) == vision_blocks_reference(row, ORACLE)
        assert vision_in_loss(row, ORACLE) == vision_in_loss_reference(row, ORACLE)


def test_vision_blocks_and_loss_random():
    draw = random.Random(2)
    for _ in range(300):
        row = random_vision_row(draw, draw.randint(1, 60))
        assert vision_blocks(row, ORACLE) == vision_blocks_reference(row, ORACLE), row.ids.tolist()
        assert vision_in_loss(row, ORACLE) == vision_in_loss_reference(row, ORACLE), row.ids.tolist()


def test_observations_match_the_full_prefix_search(tiny_processor):
    """Sampled runs ending with their tool call (the short cut), with text after it, with two calls;
    observation blocks whole, cut, or at either end; random mixes."""
    tokenizer = tiny_processor.tokenizer
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    pieces = {
        "think": encode("<think>look at page two</think>"), "search": encode("<search>margin</search>"),
        "fetch": encode("<fetch>image, 2</fetch>"), "after": encode(" and more"), "space": encode(" \n"),
        "result": encode("<result>") + [PAD] * 3 + encode("</result>"), "open": encode("<result>"),
        "close": encode("</result>"), "text": encode("plain words"), "crop": encode("<crop>1, [0, 0, 5, 5]</crop>"),
    }
    sampled_names, masked_names = ["think", "search", "fetch", "after", "space", "text", "crop"], ["result", "open",
                                                                                                   "close", "text"]
    layouts = [[("think", 1), ("fetch", 1), ("result", 0), ("think", 1)], [("fetch", 1), ("after", 1)],
               [("search", 1), ("fetch", 1)], [("fetch", 1), ("space", 1)], [("result", 0)], [("open", 0)],
               [("result", 0), ("fetch", 1), ("close", 0)], []]
    draw = random.Random(3)
    for _ in range(60):
        layouts.append([(draw.choice(sampled_names), 1) if draw.random() < 0.6 else (draw.choice(masked_names), 0)
                        for _ in range(draw.randint(1, 6))])
    for layout in layouts:
        tokens = [t for name, _ in layout for t in pieces[name]]
        loss = [flag for name, flag in layout for _ in pieces[name]]
        row = make_row([TEXT, TEXT] + tokens, [1] * (len(tokens) + 2), 2, loss)
        for regions in (False, True):
            assert check_observations(row, SimpleNamespace(tokenizer=tokenizer), regions) == \
                observations_reference(row, tokenizer, regions), layout
