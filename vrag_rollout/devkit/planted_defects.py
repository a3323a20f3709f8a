"""Known defects planted into a trainer batch, for proving the live guard catches them where
training runs (`scripts/check_easyr1.py --plant`, `scripts/check_verl.py --plant`, the tests).

Contract: `plant(name, batch, processor, taken)` changes one sample of a DataProto-like `batch`
(`batch`: tensors by name, `non_tensor_batch`: object columns) in place, the way the named bug
would, and returns that sample's row. It picks a row not in `taken` (and not in a GRPO group
with one, for `duplicated_group`), so several defects can share one batch, each on its own row.
Each defect is a failure a past review or a user report found:
- `shifted_positions`: positions from a response image on shifted by one (a rope index started
  one step late);
- `observation_in_loss`: one observation token put in the loss;
- `image_pads_cut`: an image's pad run one token short (truncation through an image);
- `duplicated_group`: a sample copied over the next of its group (n identical GRPO samples);
- `past_the_stop`: three tokens kept after the episode's end (a split stop string's remainder);
- `vision_token_sampled`: an `<|image_pad|>` among the sampled tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

IMAGE_PAD = "<|image_pad|>"


def runs(values: list, target: int) -> list[tuple[int, int]]:
    """[start, end) of every run of `target` in `values`."""
    out, start = [], None
    for i, value in enumerate(values + [None]):
        if value == target and start is None:
            start = i
        elif value != target and start is not None:
            out.append((start, i))
            start = None
    return out


def _size(batch: Any) -> int:
    return int(batch.batch["responses"].shape[0])


def _prompt_width(batch: Any) -> int:
    return int(batch.batch["prompts"].shape[1])


def _loss_key(batch: Any) -> str:
    return "loss_mask" if "loss_mask" in batch.batch.keys() else "response_mask"


def _image_runs(batch: Any, row: int, processor: Any) -> list[tuple[int, int]]:
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    return runs(batch.batch["responses"][row].tolist(), pad)


def _used(batch: Any, row: int) -> int:
    return int(batch.batch["attention_mask"][row, _prompt_width(batch):].sum())


def _observations(batch: Any, row: int) -> list[tuple[int, int]]:
    return runs(batch.batch[_loss_key(batch)][row, : _used(batch, row)].tolist(), 0)


def _free_row(batch: Any, taken: set, wanted: Callable[[int], bool]) -> int:
    for row in range(_size(batch)):
        if row not in taken and wanted(row):
            return row
    raise ValueError("no sample of the batch can take this defect (need more samples, or images/observations)")


def shifted_positions(batch: Any, processor: Any, taken: set) -> int:
    row = _free_row(batch, taken, lambda r: bool(_image_runs(batch, r, processor)))
    start = _prompt_width(batch) + _image_runs(batch, row, processor)[0][0]
    batch.batch["position_ids"][row, ..., start:] += 1
    return row


def observation_in_loss(batch: Any, processor: Any, taken: set) -> int:
    row = _free_row(batch, taken, lambda r: bool(_observations(batch, r)))
    batch.batch[_loss_key(batch)][row, _observations(batch, row)[0][0] + 1] = 1
    return row


def image_pads_cut(batch: Any, processor: Any, taken: set) -> int:
    """Removes the last pad of the row's first response image, shifting the rest of the row left."""
    row = _free_row(batch, taken, lambda r: bool(_image_runs(batch, r, processor)))
    position = _image_runs(batch, row, processor)[0][1] - 1
    tensors, P, R = batch.batch, _prompt_width(batch), int(batch.batch["responses"].shape[1])
    for key in list(tensors.keys()):
        value = tensors[key]
        if value.dim() < 2:
            continue
        if value.shape[-1] == R:
            cut = position
        elif value.shape[-1] == P + R:
            cut = P + position
        else:
            continue
        kept = value[row]
        fill = kept[..., -1:].clone()
        if key in ("attention_mask", "response_mask", "loss_mask", "rollout_log_probs", "turn_ids"):
            fill = torch.zeros_like(fill)
        value[row] = torch.cat([kept[..., :cut], kept[..., cut + 1:], fill], dim=-1)
    return row


def duplicated_group(batch: Any, processor: Any, taken: set, n: int = 2) -> int:
    """Copies the first sample of a group with no taken row over the group's second sample."""
    def free_group(row: int) -> bool:
        return row % n == 0 and not set(range(row, row + n)) & taken and row + 1 < _size(batch)

    first = _free_row(batch, taken, free_group)
    second = first + 1
    for key in list(batch.batch.keys()):
        batch.batch[key][second] = batch.batch[key][first]
    for column in (batch.non_tensor_batch or {}).values():
        column[second] = column[first]
    taken.add(second)
    return first


def past_the_stop(batch: Any, processor: Any, taken: set) -> int:
    R = int(batch.batch["responses"].shape[1])
    reasons = (batch.non_tensor_batch or {}).get("termination_reason")
    row = _free_row(batch, taken, lambda r: (reasons is None or reasons[r] == "answered") and _used(batch, r) < R - 3)
    used, P = _used(batch, row), _prompt_width(batch)
    for key in ("response_mask", "loss_mask"):
        if key in batch.batch.keys():
            batch.batch[key][row, used:used + 3] = 1
    batch.batch["attention_mask"][row, P + used:P + used + 3] = 1
    return row


def vision_token_sampled(batch: Any, processor: Any, taken: set) -> int:
    loss = batch.batch[_loss_key(batch)]
    row = _free_row(batch, taken, lambda r: int(loss[r].sum()) > 3)
    position = int(loss[row].nonzero()[2])
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    batch.batch["responses"][row, position] = pad
    batch.batch["input_ids"][row, _prompt_width(batch) + position] = pad
    return row


DEFECTS: dict[str, Callable[..., int]] = {
    "shifted_positions": shifted_positions, "observation_in_loss": observation_in_loss,
    "image_pads_cut": image_pads_cut, "duplicated_group": duplicated_group, "past_the_stop": past_the_stop,
    "vision_token_sampled": vision_token_sampled,
}


def plant(name: str, batch: Any, processor: Any, taken: set, n: int = 2) -> int:
    """Plant defect `name` (one of `DEFECTS`) into a row not in `taken`; adds it to `taken` and
    returns it."""
    if name not in DEFECTS:
        raise ValueError(f"unknown defect {name!r}; known: {', '.join(DEFECTS)}")
    row = DEFECTS[name](batch, processor, taken, n) if name == "duplicated_group" else DEFECTS[name](batch, processor, taken)
    taken.add(row)
    return row


__all__ = ["DEFECTS", "plant", "runs"]
