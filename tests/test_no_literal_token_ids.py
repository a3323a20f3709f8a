"""No project module names a token by its number: ids are looked up by name (the compact tiny
models put every special token at an id that is not the released one, so a hard-coded id fails
their tests; this scan fails it before any test runs).

Flagged: an integer literal in the released special-token range anywhere outside the builder's
table of released traits, and a comparison of a token-ish name (`*token*`, `*_id`, `*_ids`, `ids`)
with an integer literal other than -1, 0 or 1 (`x == 151655`, `tok in (151643, 151645)`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vrag_rollout", "retriever_server")
RELEASED_ID_RANGE = range(151643, 152065)  # <|endoftext|> ... the widest released vocabulary
# The builder's record of the released checkpoints: ids and widths are its subject.
RELEASED_TRAITS = {"vrag_rollout/devkit/tiny_families.py", "vrag_rollout/devkit/tiny_model.py"}


def _int_literals(node: ast.AST) -> list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in _int_literals(element)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return [-value for value in _int_literals(node.operand)]
    return []


def _is_token_name(word: str) -> bool:
    word = word.lower()
    return "token" in word or word.endswith(("_id", "_ids")) or word == "ids"


def _names(node: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))]


def literal_token_ids(source: str, allow_released_range: bool = False) -> list[str]:
    """Each place in `source` that names a token by number, as 'line: code'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (not allow_released_range and isinstance(node, ast.Constant) and type(node.value) is int
                and node.value in RELEASED_ID_RANGE):
            found.append(f"{node.lineno}: {node.value}")
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [value for operand in operands for value in _int_literals(operand)]
            if any(abs(value) > 1 for value in literals) and any(
                    _is_token_name(word) for operand in operands for word in _names(operand)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("planted", [
    "if token_id == 151655:\n    pass",
    "stop = [t for t in ids if t in (151643, 151645)]",
    "if output.token_ids[-1] == 801:\n    pass",
    "PAD = 151655",
    "done = self.eos_token_id != 799",
])
def test_the_scan_finds_a_planted_literal_id(planted):
    assert literal_token_ids(planted)


@pytest.mark.parametrize("fine", [
    "if token_id == tokenizer.convert_tokens_to_ids('<|image_pad|>'):\n    pass",
    "if len(token_ids) == 0 or token_ids[0] == -1:\n    pass",
    "if turn_count > 8:\n    pass",
])
def test_the_scan_leaves_lookups_by_name_alone(fine):
    assert not literal_token_ids(fine)


def test_no_project_module_names_a_token_by_number():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            found += [f"{name}:{place}" for place in literal_token_ids(path.read_text(), name in RELEASED_TRAITS)]
    assert not found, "token ids must be looked up by name:\n" + "\n".join(found)
