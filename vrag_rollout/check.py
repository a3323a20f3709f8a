"""`vrag-rollout check`: verify a saved rollout batch independently of the code that made it.

`run_check(path, model_dir, forward=False) -> Report` loads a saved batch (or a pickled trainer
DataProto, see saved_batch.py) and checks it against the model's own code in `model_dir`:

- contract: tensor widths (`responses` R wide, `input_ids`/`attention_mask`/`position_ids`
  P+R), `input_ids == prompts + responses`, 0/1 masks, left-padded prompts, real response tokens
  (`attention_mask`'s response part) contiguous from response position 0, `loss_mask` ⊆
  `response_mask` ⊆ `attention_mask`'s response part (`response_mask` equal to that part, or to
  `loss_mask` in EasyR1's layout), nothing after the first EOS, and an EOS last when the sample
  says it ended on one (`answered`, `eos`); per-sample columns as long as the batch.
- image tokens: every `<|image_pad|>` run whole, wrapped by vision start/end, one run per saved
  image in sequence order, each as long as the processor's own expansion of that image (the
  model's processor re-run on the saved image after the trainer's pixel rescale); no stray vision
  tokens anywhere, none in the loss mask; retrieved pages inside the recorded page pixel band.
- observations: every masked-out block of the response decodes to `<result>…</result>`, and no
  sampled run goes on after a `</search>`/`</fetch>` (the rollout stops there).
- positions: the mrope rows equal the family's own transformers `get_rope_index` on the full
  sequence with the processor's grids, at every attended position; the text row (row 0 of the
  (B, 4, L) layout, or a (B, L) layout) counts 0, 1, 2, … over attended tokens and never returns
  to 0 inside a sample (flash-attention's varlen split would cut the sample there).
- GRPO: the samples of one prompt (by `uid`, else by the config's `n`, else by equal adjacent
  prompts) are not all identical (skipped at temperature 0).
- forward (optional): a transformers forward pass (fp32) of each sample; max and mean gap between
  `rollout_log_probs` and the forward logprobs of the sampled (loss-masked) tokens, in the
  distribution vLLM reported (`meta_info["rollout_log_probs_mode"]`): "raw_logprobs", the model's
  softmax, or "processed_logprobs", the one sampled from (logits plus the logit bias, recorded in
  `meta_info["logit_bias"]` or else the documented -100 on every vision special token, over the
  config's temperature, within its top-k / top-p). Under an action grammar the rollout's
  logprobs are those of the constrained distribution: the gap is reported, not failed, and the
  one property that holds (a constrained logprob is never below the unconstrained one) is
  checked instead.

Independence: this module imports nothing of the rollout's own token, position or vision code;
its oracles are the model's processor and transformers' `get_rope_index` and forward pass.
Every failure names the check, the sample and the position (in the full prompt+response row).
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from PIL import Image

from .saved_batch import NotABatchError, SavedBatch, load_rollout

# model_type -> (module, rope/base model class, causal LM class) in transformers 5.x.
FAMILIES = {
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": (
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel", "Qwen2_5_VLForConditionalGeneration"
    ),
    "qwen3_vl": ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel", "Qwen3VLForConditionalGeneration"),
}
REQUIRED_TENSORS = ("prompts", "responses", "input_ids", "attention_mask", "response_mask", "position_ids")
EOS_REASONS = ("answered", "eos")
TOOL_CLOSE_TAGS = ("</search>", "</fetch>")
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
_OTHER_VISION_NAMES = ("<|vision_pad|>",)
# When a batch does not record its logit bias: the documented ban (README, EasyR1 issue #110) of
# every vision special token, found by name among the tokenizer's added tokens.
_BANNED_NAME = re.compile(r"^<\|(vision|image|video|object_ref|box|quad)_[a-z]+\|>$")
BANNED_BIAS = -100.0


class CheckInputError(ValueError):
    """The inputs cannot be checked at all (not a batch, a model of another family, ...)."""


@dataclass(frozen=True)
class Failure:
    check: str
    sample: Optional[int]
    position: Optional[int]  # index in the full prompt+response row (P + response position)
    message: str

    def __str__(self) -> str:
        where = "" if self.sample is None else f"sample {self.sample}"
        if self.position is not None:
            where += f" position {self.position}"
        return f"[{self.check}] {where}: {self.message}" if where else f"[{self.check}] {self.message}"


@dataclass
class Report:
    path: str
    model_dir: str
    samples: int = 0
    model_family: Optional[str] = None
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forward: Optional[dict] = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def by_check(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for failure in self.failures:
            counts[failure.check] = counts.get(failure.check, 0) + 1
        return counts

    def summary(self) -> dict:
        """The machine-readable verdict (the CLI's last line)."""
        return {
            "ok": self.ok,
            "file": self.path,
            "model": self.model_dir,
            "model_family": self.model_family,
            "samples": self.samples,
            "failures": len(self.failures),
            "by_check": self.by_check(),
            "first_failures": [asdict(f) for f in self.failures[:20]],
            "forward": self.forward,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), sort_keys=True)

    def human(self, limit: int = 50) -> str:
        lines = [f"check {self.path}: {self.samples} samples, {self.model_family or '?'} model {self.model_dir}"]
        lines += [f"  {failure}" for failure in self.failures[:limit]]
        if len(self.failures) > limit:
            lines.append(f"  ... and {len(self.failures) - limit} more failures")
        lines += [f"  note: {note}" for note in self.notes]
        if self.forward is not None:
            f = self.forward
            lines.append(
                f"  forward: {f['tokens']} sampled tokens, logprob gap max {f['max_gap']:.3g} "
                f"(sample {f['max_gap_sample']} position {f['max_gap_position']}), mean {f['mean_gap']:.3g}"
                + (" [action grammar active: constrained logprobs]" if f.get("grammar") else "")
            )
        verdict = "PASS" if self.ok else f"FAIL: {len(self.failures)} failures " + json.dumps(self.by_check())
        lines.append(verdict)
        return "\n".join(lines)


