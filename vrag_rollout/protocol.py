"""A minimal DataProto for standalone use.

The rollout accepts whatever DataProto class the trainer passes (EasyR1's, verl's) and returns
an instance of that same class; this one only exists so the package works without a trainer. It
keeps the shared shape: a TensorDict `batch`, a dict of numpy object arrays `non_tensor_batch`
and a `meta_info` dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from tensordict import TensorDict


@dataclass
class DataProto:
    batch: Optional[TensorDict] = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        size = len(self)
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array, got {type(value).__name__}")
            if len(value) != size:
                raise ValueError(f"non_tensor_batch[{key!r}] has {len(value)} rows, the batch has {size}")

    @classmethod
    def from_dict(cls, tensors: Optional[dict] = None, non_tensors: Optional[dict] = None,
                  meta_info: Optional[dict] = None) -> "DataProto":
        tensors = tensors or {}
        batch = None
        if tensors:
            size = next(iter(tensors.values())).shape[0]
            batch = TensorDict(dict(tensors), batch_size=[size])
        non_tensors = {k: object_array(v) for k, v in (non_tensors or {}).items()}
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row `repeat_times` times: adjacent copies (interleave) or whole-batch copies."""
        batch = None
        if self.batch is not None:
            tensors = {}
            for key, value in self.batch.items():
                tensors[key] = (
                    value.repeat_interleave(repeat_times, dim=0)
                    if interleave
                    else value.repeat(repeat_times, *[1] * (value.dim() - 1))
                )
            batch = TensorDict(tensors, batch_size=[len(self) * repeat_times])
        non_tensors = {
            key: np.repeat(value, repeat_times, axis=0) if interleave else np.tile(value, repeat_times)
            for key, value in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(self.meta_info))

    def union(self, other: "DataProto") -> "DataProto":
        """Merge another batch of the same size; shared keys must hold equal values."""
        if len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        tensors = dict(self.batch.items()) if self.batch is not None else {}
        for key, value in (other.batch.items() if other.batch is not None else []):
            if key in tensors and not torch.equal(tensors[key], value):
                raise ValueError(f"union: tensor {key!r} differs between the two batches")
            tensors[key] = value
        non_tensors = dict(self.non_tensor_batch)
        for key, value in other.non_tensor_batch.items():
            if key in non_tensors and not _equal_objects(non_tensors[key], value):
                raise ValueError(f"union: non-tensor {key!r} differs between the two batches")
            non_tensors[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and self.meta_info[key] != value:
                raise ValueError(f"union: meta_info {key!r} differs between the two batches")
        batch = TensorDict(tensors, batch_size=[len(self)]) if tensors else None
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info={**self.meta_info, **other.meta_info})


def object_array(values: Any) -> np.ndarray:
    """A 1-D numpy object array (np.array would turn equal-length lists into a 2-D array)."""
    if isinstance(values, np.ndarray):
        return values
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _equal_objects(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b))


def _deep_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b))
    result = a == b
    return bool(result.all()) if isinstance(result, np.ndarray) else bool(result)
