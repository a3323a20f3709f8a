"""Installing the patches in a process, now or when their EasyR1 module is first imported.

`install_agent_rollout()` patches (all idempotent, each keyed to an EasyR1 name):
`verl.workers.fsdp_workers` (rollout dispatcher, per-sample image cache), `verl.protocol`
(generation pop), `verl.workers.reward.function` (reward view, placement, metrics),
`verl.trainer.core_algos` (REINFORCE++ returns that skip observations), `verl.utils.dataset`
(tool schemas in the prompts of tool_call runs) and `verl.trainer.ray_trainer` (the live guard's
`guard/` metrics, `guard.py`; a context policy's segment rows, `segments.py`). With `lazy=True` a
module not imported yet is patched right after its first import (a meta-path finder wraps its
loader), so processes that never import it (reward actors, idle Ray workers) do not pay for
importing vLLM. `worker_setup_hook` is what Ray runs in every worker process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any, Callable

from .common import lock
from .detect import require_easyr1
from . import segments, turn_estimators
from .estimators import patch_core_algos
from .generation_pop import patch_protocol
from .prompt_tools import patch_dataset
from .reward_manager import patch_reward
from .rollout_adapter import patch_fsdp_workers


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies a patch right after a target module is first executed."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = PatchingLoader(spec.loader, patch)
        return spec


class PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def patch_trainer_metrics(module: Any) -> dict:
    """The guard's metrics patch, imported when the trainer module is (it loads torch)."""
    from .guard import patch_trainer_metrics as patch

    return patch(module)


def install_agent_rollout(*, rollout: bool = True, multi_modal_cache: bool = True,
                          generation_columns: bool = True, reward_view: bool = True,
                          estimators: bool = True, prompt_tools: bool = True, guard_metrics: bool = True,
                          segment_rows: bool = True, lazy: bool = False) -> dict:
    """Patch EasyR1 in this process (idempotent). Returns {patch name: newly installed?}.

    Must run in every Ray worker process: use `make_runtime_env()` with `ray.init` (the hook),
    or call it at the top of your own worker code. With `lazy=True`, modules not imported yet
    are patched when they are first imported (a patch then reports False until that happens).
    Raises `EasyR1NotAvailable` without EasyR1.
    """
    require_easyr1()
    targets = {}
    if rollout or multi_modal_cache:
        targets["verl.workers.fsdp_workers"] = lambda m: patch_fsdp_workers(m, rollout, multi_modal_cache)
    if generation_columns:
        targets["verl.protocol"] = patch_protocol
    if reward_view:
        targets["verl.workers.reward.function"] = patch_reward
    if estimators:  # and the turn-level estimators (turn_estimators.py)
        targets["verl.trainer.core_algos"] = lambda m: {**patch_core_algos(m), **turn_estimators.patch_core_algos(m)}
    if prompt_tools:
        targets["verl.utils.dataset"] = patch_dataset
    if guard_metrics or estimators or segment_rows:
        targets["verl.trainer.ray_trainer"] = lambda m: {**(patch_trainer_metrics(m) if guard_metrics else {}),
                                                         **(turn_estimators.patch_ray_trainer(m) if estimators else {}),
                                                         **(segments.patch_ray_trainer(m) if segment_rows else {})}
    done: dict = {}
    deferred = {}
    with lock:
        for name, patch in targets.items():
            if lazy and name not in sys.modules:
                deferred[name] = patch
            else:
                done.update(patch(importlib.import_module(name)))
        if deferred:
            finder = next((f for f in sys.meta_path if isinstance(f, PatchOnImport)), None)
            if finder is None:
                sys.meta_path.insert(0, PatchOnImport(deferred))
            else:
                finder.patches.update(deferred)
    return done


def worker_setup_hook() -> None:
    """Ray `worker_process_setup_hook`: runs in each worker process before any task."""
    install_agent_rollout(lazy=True)