# --------------------------------------------------------------------------- the model's side


class ModelOracle:
    """The model's own config, processor, rope index and (lazily) weights."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoConfig, AutoProcessor

        self.model_dir = str(model_dir)
        try:
            self.config = AutoConfig.from_pretrained(self.model_dir)
        except Exception as e:  # OSError, ValueError, ... from a directory that is not a model
            raise CheckInputError(f"--model {self.model_dir}: cannot read a model config ({e})") from e
        self.family = self.config.model_type
        if self.family not in FAMILIES:
            raise CheckInputError(
                f"--model {self.model_dir} is a {self.family!r} model; check knows {sorted(FAMILIES)}"
            )
        try:
            self.processor = AutoProcessor.from_pretrained(self.model_dir)
        except Exception as e:
            raise CheckInputError(f"--model {self.model_dir}: cannot load its processor ({e})") from e
        self.tokenizer = self.processor.tokenizer
        c = self.config
        self.image_pad = int(c.image_token_id)
        self.video_pad = int(c.video_token_id)
        self.vision_start = int(c.vision_start_token_id)
        self.vision_end = int(c.vision_end_token_id)
        vocab = self.tokenizer.get_vocab()
        self.vision_ids = {self.image_pad, self.video_pad, self.vision_start, self.vision_end}
        self.vision_ids |= {vocab[name] for name in _OTHER_VISION_NAMES if name in vocab}
        self.eos_ids = self._eos_ids()
        self._rope_model = None
        self._lm = None

    def generation_header(self) -> str:
        """What the model's chat template writes to open an assistant turn (e.g.
        "<|im_start|>assistant\\n"): a native tool turn must end with it."""
        user = [{"role": "user", "content": "x"}]
        with_header = self.tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        without = self.tokenizer.apply_chat_template(user, add_generation_prompt=False, tokenize=False)
        return with_header[len(without):]

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        try:
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(self.model_dir).eos_token_id
            ids |= set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        except Exception:  # no generation_config.json: the tokenizer's EOS only
            pass
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def _class(self, index: int) -> Any:
        module_name, *names = FAMILIES[self.family]
        return getattr(importlib.import_module(module_name), names[index])

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   grids: Optional[torch.Tensor]) -> torch.Tensor:
        """(3, L) positions from the family's own `get_rope_index` for one full row."""
        if self._rope_model is None:
            with torch.device("meta"):  # get_rope_index needs the config only: no weights
                self._rope_model = self._class(0)(self.config)
        types = torch.zeros_like(input_ids, dtype=torch.int32)
        types[input_ids == self.image_pad] = 1
        types[input_ids == self.video_pad] = 2
        positions, _ = self._rope_model.get_rope_index(
            input_ids=input_ids[None], mm_token_type_ids=types[None], image_grid_thw=grids,
            attention_mask=attention_mask[None],
        )
        return positions[:, 0]

    def expand_images(self, images: Sequence[Image.Image]) -> tuple[list[int], Optional[torch.Tensor], Any]:
        """(pad run length per image, image_grid_thw, processor outputs) from the processor itself."""
        if not images:
            return [], None, None
        convert = self.tokenizer.convert_ids_to_tokens
        block = convert(self.vision_start) + convert(self.image_pad) + convert(self.vision_end)
        out = self.processor(text=[block * len(images)], images=list(images), return_tensors="pt")
        lengths = [end - start for start, end in _runs(out["input_ids"][0].tolist(), self.image_pad)]
        if len(lengths) != len(images):
            raise CheckInputError(f"the processor expanded {len(images)} images into {len(lengths)} pad runs")
        return lengths, out["image_grid_thw"], out

    def language_model(self) -> Any:
        if self._lm is None:
            self._lm = self._class(1).from_pretrained(self.model_dir, dtype=torch.float32).eval()
        return self._lm


