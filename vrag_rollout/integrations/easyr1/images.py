"""The actor's image inputs, per distinct image (replacement for `FSDPWorker._process_multi_modal_inputs`).

EasyR1 caches processed image inputs per `uid`, i.e. per prompt: the n samples of a prompt that
retrieved different pages would all get the first sample's pixels. Here each distinct image (by
content: a page entry's key, bytes, path or pixels) goes through the image processor once per
step, and a sample's inputs (`image_inputs.SharedImageInputs`) are its images' outputs, concatenated only
when the actor reads them for a micro-batch: the worker holds one `pixel_values` per distinct
page plus the micro-batch being computed, never a copy per sample. The image processor works on
each image on its own, so the concatenation equals its output for the sample's list (the tests
compare them bit for bit).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any, Callable, Optional, Sequence

from ..image_inputs import SharedImageInputs

_MM_KEYS = "vrag_mm_keys"
_MM_INPUTS = "vrag_mm_inputs"


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def image_fingerprint(image: Any) -> str:
    """A content key for one `multi_modal_data` entry (path, bytes, {"bytes"/"path"}, PIL, array).

    Unknown kinds get a fresh random key: never shared, never wrongly reused.
    """
    if isinstance(image, dict) and isinstance(getattr(image, "key", None), str):  # core.pages.PageEntry
        return "page:" + image.key
    if isinstance(image, (str, os.PathLike)):
        return "path:" + os.fspath(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return "bytes:" + _digest(bytes(image))
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return "bytes:" + _digest(bytes(image["bytes"]))
        if image.get("path"):
            return "path:" + str(image["path"])
    if hasattr(image, "tobytes") and hasattr(image, "mode") and hasattr(image, "size"):  # PIL
        return "pil:" + _digest(f"{image.mode}:{tuple(image.size)}".encode(), image.tobytes())
    if hasattr(image, "tobytes") and hasattr(image, "shape") and hasattr(image, "dtype"):  # numpy
        return "array:" + _digest(f"{image.dtype}:{tuple(image.shape)}".encode(), image.tobytes())
    return "opaque:" + uuid.uuid4().hex


def sample_cache_keys(multi_modal_data: Sequence[Any], uids: Optional[Sequence[Any]] = None) -> list:
    """One hashable key per sample: (uid or row, fingerprints of its images, of its videos).

    Samples of one prompt that hold the same images share a key (processed once, as EasyR1's
    per-uid cache intends); samples whose retrieved pages differ get their own.
    """
    memo: dict = {}  # id -> fingerprint; n copies of one prompt usually share objects

    def fingerprint(item: Any) -> str:
        key = id(item)
        if key not in memo:
            memo[key] = (item, image_fingerprint(item))  # keep item alive so ids are not reused
        return memo[key][1]

    keys = []
    for row, data in enumerate(multi_modal_data):
        data = data or {}
        images = tuple(fingerprint(x) for x in (data.get("images") or ()))
        videos = tuple(fingerprint(x) for x in (data.get("videos") or ()))
        owner = uids[row] if uids is not None else row
        keys.append((str(owner), images, videos))
    return keys


def build_multi_modal_inputs(multi_modal_data: Sequence[Any], keys: Sequence[Any], processor: Any,
                             process_image: Callable, process_video: Callable,
                             min_pixels: Optional[int], max_pixels: Optional[int],
                             video_fps: float) -> list:
    """Image-processor inputs per sample: each distinct image processed once (samples share the
    outputs; `keys` from `sample_cache_keys`), videos per distinct sample as EasyR1 does."""
    per_image: dict = {}  # fingerprint -> the processor's outputs for that image alone
    done: dict = {}
    out = []
    for data, key in zip(multi_modal_data, keys):
        if key not in done:
            data = data or {}
            images = list(data.get("images") or ())
            if images:
                for image, fingerprint in zip(images, key[1]):
                    if fingerprint not in per_image:
                        pixels = process_image(image, min_pixels, max_pixels)
                        per_image[fingerprint] = dict(processor.image_processor(images=[pixels], return_tensors="pt"))
                done[key] = SharedImageInputs([per_image[fingerprint] for fingerprint in key[1]])
            elif data.get("videos"):
                videos = [process_video(x, min_pixels, max_pixels, video_fps) for x in data["videos"]]
                done[key] = dict(processor.image_processor(images=None, videos=videos, return_tensors="pt"))
            else:
                done[key] = {}
        out.append(done[key])
    return out


def process_multi_modal_inputs_per_sample(self: Any, data: Any) -> None:
    """Replacement for `FSDPWorker._process_multi_modal_inputs` (same inputs and outputs)."""
    import numpy as np
    from verl.utils.dataset import process_image, process_video

    columns = data.non_tensor_batch
    if "multi_modal_data" not in columns:
        return
    multi_modal_data = columns["multi_modal_data"]
    keys = sample_cache_keys(multi_modal_data, columns.get("uid"))
    if self._cache.get(_MM_KEYS) != keys:
        meta = data.meta_info
        try:
            bands = meta["min_pixels"], meta["max_pixels"], meta["video_fps"]
        except KeyError as missing:
            raise KeyError(
                f"meta_info lacks {missing}: the rollout must return the generation batch's "
                "meta_info (min_pixels, max_pixels, video_fps) unchanged"
            ) from None
        inputs = build_multi_modal_inputs(multi_modal_data, keys, self.processor, process_image,
                                          process_video, *bands)
        array = np.empty(len(inputs), dtype=object)
        array[:] = inputs
        self._cache[_MM_KEYS] = keys
        self._cache[_MM_INPUTS] = array
    columns["multi_modal_inputs"] = self._cache[_MM_INPUTS]


