"""The trainer's image inputs, one copy per distinct image, shared by every sample that shows it.

A Qwen VL image processor works on each image on its own: its outputs for a sample's list of
images are each image's outputs stacked (`pixel_values` rows, `image_grid_thw` rows; the tests
compare the two bit for bit). So a batch needs the processor once per distinct page, not once
per sample, and a sample needs its `pixel_values` only while a micro-batch computes on it.

- `SharedImageInputs`: one sample's image-processor outputs. It is the dict the trainers read
  (`items()`, `keys()`, `get`, `in`, `pop`: EasyR1's `batch_collate`, verl's
  `extract_multi_modal_inputs` and position-id code), but the per-image keys are its images'
  shared outputs, concatenated on each read. Pickled (Ray's hand-off), the shared outputs go
  once per pickle, not once per sample.
- `OncePerImage`: an image processor standing in for the processor's own, running it once per
  distinct image (by identity, for as long as the image lives) and answering a call on a list
  with the stacked outputs, exactly what the processor would have returned.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import MutableMapping
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch


class SharedImageInputs(MutableMapping, dict):
    """One sample's image inputs: `parts` (per image, shared) stacked on read, plus `extra` keys
    held as they are (e.g. verl's `images_seqlens`). A dict (numpy keeps it as one object, and
    pydantic and `**` accept it) whose every method goes through the stacking; it compares by
    identity (comparing would concatenate pixels)."""

    def __init__(self, parts: Sequence[Mapping[str, Any]], extra: Optional[Mapping[str, Any]] = None):
        dict.__init__(self, extra or {})
        self._parts = list(parts)
        self._stacked = [name for name in (self._parts[0] if self._parts else ()) if not dict.__contains__(self, name)]

    @property
    def parts(self) -> list:
        """Per image, its outputs (shared with every sample that shows it)."""
        return self._parts

    def __getitem__(self, name: str) -> Any:
        if name in self._stacked:
            return stack(self._parts, (name,))[name]
        return dict.__getitem__(self, name)

    def __setitem__(self, name: str, value: Any) -> None:
        if name in self._stacked:
            self._stacked.remove(name)
        dict.__setitem__(self, name, value)

    def __delitem__(self, name: str) -> None:
        if name in self._stacked:
            self._stacked.remove(name)
        else:
            dict.__delitem__(self, name)

    def __contains__(self, name: object) -> bool:
        return name in self._stacked or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._stacked + list(dict.keys(self)))

    def __len__(self) -> int:
        return len(self._stacked) + dict.__len__(self)

    # dict's own (C) methods read its storage only: these go through the mapping above
    keys, items, values, get = MutableMapping.keys, MutableMapping.items, MutableMapping.values, MutableMapping.get
    pop, popitem, clear = MutableMapping.pop, MutableMapping.popitem, MutableMapping.clear
    update, setdefault = MutableMapping.update, MutableMapping.setdefault

    def copy(self) -> "SharedImageInputs":
        return SharedImageInputs._restore(self._parts, self._stacked, dict(dict.items(self)))

    @staticmethod
    def _restore(parts: list, stacked: list, extra: dict) -> "SharedImageInputs":
        inputs = SharedImageInputs((), extra)
        inputs._parts, inputs._stacked = list(parts), list(stacked)
        return inputs

    def __reduce__(self) -> tuple:
        return SharedImageInputs._restore, (self._parts, self._stacked, dict(dict.items(self)))

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"SharedImageInputs({len(self._parts)} images, keys {list(self)})"


def stack(parts: Sequence[Mapping[str, Any]], names: Optional[Sequence[str]] = None) -> dict:
    """Per-image outputs stacked as the processor stacks a list's (all names, or `names`)."""
    return {name: torch.cat([torch.as_tensor(part[name]) for part in parts], dim=0) for name in (names or parts[0])}


class OncePerImage:
    """`processor.image_processor`, run once per distinct image object and settings (module
    docstring). Thread-safe; an image's outputs are dropped when the image is garbage-collected.
    Calls with videos or nested image lists go to the processor as they are.
    """

    def __init__(self, image_processor: Any):
        self.inner = self.__wrapped__ = image_processor  # `__wrapped__`: the wrapper convention readers unwrap by
        self._outputs: dict[tuple[int, str], Mapping[str, Any]] = {}
        self._lock = threading.Lock()
        self._calls = threading.local()  # per thread: the per-image outputs of its last call
        self.processed = 0  # images the wrapped processor ran on

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "__wrapped__", "_outputs", "_lock", "_calls"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    # A copy or a pickle is a fresh wrapper of the processor (the transformers processor deep-copies
    # its attributes to serialize itself); the outputs computed so far stay with this one.
    def __reduce__(self) -> tuple:
        return OncePerImage, (self.inner,)

    def __deepcopy__(self, memo: dict) -> "OncePerImage":
        return OncePerImage(copy.deepcopy(self.inner, memo))

    def __call__(self, images: Any = None, *args: Any, videos: Any = None, **kwargs: Any) -> Any:
        flat = images if isinstance(images, (list, tuple)) else None
        if args or videos is not None or not flat or any(isinstance(image, (list, tuple)) for image in flat):
            self._calls.parts = None
            if videos is not None:  # an image processor without a `videos` argument refuses the name
                kwargs["videos"] = videos
            return self.inner(images, *args, **kwargs)
        from transformers.feature_extraction_utils import BatchFeature

        settings = repr(sorted((name, value) for name, value in kwargs.items() if name != "return_tensors"))
        parts = [self._outputs_for(image, settings, kwargs) for image in flat]
        self._calls.parts = parts
        return BatchFeature(data=stack(parts), tensor_type=kwargs.get("return_tensors"))

    def forget_last(self) -> None:
        """Forget this thread's last call (before a call that may not reach the image processor)."""
        self._calls.parts = None

    def last_parts(self) -> Optional[list]:
        """The per-image outputs of this thread's last call (None: it went to the processor whole)."""
        return getattr(self._calls, "parts", None)

    def _outputs_for(self, image: Any, settings: str, kwargs: dict) -> Mapping[str, Any]:
        key = (id(image), settings)
        with self._lock:
            known = self._outputs.get(key)
        if known is not None:
            return known
        out = self.inner(images=[image], **{**kwargs, "return_tensors": "pt"})
        outputs = {name: out[name] for name in out.keys()}
        try:  # forgotten with the image: an id is reused only after its object is gone
            weakref.finalize(image, self._forget, key)
        except TypeError:  # cannot be weakly referenced: not kept, so no stale id
            return outputs
        with self._lock:
            if key not in self._outputs:
                self._outputs[key] = outputs
                self.processed += 1
            return self._outputs[key]

    def _forget(self, key: tuple[int, str]) -> None:
        with self._lock:
            self._outputs.pop(key, None)