@functools.lru_cache(maxsize=4)
def load_oracle(model_dir: str) -> ModelOracle:
    return ModelOracle(model_dir)


# --------------------------------------------------------------------------- helpers


def _runs(values: Sequence[int], target: int) -> list[tuple[int, int]]:
    """[(start, end)) of every maximal run of `target`."""
    out, start = [], None
    for i, value in enumerate(values):
        if value == target and start is None:
            start = i
        elif value != target and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(values)))
    return out


def _first_bad(flags: torch.Tensor) -> Optional[int]:
    idx = flags.nonzero()
    return int(idx[0]) if len(idx) else None


def trainer_rescale(image: Image.Image, min_pixels: Optional[int], max_pixels: Optional[int]) -> Image.Image:
    """The trainer's pixel rule (EasyR1's dataset and actor): scale down past max_pixels, up
    below min_pixels, each by sqrt of the pixel ratio with sides truncated, then RGB."""
    for limit, too_far in ((max_pixels, lambda a: a > max_pixels), (min_pixels, lambda a: a < min_pixels)):
        if limit and too_far(image.width * image.height):
            scale = math.sqrt(limit / (image.width * image.height))
            image = image.resize((int(image.width * scale), int(image.height * scale)))
    return image if image.mode == "RGB" else image.convert("RGB")


@dataclass
class _Row:
    """One sample's views: full row (prompt + response) and response part."""

    index: int
    prompt_len: int
    ids: torch.Tensor  # (P+R,)
    attention: torch.Tensor  # (P+R,)
    responses: torch.Tensor  # (R,)
    real: torch.Tensor  # (R,) attention_mask's response part
    response_mask: torch.Tensor
    loss: torch.Tensor
    positions: torch.Tensor  # (rows, P+R) or (P+R,)
    reason: Any


# --------------------------------------------------------------------------- the checks


def _check_shapes(saved: SavedBatch) -> tuple[list[Failure], list[str]]:
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
        fails.append(Failure("contract", None, None,
                             f"responses are {resp_len} wide, the config's response_length is {configured}"))
    if len(saved.images) != size:
        fails.append(Failure("contract", None, None, f"{len(saved.images)} image lists for {size} samples"))
    for name, values in saved.columns.items():
        if len(values) != size:
            fails.append(Failure("contract", None, None, f"column {name!r} has {len(values)} rows, the batch {size}"))
    if "loss_mask" not in t:
        notes.append("no loss_mask: response_mask is taken as the loss mask")
    return fails, notes


