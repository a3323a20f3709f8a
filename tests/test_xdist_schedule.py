"""The suite's pytest-xdist units (tests/xdist_schedule.py): whole modules, a module split by the
background readers moved last is two units, and a named unit gathers its tests from any module.
(`make test` runs the suite on these units: a unit sent twice or lost would show there as a test
run twice or never.)"""

from __future__ import annotations

from tests.xdist_schedule import module_runs


def test_a_module_is_one_unit_until_its_tests_split():
    units = module_runs(["a.py::t1", "a.py::t2[x]", "b.py::u", "a.py::t3", "c.py::v"])
    assert units == {"a.py::t1": "a.py#0", "a.py::t2[x]": "a.py#0", "b.py::u": "b.py#0",
                     "a.py::t3": "a.py#1", "c.py::v": "c.py#0"}


def test_a_named_unit_gathers_its_tests_from_every_module():
    named = {"a.py::t1": "released-shape", "b.py::u[qwen3-vl]": "released-shape"}
    units = module_runs(["a.py::t1", "a.py::t2", "b.py::u[qwen3-vl]", "b.py::w"], named)
    assert units["a.py::t1"] == units["b.py::u[qwen3-vl]"] == "@released-shape"
    assert units["a.py::t2"] == "a.py#0" and units["b.py::w"] == "b.py#0"
