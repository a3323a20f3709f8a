"""Detecting EasyR1's `verl` by its file layout (volcengine's PyPI `verl` has the same import name)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Optional

# Files that only EasyR1's `verl` has (volcengine's verl lays these out differently).
EASYR1_MARKER_FILES = (
    "protocol.py",
    "trainer/config.py",
    "trainer/main.py",
    "utils/dataset.py",
    "workers/fsdp_workers.py",
    "workers/reward/function.py",
    "workers/rollout/config.py",
    "workers/rollout/vllm_rollout_spmd.py",
)


class EasyR1NotAvailable(ImportError):
    """EasyR1's `verl` is not importable here (absent, or another package named `verl`)."""


def easyr1_location() -> Optional[Path]:
    """The directory of an importable EasyR1 `verl` package, or None.

    Looks at files only (nothing is imported), so it is cheap and safe next to volcengine's verl.
    """
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location)
        if all((root / marker).is_file() for marker in EASYR1_MARKER_FILES):
            return root
    return None


def require_easyr1() -> Path:
    """The EasyR1 package directory; raises `EasyR1NotAvailable` with the reason otherwise."""
    root = easyr1_location()
    if root is not None:
        return root
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        found = "no package named `verl` is installed"
    else:
        where = list(spec.submodule_search_locations or [spec.origin])
        found = f"the `verl` found at {where} is not EasyR1 (it lacks e.g. verl/workers/rollout/config.py)"
    raise EasyR1NotAvailable(
        "the EasyR1 integration needs hiyouga/EasyR1 (its package is also named `verl`); "
        f"{found}. Install EasyR1 (e.g. `pip install -e <EasyR1 checkout>`) in every Ray worker's "
        "environment; volcengine's `verl` from PyPI is a different project."
    )