def _check_row_contract(row: _Row, prompts: torch.Tensor, eos_ids: set[int], native: bool = False) -> list[Failure]:
    fails: list[Failure] = []
    s, P = row.index, row.prompt_len

    def fail(position: Optional[int], message: str) -> None:
        fails.append(Failure("contract", s, position, message))

    full = torch.cat([prompts, row.responses])
    bad = _first_bad(row.ids != full)
    if bad is not None:
        fail(bad, f"input_ids {int(row.ids[bad])} != prompts+responses {int(full[bad])}")
    masks = (("attention_mask", row.attention), ("response_mask", row.response_mask), ("loss_mask", row.loss))
    for name, mask in masks:
        bad = _first_bad((mask != 0) & (mask != 1))
        if bad is not None:
            fail(bad + (0 if name == "attention_mask" else P), f"{name} holds {mask[bad].item()}, not 0/1")
    prompt_mask = row.attention[:P].long()
    bad = _first_bad(torch.diff(prompt_mask) < 0)
    if bad is not None:
        fail(bad + 1, "prompt is not left-padded: attention_mask drops to 0 after a real token")
    if int(prompt_mask.sum()) == 0:
        fail(0, "prompt has no attended token")
    real = row.real.long()
    bad = _first_bad(torch.diff(real) > 0)
    if bad is not None:
        fail(P + bad + 1, "response tokens are not contiguous from response position 0 (a real token after padding)")
    for inner, outer, message in (
        (row.response_mask, row.real, "response_mask is 1 where attention_mask is 0"),
        (row.loss, row.response_mask, "loss_mask is 1 where response_mask is 0"),
    ):
        bad = _first_bad((inner.long() == 1) & (outer.long() == 0))
        if bad is not None:
            fail(P + bad, message)
    if not torch.equal(row.response_mask.long(), real) and not torch.equal(row.response_mask.long(), row.loss.long()):
        bad = _first_bad(row.response_mask.long() != real)
        fail(P + bad, "response_mask differs from attention_mask's response part (and is not the loss mask either)")
    used = int(real.sum())
    tokens = row.responses[:used].tolist()
    loss = row.loss[:used].long().tolist()
    for i, token in enumerate(tokens):
        # In the native tool-call format each assistant turn ends with an EOS and a tool turn
        # (masked, with end-of-turn tokens of its own) follows it; anything else after an EOS is
        # a response running past its end.
        if token in eos_ids and i < used - 1 and not (native and (loss[i] == 0 or loss[i + 1] == 0)):
            fail(P + i + 1, f"the response runs past its EOS at position {P + i}")
            break
    if row.reason in EOS_REASONS and (not tokens or tokens[-1] not in eos_ids):
        fail(P + max(used - 1, 0), f"termination_reason {row.reason!r} but the last response token is not an EOS")
    return fails


def _vision_blocks(row: _Row, oracle: ModelOracle) -> tuple[list[tuple[int, int]], list[Failure]]:
    """Pad runs [start, end) of well-formed vision blocks over the attended tokens; failures for
    everything else (stray starts/ends/pads, video tokens, vision tokens in padding)."""
    s, ids, attended = row.index, row.ids.tolist(), row.attention.tolist()
    fails, blocks, i = [], [], 0
    inside: set[int] = set()
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
            where = "" if attended[p] else " in padding"
            fails.append(Failure("image_tokens", s, p, f"{kind} {token}{where}"))
    return blocks, fails


