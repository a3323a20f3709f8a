"""Keeping the ranks of a tensor-parallel group in lockstep: one rank talks to the retriever.

Under EasyR1 every rank of a tensor-parallel group runs its own copy of the rollout loop over one
collectively synchronized vLLM engine (`external_launcher`), so every rank must hand the engine
identical requests at identical steps. Whatever a rank observes on its own (a retriever answer, a
timeout on that rank only, whether a background call happens to be done at this instant) would
make the ranks' episodes diverge and the collective engine hang or mix them up.

Contract: `share(compute)` runs `compute()` on the group's source rank only and returns its result
on every rank, or raises its exception on every rank (any `BaseException`: an interrupt on the
source still reaches the broadcast, so every rank leaves together). The schedules route every retriever
outcome, and every "is the tool result in yet?" decision, through it, so each rank's episodes
are a function of the source rank's observations alone. Outcomes are broadcast raw (pages as
the retriever sent them: JPEG bytes or base64); each rank decodes them itself, which is
deterministic.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")


class LocalSync:
    """One process (or tensor_parallel_size 1): nothing to agree on."""

    is_source = True
    is_local = True  # every decision is this process's own

    def share(self, compute: Callable[[], T]) -> T:
        return compute()


class GroupSync:
    """Broadcast from the source rank over a torch.distributed CPU (gloo) process group."""

    is_local = False

    def __init__(self, group: Any, source_rank: int):
        import torch.distributed as dist

        self.group = group
        self.source_rank = int(source_rank)  # a global rank
        self.is_source = dist.get_rank() == self.source_rank

    def share(self, compute: Callable[[], T]) -> T:
        import torch.distributed as dist

        payload: list = [None]
        error: Optional[BaseException] = None
        if self.is_source:
            try:
                payload[0] = ("ok", compute())
            except BaseException as raised:  # KeyboardInterrupt and SystemExit too: every rank
                error = raised  # raises it, so none waits forever on the others
                payload[0] = ("error", portable(raised))
        dist.broadcast_object_list(payload, src=self.source_rank, group=self.group)
        status, value = payload[0]
        if error is not None:
            raise error  # the source raises its own exception, traceback included
        if status == "error":
            raise value
        return value


def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling (the broadcast pickles it), else a RuntimeError naming it:
    an exception the source cannot send would leave the other ranks waiting."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(error).__name__} on the source rank: {error}")


def sync_for(tensor_parallel_size: int) -> Optional[GroupSync]:
    """The tensor-parallel group of this process (vLLM's, CPU side), or None when there is none:
    tensor_parallel_size 1, or torch.distributed not initialized (a single process)."""
    import torch.distributed as dist

    if int(tensor_parallel_size) <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    return GroupSync(group.cpu_group, source_rank=group.ranks[0])
