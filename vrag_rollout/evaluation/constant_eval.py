"""Python's `eval` of an answer, limited to constants and constant arithmetic. Pure; runs no code.

MMLongBench-Doc (a list answer) and LongDocURL (every answer) read the answer with Python's `eval`
before scoring it, so "2019-2020" scores as the integer -1 and "1/2" as 0.5 there. Model output
is never run here: `evaluate(text)` walks the text's syntax tree and computes what `eval(text)`
gives when the tree holds only

- constants (numbers, strings, bytes, True, False, None, `...`);
- tuples, lists, sets and dicts of those (no `*` or `**` unpacking);
- the unary operators `+ - ~ not` and the binary operators `+ - * / // % ** << >> & | ^` applied
  to numbers (bool, int, float, complex), with Python's own results and errors;
- comparisons (`== != < <= > >= in`, `not in`, chained) and `and` / `or` (short-circuit) of those.

It raises `NotEvaluated` for everything else: a text `eval` rejects as well (a syntax error, an
unknown name, a division by zero, an unhashable set item) and a text `eval` would run but this
reader does not (a call, a builtin's name, a subscript, an attribute, `is`, a conditional
expression, an f-string, arithmetic on strings, or an integer result over `MAX_INT_BITS` bits,
which guards against "9**9**9"). The callers read an answer that raises as its text, as the
published scripts do when `eval` fails; docs/evaluation.md lists what that leaves different.

As `eval` does, leading spaces and tabs are ignored.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

# Integer results stay below Python's default int-to-text limit (4,300 digits, ~14,284 bits), so
# the scorers can always print them.
MAX_INT_BITS = 14_000

NUMBER = (bool, int, float, complex)
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert, ast.Not: operator.not_}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
          ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
          ast.BitOr: operator.or_, ast.BitXor: operator.xor}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}


class NotEvaluated(ValueError):
    """The text is not a constant expression this reader evaluates (module docstring)."""


def evaluate(text: str) -> Any:
    """The value `eval(text)` gives, for a constant expression (module docstring)."""
    try:
        tree = ast.parse(text.lstrip(" \t"), mode="eval")
        return _value(tree.body)
    except NotEvaluated:
        raise
    except (SyntaxError, ValueError, TypeError, ArithmeticError, MemoryError, RecursionError) as error:
        raise NotEvaluated(f"{type(error).__name__}: {error}") from None


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(item) for item in node.elts]  # a Starred item is refused by _value
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):  # {**other}
            raise NotEvaluated("dict unpacking")
        return {_value(key): _value(value) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_number(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _number(node.left), _number(node.right)
        _check_size(node.op, left, right)
        return BINARY[type(node.op)](left, right)
    if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
        return _compare(node)
    if isinstance(node, ast.BoolOp):
        return _boolean(node)
    raise NotEvaluated(f"not a constant expression: {type(node).__name__}")


def _compare(node: ast.Compare) -> bool:
    left = _value(node.left)
    for op, right_node in zip(node.ops, node.comparators):  # a chain stops at its first false link
        right = _value(right_node)
        if not COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _boolean(node: ast.BoolOp) -> Any:
    value = None
    for operand in node.values:  # short-circuit: later operands are not evaluated, as in eval
        value = _value(operand)
        if bool(value) is isinstance(node.op, ast.Or):
            return value
    return value


def _number(node: ast.AST) -> Any:
    value = _value(node)
    if not isinstance(value, NUMBER):
        raise NotEvaluated(f"arithmetic on {type(value).__name__}")
    return value


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse the integer operations whose result would pass MAX_INT_BITS, before computing them."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float and complex results overflow on their own (OverflowError) or stay small
    bits = abs(left).bit_length()
    if isinstance(op, ast.Pow) and right > 0 and bits > 1 and right * math.log2(abs(left)) + 1 > MAX_INT_BITS:
        raise NotEvaluated("integer power too large")
    if isinstance(op, ast.Mult) and bits + abs(right).bit_length() > MAX_INT_BITS:
        raise NotEvaluated("integer product too large")
    if isinstance(op, ast.LShift) and right > 0 and left and bits + right > MAX_INT_BITS:
        raise NotEvaluated("integer shift too large")


__all__ = ["MAX_INT_BITS", "NotEvaluated", "evaluate"]