def _check_images(row: _Row, saved: SavedBatch,
                  oracle: ModelOracle) -> tuple[list[Failure], Optional[torch.Tensor], Any]:
    """Failures, the processor's grids (None when the tokens do not match the images), outputs."""
    s, P = row.index, row.prompt_len
    blocks, fails = _vision_blocks(row, oracle)
    for p in (row.loss.nonzero().flatten() + P).tolist():
        if int(row.ids[p]) in oracle.vision_ids:
            fails.append(Failure("image_tokens", s, p, "vision token in the loss mask (sampled or trained on)"))
    images = saved.decoded_images(s)
    band = saved.pixel_band
    views = [trainer_rescale(image, band.get("trainer_min_pixels"), band.get("trainer_max_pixels")) for image in images]
    lengths, grids, outputs = oracle.expand_images(views)
    if len(blocks) != len(images):
        fails.append(Failure("image_tokens", s, blocks[0][0] if blocks else None,
                             f"{len(blocks)} image pad runs but {len(images)} saved images"))
        return fails, None, outputs
    ordered = True
    for k, ((start, end), want) in enumerate(zip(blocks, lengths)):
        if end - start != want:
            ordered = False
            fails.append(Failure("image_tokens", s, start,
                                 f"image {k}: pad run of {end - start} tokens at [{start}, {end}), the processor "
                                 f"expands this image to {want} ({images[k].width}x{images[k].height} px)"))
    if not ordered and sorted(end - start for start, end in blocks) == sorted(lengths):
        fails.append(Failure("image_tokens", s, blocks[0][0],
                             "the pad runs fit the saved images in another order: images in the wrong order? "
                             f"(pad runs {[e - b for b, e in blocks]}, images expand to {lengths})"))
    low, high = band.get("page_min_pixels"), band.get("page_max_pixels")
    if low and high:
        for k, (start, _) in enumerate(blocks):
            area = images[k].width * images[k].height
            if start >= P and not low <= area <= high:
                fails.append(Failure("image_tokens", s, start, f"retrieved page (image {k}) has {area} pixels, "
                                     f"outside the page band [{low}, {high}]"))
    return fails, (grids if ordered else None), outputs


def _check_positions(row: _Row, grids: Optional[torch.Tensor], oracle: ModelOracle) -> list[Failure]:
    s, pos, valid = row.index, row.positions, row.attention.bool()
    fails: list[Failure] = []
    n_valid = int(valid.sum())
    count = torch.arange(n_valid, dtype=pos.dtype)
    text = pos if pos.dim() == 1 else (pos[0] if pos.shape[0] == 4 else None)
    if text is not None:
        where = valid.nonzero().flatten()
        bad = _first_bad(text[valid] != count)
        if bad is not None:
            fails.append(Failure("positions", s, int(where[bad]),
                                 f"text position {int(text[where[bad]])}, expected {bad} (attended tokens before it)"))
        first = int(where[0]) if len(where) else 0
        zero = _first_bad(text[first + 1:] == 0)
        if zero is not None:
            fails.append(Failure("positions", s, first + 1 + zero, "text position returns to 0 inside the sample"))
    if pos.dim() == 2:
        expected = oracle.rope_index(row.ids, row.attention, grids)
        rope = pos[1:] if pos.shape[0] == 4 else pos
        diff = (rope != expected).any(dim=0) & valid
        bad = _first_bad(diff)
        if bad is not None:
            region = "prompt" if bad < row.prompt_len else f"response position {bad - row.prompt_len}"
            fails.append(Failure("positions", s, bad,
                                 f"mrope (t, h, w) = {tuple(rope[:, bad].tolist())}, get_rope_index gives "
                                 f"{tuple(expected[:, bad].tolist())} ({region}; {int(diff.sum())} positions differ)"))
    return fails


def _loss_runs(flags: list[int], used: int) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the loss mask over the real response."""
    out, start = [], 0
    for i in range(1, used + 1):
        if i == used or flags[i] != flags[start]:
            out.append((flags[start], start, i))
            start = i
    return out


def _check_native_observations(row: _Row, oracle: ModelOracle) -> list[Failure]:
    """Native tool-call format: every masked block follows a sampled end of turn and ends by
    opening the next assistant turn, as the model's own chat template writes it."""
    s, P = row.index, row.prompt_len
    used = int(row.real.sum())
    tokens, flags = row.responses[:used].tolist(), row.loss[:used].long().tolist()
    header = oracle.generation_header()
    fails: list[Failure] = []
    for value, start, end in _loss_runs(flags, used):
        if value:
            continue
        if start == 0 or tokens[start - 1] not in oracle.eos_ids:
            fails.append(Failure("observations", s, P + start, "a tool turn that does not follow a sampled end of turn"))
        text = oracle.tokenizer.decode(tokens[start:end], skip_special_tokens=False)
        if not text.endswith(header):
            fails.append(Failure("observations", s, P + end - 1,
                                 f"the tool turn at {P + start} does not open the next assistant turn ({header!r})"))
    return fails


def _check_observations(row: _Row, oracle: ModelOracle) -> list[Failure]:
    s, P = row.index, row.prompt_len
    used = int(row.real.sum())
    tokens, flags = row.responses[:used].tolist(), row.loss[:used].long().tolist()
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
        for tag in TOOL_CLOSE_TAGS:
            if tag not in text:
                continue
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


