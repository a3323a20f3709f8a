"""How pytest-xdist hands out this suite's tests: by module, in collection order.

A module is one unit of work, as in xdist's `loadscope`: its module-scoped fixtures are rollouts
or engine runs, and a module split between workers would run them twice. Units go out in
collection order (not largest first): tests/conftest.py moves the tests that read background work
to the end, so they come after the work has had the whole session to run. A module whose tests
that move split into two runs (some read the work, some do not) is two units, the later one
handed out at the end. A test given a named unit (the released-shape engines' tests,
tests/conftest.py) belongs to that unit instead, whatever its module: the workers publish the
names beside their temporary directories when they have collected, and the scheduler (in the
controller, which collects nothing) reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

NAMED_UNITS = "xdist-named-units.json"


def publish_named_units(config, named: dict[str, str]) -> None:
    """A worker's {nodeid: unit name}, for the controller's scheduler (every worker collects the
    same tests, so each writes the same file)."""
    path = config._tmp_path_factory.getbasetemp().parent / NAMED_UNITS
    tmp = path.with_name(f"{NAMED_UNITS}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(named))
    os.replace(tmp, path)


def _read_named_units(config) -> dict[str, str]:
    try:
        return json.loads((Path(config._tmp_path_factory.getbasetemp()) / NAMED_UNITS).read_text())
    except (OSError, ValueError):
        return {}


def module_runs(nodeids: list[str], named: dict[str, str] | None = None) -> dict[str, str]:
    """nodeid -> its unit: its name in `named`, else the module numbered by the module's runs in
    `nodeids` (`a.py#0`...)."""
    named = named or {}
    units, runs, previous = {}, {}, None
    for nodeid in nodeids:
        if nodeid in named:
            units[nodeid] = f"@{named[nodeid]}"
            continue
        module = nodeid.split("::", 1)[0]
        if module != previous:
            runs[module] = runs.get(module, -1) + 1
            previous = module
        units[nodeid] = f"{module}#{runs[module]}"
    return units


class ModuleRunScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False  # collection order: background readers last
        self._units: dict[str, str] = {}

    def schedule(self) -> None:
        if self.collection is None and self.registered_collections:
            collection = list(next(iter(self.registered_collections.values())))
            self._units = module_runs(collection, _read_named_units(self.config))
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        return self._units.get(nodeid) or super()._split_scope(nodeid)
