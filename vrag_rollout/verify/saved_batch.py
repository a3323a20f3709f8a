"""Saved rollout batches: one file from which a rollout can be re-checked and re-viewed.

`save_rollout(output, path, ...)` writes a rollout's output DataProto; `load_rollout(path)` reads
it back as a `SavedBatch`, and also reads a trainer batch pickled from EasyR1 or verl (a
`DataProto` with `batch`, `non_tensor_batch`, `meta_info`, written by `DataProto.save_to_disk`,
`pickle.dump` or `torch.save`). Documented in docs/saved-batch.md.

Format (FORMAT_VERSION 2): `torch.save` of a plain dict that `torch.load(weights_only=True)` reads
(no pickled classes, so loading our own files runs no code). One module on purpose: writing and
reading the format are one contract, kept side by side under this specification.

- `format`: "vrag-rollout/saved-batch"; `version`: 2 (version 1 files are still read).
- `tensors`: every tensor of the output batch, rows = samples (the n samples of a prompt adjacent):
  `prompts` (B, P), `responses` (B, R), `input_ids` (B, P+R), `attention_mask` (B, P+R),
  `response_mask` (B, R), `loss_mask` (B, R), `position_ids` (B, 4|3, P+R) or (B, P+R), and
  `rollout_log_probs` (B, R) when recorded (plus whatever else a trainer batch holds).
- `pages`: the encoded bytes of each distinct image of the batch's `multi_modal_data`, once: the
  original bytes when the entry was bytes, a `{"bytes": ...}` dict (the rollout's page entries) or
  a path, else lossless PNG (so the pixels, and the grids, are exact).
- `images`: per sample, the index in `pages` of every image of its `multi_modal_data`, in
  sequence order (prompt images, then retrieved pages). (Version 1 held the bytes themselves
  here, one copy per sample; `SavedBatch.images` reads both as bytes, shared between samples.)
- `image_key`: the trainer's key for them, "images" (current EasyR1) or "image" (v0.3).
- `columns`: the other non-tensor columns as plain lists: `doc_id`, `page_ids` (per observation,
  its page ids), `termination_reason`, `num_turns`, `num_searches`, `num_fetches`, `num_crops`, and
  any other column made of plain values (`uid`, `ground_truth`, ...).
- `metrics` (`meta_info["metrics"]`), `config` (the rollout config as a dict), `meta` (the other
  plain `meta_info` entries).
- `model_family`: the model config's `model_type` (`qwen2_vl`, `qwen2_5_vl`, `qwen3_vl`), from the
  model directory's config.json, else the rollout's `meta_info["model_family"]` ("qwen2.5-vl" is
  stored as "qwen2_5_vl"), else the processor class; None when none is known.
- `action_grammar`: True when an `action_regex` constrained sampling (rollout logprobs are then
  those of the constrained distribution), False when not, None when unknown.
- `pixel_band`: the page band (`page_min_pixels`, `page_max_pixels` from the config, else from
  `meta_info["page_pixel_band"]`, a (min, max) pair; its minimum from `page_pixel_band` when the
  config shows pages below the band on purpose: `SHRINKING_KEYS`), the trainer's image band
  (`trainer_min_pixels`, `trainer_max_pixels`, from meta_info) and the processor's geometry
  (`patch_size`, `merge_size`, `temporal_patch_size`, `processor_min_pixels`,
  `processor_max_pixels`); absent values are None.
- `token_text`: {token id: its text} for every id in the batch, so the view works without the
  tokenizer; `model_path`: the model directory used, when known.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from PIL import Image

from .image_entries import entry_bytes

FORMAT = "vrag-rollout/saved-batch"
FORMAT_VERSION = 2

# The model_type of each processor class this project knows (used when no model dir is given).
_FAMILY_BY_PROCESSOR = {
    "Qwen2VLProcessor": "qwen2_vl",
    "Qwen2_5_VLProcessor": "qwen2_5_vl",
    "Qwen3VLProcessor": "qwen3_vl",
}
_SKIPPED_COLUMNS = ("multi_modal_data", "multi_modal_inputs")


class NotABatchError(ValueError):
    """The file is not a saved rollout batch nor a pickled DataProto."""


@dataclass
class SavedBatch:
    tensors: dict[str, torch.Tensor]
    images: list[list[bytes]]  # per sample, encoded images in sequence order
    columns: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    model_family: Optional[str] = None
    action_grammar: Optional[bool] = None
    pixel_band: dict[str, Optional[int]] = field(default_factory=dict)
    image_key: str = "images"
    token_text: dict[int, str] = field(default_factory=dict)
    model_path: Optional[str] = None
    source: str = "vrag-rollout"  # or "dataproto": converted from a pickled trainer batch
    version: int = FORMAT_VERSION

    def __len__(self) -> int:
        responses = self.tensors.get("responses")
        return int(responses.shape[0]) if responses is not None else len(self.images)

    def column(self, name: str, default: Any = None) -> list:
        """A non-tensor column, or `default` repeated per sample when the batch lacks it."""
        return self.columns.get(name, [default] * len(self))

    def decoded_images(self, row: int) -> list[Image.Image]:
        """The images of one sample, decoded (fully loaded), in sequence order."""
        out = []
        for k, data in enumerate(self.images[row]):
            try:
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
                    out.append(image.copy())
            except Exception as e:  # PIL raises many types for bad data
                raise ValueError(f"sample {row}: saved image {k} does not decode: {e}") from e
        return out

    def to_dict(self) -> dict:
        pages, index = _distinct_pages(self.images)
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "tensors": self.tensors,
            "pages": pages,
            "images": index,
            "image_key": self.image_key,
            "columns": self.columns,
            "metrics": self.metrics,
            "config": self.config,
            "meta": self.meta,
            "model_family": self.model_family,
            "action_grammar": self.action_grammar,
            "pixel_band": self.pixel_band,
            "token_text": self.token_text,
            "model_path": self.model_path,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SavedBatch":
        version = data.get("version")
        if not isinstance(version, int) or version < 1:
            raise NotABatchError(f"saved batch has no valid format version ({version!r})")
        if version > FORMAT_VERSION:
            raise NotABatchError(
                f"saved batch has format version {version}; this vrag-rollout reads versions up to {FORMAT_VERSION}"
            )
        missing = [key for key in ("tensors", "images") if key not in data]
        if missing:
            raise NotABatchError(f"saved batch lacks {missing}")
        if version >= 2:
            pages = list(data.get("pages") or [])
            refs = [list(row) for row in data["images"]]
            if not all(isinstance(k, int) and 0 <= k < len(pages) for row in refs for k in row):
                raise NotABatchError(f"saved batch's image references do not match its {len(pages)} pages")
            images = [[pages[k] for k in row] for row in refs]
        else:
            images = [list(row) for row in data["images"]]
        return cls(
            tensors=dict(data["tensors"]),
            images=images,
            columns=dict(data.get("columns") or {}),
            metrics=dict(data.get("metrics") or {}),
            config=dict(data.get("config") or {}),
            meta=dict(data.get("meta") or {}),
            model_family=data.get("model_family"),
            action_grammar=data.get("action_grammar"),
            pixel_band=dict(data.get("pixel_band") or {}),
            image_key=data.get("image_key") or "images",
            token_text={int(k): v for k, v in (data.get("token_text") or {}).items()},
            model_path=data.get("model_path"),
            source=data.get("source") or "vrag-rollout",
            version=version,
        )


# --------------------------------------------------------------------------- writing


def save_rollout(output: Any, path: str | Path, *, processor: Any = None, model_path: Optional[str | Path] = None,
                 config: Any = None) -> SavedBatch:
    """Write a rollout's output DataProto to `path` (atomically); returns what was written.

    `processor` (the model's processor) gives the token texts, the processor's pixel geometry and,
    without `model_path`, the model family; `model_path` (the model directory) gives the family
    from its config.json; `config` (the rollout config) the page band and whether an
    `action_regex` was active. `meta_info["model_family"]` and `meta_info["action_grammar"]`
    take precedence when the rollout recorded them.
    """
    saved = from_dataproto(output, processor=processor, model_path=model_path, config=config)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(saved.to_dict(), f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return saved


def from_dataproto(data: Any, *, processor: Any = None, model_path: Optional[str | Path] = None,
                   config: Any = None, source: str = "vrag-rollout") -> SavedBatch:
    """A SavedBatch from any DataProto-like object (`batch`, `non_tensor_batch`, `meta_info`)."""
    if not all(hasattr(data, name) for name in ("batch", "non_tensor_batch", "meta_info")):
        raise NotABatchError(f"expected a DataProto (batch, non_tensor_batch, meta_info), got {type(data).__name__}")
    if data.batch is None or "responses" not in data.batch.keys():
        raise NotABatchError("the DataProto has no 'responses' tensor: not a rollout output")
    tensors = {key: value.detach().cpu().clone() for key, value in data.batch.items()}
    size = int(tensors["responses"].shape[0])
    columns_in = dict(data.non_tensor_batch or {})
    meta_in = dict(data.meta_info or {})
    config_dict = _config_dict(config)

    images, image_key = _encode_multi_modal(columns_in.get("multi_modal_data"), size)
    columns, skipped = {}, []
    for name, values in columns_in.items():
        if name in _SKIPPED_COLUMNS:
            continue
        try:
            columns[name] = [_plain(value) for value in values]
        except TypeError:
            skipped.append(name)
    meta = {}
    for key, value in meta_in.items():
        if key == "metrics":
            continue
        try:
            meta[key] = _plain(value)
        except TypeError:
            skipped.append(f"meta_info.{key}")
    if skipped:
        meta["skipped"] = skipped

    recorded = _uniform(columns_in.get("rollout_meta"))  # verl's agent loop keeps it per sample
    if isinstance(recorded, Mapping):
        for key in ("action_format", "temperature", "top_k", "top_p"):
            if key in recorded:
                config_dict.setdefault(key, recorded[key])
        for key, value in recorded.items():
            if key not in config_dict and key not in meta_in:
                meta_in[key] = value
                meta[key] = _plain(value)
    for key in GRAMMAR_KEYS:  # the rollout's meta (or verl's rollout_meta column) records its grammars
        if meta_in.get(key) and not config_dict.get(key):
            config_dict[key] = meta_in[key]
    grammar = meta_in.get("action_grammar")
    if grammar is None and "action_regex" in config_dict:
        grammar = bool(config_dict["action_regex"])
    family = (_family_from_model_dir(model_path) or model_type_of(meta_in.get("model_family"))
              or _family_from_processor(processor))
    raw_metrics = meta_in.get("metrics")
    try:  # a rollout's metrics by name; verl's agent loop keeps a list, one dict per sample: not kept
        metrics = {str(k): _plain(v) for k, v in raw_metrics.items()} if isinstance(raw_metrics, Mapping) else {}
    except TypeError:
        metrics = {}
    return SavedBatch(
        tensors=tensors,
        images=images,
        columns=columns,
        metrics=metrics,
        config=config_dict,
        meta=meta,
        model_family=family,
        action_grammar=None if grammar is None else bool(grammar),
        pixel_band=_pixel_band(processor, config_dict, meta_in),
        image_key=image_key,
        token_text=_token_text(processor, tensors),
        model_path=str(model_path) if model_path is not None else None,
        source=source,
    )


GRAMMAR_KEYS = ("action_regex", "first_turn_action_regex")


def _uniform(column: Any) -> Any:
    """The one value every row of a column holds, else None."""
    if column is None or not len(column):
        return None
    first = column[0]
    return first if all(value == first for value in column) else None


def encode_image(entry: Any) -> bytes:
    """One multi_modal_data entry as encoded image bytes (original bytes kept, PIL -> PNG)."""
    return entry_bytes(entry)


def _distinct_pages(images: list[list[bytes]]) -> tuple[list[bytes], list[list[int]]]:
    """(each distinct image's bytes once, per sample the index of each of its images)."""
    pages: list[bytes] = []
    where: dict[bytes, int] = {}  # keyed by value (a bytes object caches its hash): equal content, one page
    index = []
    for row in images:
        refs = []
        for data in row:
            if data not in where:
                where[data] = len(pages)
                pages.append(data)
            refs.append(where[data])
        index.append(refs)
    return pages, index


def _encode_multi_modal(column: Any, size: int) -> tuple[list[list[bytes]], str]:
    if column is None:
        return [[] for _ in range(size)], "images"
    if len(column) != size:
        raise NotABatchError(f"multi_modal_data has {len(column)} rows, the batch {size}")
    key = "images"
    out = []
    done: dict = {}  # id -> (entry, its bytes); the entry is kept so its id stays its own
    for row, item in enumerate(column):
        entries: Any = []
        if isinstance(item, Mapping):
            if "image" in item and "images" not in item:
                key = "image"
            entries = item.get("images", item.get("image")) or []
        elif item is not None:
            raise NotABatchError(f"sample {row}: multi_modal_data is a {type(item).__name__}, expected a dict")
        encoded = []
        for k, entry in enumerate(entries):
            if id(entry) not in done:  # a page shared by many samples is encoded once
                try:
                    done[id(entry)] = (entry, encode_image(entry))
                except (TypeError, OSError) as e:
                    raise NotABatchError(f"sample {row}: image {k} cannot be saved: {e}") from e
            encoded.append(done[id(entry)][1])
        out.append(encoded)
    return out, key


def _plain(value: Any) -> Any:
    """A value made of str/int/float/bool/None/bytes/list/dict only; TypeError otherwise."""
    if isinstance(value, np.generic):  # first: numpy's float64 is a float, and would pickle as numpy's
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float, bytes)):
        return value
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.dtype != object else [_plain(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    raise TypeError(f"not a plain value: {type(value).__name__}")


def _config_dict(config: Any) -> dict:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        values = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        values = dict(config)
    else:
        try:
            from omegaconf import OmegaConf

            values = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else vars(config)
        except ImportError:
            values = vars(config)
    out = {}
    for key, value in values.items():
        try:
            out[str(key)] = _plain(value)
        except TypeError:
            out[str(key)] = repr(value)
    return out


def model_type_of(family: Optional[str]) -> Optional[str]:
    """A family as a config `model_type`: the rollout's names ("qwen2.5-vl") or model types alike."""
    return None if not family else str(family).replace(".", "_").replace("-", "_")


def _family_from_model_dir(model_path: Any) -> Optional[str]:
    if model_path is None:
        return None
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def _family_from_processor(processor: Any) -> Optional[str]:
    return _FAMILY_BY_PROCESSOR.get(type(processor).__name__) if processor is not None else None


def _field(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _int_or_none(value: Any) -> Optional[int]:
    return None if value is None else int(value)


# Rollout settings that show pages below the configured page band on purpose (search thumbnails,
# a visual-token budget, thumbnail context edits): the band's lower bound is then the smallest
# page the rollout may show, which it records in meta_info["page_pixel_band"].
SHRINKING_KEYS = ("search_page_max_pixels", "visual_token_budget", "context_edit_form")


def _shrinks_pages(config: Mapping[str, Any]) -> bool:
    return bool(config.get("search_page_max_pixels") or config.get("visual_token_budget")
                or config.get("context_edit_form") == "thumbnail")


def _pixel_band(processor: Any, config: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Optional[int]]:
    ip = getattr(processor, "image_processor", None) or processor
    size = getattr(ip, "size", None)
    used = meta.get("page_pixel_band") or (None, None)  # the band the rollout resolved, when it says
    low = used[0] if _shrinks_pages(config) else config.get("page_min_pixels") or used[0]
    return {
        "page_min_pixels": _int_or_none(low),
        "page_max_pixels": _int_or_none(config.get("page_max_pixels") or used[1]),
        "trainer_min_pixels": _int_or_none(meta.get("min_pixels")),
        "trainer_max_pixels": _int_or_none(meta.get("max_pixels")),
        "patch_size": _int_or_none(getattr(ip, "patch_size", None)),
        "merge_size": _int_or_none(getattr(ip, "merge_size", None)),
        "temporal_patch_size": _int_or_none(getattr(ip, "temporal_patch_size", None)),
        "processor_min_pixels": _int_or_none(_field(size, "shortest_edge") or _field(size, "min_pixels")
                                             or getattr(ip, "min_pixels", None)),
        "processor_max_pixels": _int_or_none(_field(size, "longest_edge") or _field(size, "max_pixels")
                                             or getattr(ip, "max_pixels", None)),
    }


def _token_text(processor: Any, tensors: Mapping[str, torch.Tensor]) -> dict[int, str]:
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None or not hasattr(tokenizer, "batch_decode") or "input_ids" not in tensors:
        return {}
    ids = torch.unique(tensors["input_ids"]).tolist()
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return dict(zip(ids, texts))


# --------------------------------------------------------------------------- reading


def load_rollout(path: str | Path) -> SavedBatch:
    """Read a saved batch (this format) or a pickled trainer DataProto; NotABatchError otherwise.

    Our own files load with `torch.load(weights_only=True)`. A pickled DataProto is unpickled
    in full (its classes, e.g. `verl.protocol.DataProto`, must be importable): only load trainer
    batches you trust.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if zipfile.is_zipfile(path):  # torch.save (or a plain pickle whose bytes hold a zip-like record)
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            data = _full_load(path, torch_file=True)
        except RuntimeError:  # not torch's zip after all (verl's `DataProto.save_to_disk` pickles)
            data = _full_load(path, torch_file=False)
    else:
        data = _full_load(path, torch_file=False)
    if isinstance(data, Mapping):
        if data.get("format") == FORMAT:
            return SavedBatch.from_dict(data)
        if "responses" in data and "image_grid_thw" in data:
            raise NotABatchError(
                f"{path} was saved by an older `vrag-rollout demo` without its images; run the demo again"
            )
        keys = sorted(map(str, data))[:8]
        raise NotABatchError(f"{path} holds a dict that is not a saved rollout batch (keys {keys})")
    return from_dataproto(data, source="dataproto")


def _full_load(path: Path, torch_file: bool) -> Any:
    try:
        if torch_file:
            try:
                return torch.load(path, map_location="cpu", weights_only=False)
            except RuntimeError:  # a plain pickle whose bytes hold a zip-like record: not torch's
                pass
        with open(path, "rb") as f:
            return pickle.load(f)
    except ModuleNotFoundError as e:
        raise NotABatchError(f"{path} is a pickle that needs the module {e.name!r}; install it to read it") from e
    except Exception as e:  # any unpickling failure means: not something we can read
        raise NotABatchError(
            f"{path} is not a saved rollout batch nor a pickled DataProto ({type(e).__name__}: {e})"
        ) from e