def _groups(saved: SavedBatch) -> list[list[int]]:
    size = len(saved)
    uids = saved.columns.get("uid")
    if uids is not None:
        groups: dict[Any, list[int]] = {}
        for row, uid in enumerate(uids):
            groups.setdefault(str(uid), []).append(row)
        return list(groups.values())
    n = saved.config.get("n")
    if isinstance(n, int) and n > 1 and size % n == 0:
        return [list(range(start, start + n)) for start in range(0, size, n)]
    prompts, docs = saved.tensors["prompts"], saved.column("doc_id")
    out: list[list[int]] = []
    for row in range(size):
        if out and torch.equal(prompts[row], prompts[out[-1][0]]) and docs[row] == docs[out[-1][0]]:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _check_groups(saved: SavedBatch) -> tuple[list[Failure], list[str]]:
    temperature = saved.config.get("temperature")
    if temperature == 0:
        return [], ["GRPO check skipped: temperature 0 (greedy samples are identical by design)"]
    t = saved.tensors
    fails = []
    for group in _groups(saved):
        if len(group) < 2:
            continue
        responses = [t["responses"][row][t["attention_mask"][row, t["prompts"].shape[1]:].bool()] for row in group]
        if all(torch.equal(responses[0], other) for other in responses[1:]):
            fails.append(Failure("grpo", group[0], int(t["prompts"].shape[1]),
                                 f"the {len(group)} samples {group} of one prompt are identical at every response "
                                 "position: zero advantage for the whole group"))
    return fails, []


def _check_forward(saved: SavedBatch, oracle: ModelOracle, rows: list[_Row], processed: dict,
                   tolerance: float) -> tuple[list[Failure], Optional[dict], list[str]]:
    t = saved.tensors
    key = "rollout_log_probs" if "rollout_log_probs" in t else None
    if key is None:
        missing = "the batch has no rollout_log_probs (roll out with calculate_log_probs=True)"
        return [Failure("forward", None, None, missing)], None, []
    grammar = bool(saved.action_grammar)
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
        kwargs: dict[str, Any] = {"mm_token_type_ids": types}
        outputs = processed.get(row.index)
        if outputs is not None:
            kwargs.update(pixel_values=outputs["pixel_values"], image_grid_thw=outputs["image_grid_thw"])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0].float()
        logprobs = distribution.logprobs(logits)
        start = int(row.attention[: row.prompt_len].sum())  # compact index of response position 0
        sampled = row.loss[: int(row.real.sum())].nonzero().flatten()
        if not len(sampled):
            continue
        targets = row.responses[sampled]
        forward = logprobs[start + sampled - 1, targets]
        rollout = t[key][row.index, sampled].float()
        gap = (rollout - forward).abs()
        gaps.append(gap)
        k = int(gap.argmax())
        if float(gap[k]) > worst[0]:
            worst = (float(gap[k]), row.index, row.prompt_len + int(sampled[k]))
        if grammar:
            low = _first_bad(rollout < forward - tolerance)
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
        "compared": key,
        "mode": distribution.mode,
    }
    notes, fails = list(distribution.notes), list(below)
    if grammar:
        notes.append("an action grammar (action_regex) was active: rollout logprobs are those of the "
                     "grammar-constrained distribution and differ from the unconstrained forward pass by design "
                     "(up to several nats); the gap is reported, not failed")
    elif stats["max_gap"] > tolerance:
        unknown = (" (the batch does not record whether an action grammar was active; under one, gaps of several "
                   "nats are expected)") if saved.action_grammar is None else ""
        fails.append(Failure("forward", worst[1], worst[2], f"rollout logprob differs from the forward pass by "
                             f"{stats['max_gap']:.4g} > {tolerance:g} (mean {stats['mean_gap']:.3g}){unknown}"))
    return fails, stats, notes


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


# --------------------------------------------------------------------------- entry points


def _rows(saved: SavedBatch) -> list[_Row]:
    t = saved.tensors
    P = int(t["prompts"].shape[1])
    loss = t["loss_mask"] if "loss_mask" in t else t["response_mask"]
    reasons = saved.column("termination_reason")
    return [
        _Row(
            index=row, prompt_len=P, ids=t["input_ids"][row].long(), attention=t["attention_mask"][row],
            responses=t["responses"][row].long(), real=t["attention_mask"][row, P:],
            response_mask=t["response_mask"][row],
            loss=loss[row], positions=t["position_ids"][row].long(), reason=reasons[row],
        )
        for row in range(len(saved))
    ]


def _same_family(recorded: str, model_type: str) -> bool:
    """The batch's recorded family (a model_type or the rollout's name, e.g. "qwen2.5-vl") is the model's."""
    recorded = recorded.replace(".", "_").replace("-", "_")
    return recorded == model_type or model_type.startswith(recorded + "_")  # qwen3_vl covers qwen3_vl_moe


def check_batch(saved: SavedBatch, model_dir: str | Path, *, forward: bool = False, forward_tolerance: float = 1e-3,
                path: str = "<batch>") -> Report:
    """Every check on a loaded batch; CheckInputError when it cannot be checked at all."""
    oracle = load_oracle(str(model_dir))
    if saved.model_family and not _same_family(saved.model_family, oracle.family):
        raise CheckInputError(
            f"the batch was made by a {saved.model_family} model but --model {model_dir} is {oracle.family}"
        )
    report = Report(path=str(path), model_dir=str(model_dir), samples=len(saved), model_family=oracle.family)
    fails, notes = _check_shapes(saved)
    report.failures += fails
    report.notes += notes
    if fails:
        report.notes.append("per-sample checks skipped: the batch's shapes are broken")
        return report
    vocab = len(oracle.tokenizer)
    if int(saved.tensors["input_ids"].max()) >= vocab:
        raise CheckInputError(f"the batch holds token ids up to {int(saved.tensors['input_ids'].max())}, beyond the "
                              f"{vocab} tokens of --model {model_dir}: another tokenizer?")
    prompts = saved.tensors["prompts"]
    rows = _rows(saved)
    processed: dict[int, Any] = {}
    skipped_positions = []
    native = (saved.config or {}).get("action_format") == "tool_call"
    for row in rows:
        report.failures += _check_row_contract(row, prompts[row.index].long(), oracle.eos_ids, native)
        image_fails, grids, outputs = _check_images(row, saved, oracle)
        report.failures += image_fails
        processed[row.index] = outputs
        if grids is not None or not saved.images[row.index]:
            report.failures += _check_positions(row, grids, oracle)
        else:
            skipped_positions.append(row.index)
        report.failures += (_check_native_observations if native else _check_observations)(row, oracle)
    if skipped_positions:
        report.notes.append(f"mrope positions not compared for samples {skipped_positions}: "
                            "their image tokens are broken")
    fails, notes = _check_groups(saved)
    report.failures += fails
    report.notes += notes
    if forward:
        fails, stats, notes = _check_forward(saved, oracle, rows, processed, forward_tolerance)
        report.failures += fails
        report.notes += notes
        report.forward = stats
    report.failures.sort(key=lambda f: (f.sample if f.sample is not None else -1, f.position or 0))
    return report


def run_check(path: str | Path, model_dir: str | Path, forward: bool = False,
              forward_tolerance: float = 1e-3) -> Report:
    """Load `path` (a saved batch or a pickled trainer DataProto) and check it against `model_dir`."""
    try:
        saved = load_rollout(path)
    except NotABatchError as e:
        raise CheckInputError(str(e)) from e
    return check_batch(saved, model_dir, forward=forward, forward_tolerance=forward_tolerance, path=str(path))


def main(path: str, model_dir: str, forward: bool = False, forward_tolerance: float = 1e-3) -> int:
    """CLI body: the human report, then one JSON line; 0 pass, 1 failures, 2 unusable input."""
    try:
        report = run_check(path, model_dir, forward=forward, forward_tolerance=forward_tolerance)
    except (CheckInputError, FileNotFoundError) as e:
        print(f"error: {e}")
        print(json.dumps({"ok": False, "file": str(path), "model": str(model_dir), "error": str(e)}, sort_keys=True))
        return 2
    print(report.human())
    print(report.to_json())
    return 0 if report.ok else 1
