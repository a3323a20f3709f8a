"""The constant-expression reader: what Python's `eval` gives on constant arithmetic, nothing run.

The expected values come from `eval` itself, applied to this file's own texts (never to model
output), so the reader is checked against the very function the published scripts call.
"""

from __future__ import annotations

import time

import pytest

from vrag_rollout.evaluation.constant_eval import MAX_INT_BITS, NotEvaluated, evaluate

AS_EVAL = [
    "3", " 3", "\t-3", "3.0", "1e400", "3j", "'a'", "'a' 'b'", "b'x'", "True", "None", "...",
    "2019-2020", "1/2", "7//2", "7 % 3", "2**10", "2**-1", "10**-5000", "-2**2", "(-8)**0.5", "~5", "not 0",
    "-True", "2^3", "1 << 10", "6 & 3", "6 | 3", "1,000", "1500, 8000", "(1, 2)", "[1/2, 3]",
    "[2019-2020, 'a', [1, (2,)]]", "{1, 2}", "{1: 'a', True: 'b'}", "{'a': [1, 2]}", "1 > 1e3", "1 < 2 < 3",
    "1 < 3 < 2", "0 and 1/0", "1 or 1/0", "'a' in 'abc'", "2 not in [1]", "()", "[]", "{}",
]

REFUSED = [
    "max(1, 2)", "__import__('os').system('true')", "x", "print", "[1, 2][0]", "'a'.upper()", "1 if 1 else 2",
    "f'{1}'", "'a' + 'b'", "'a' * 3", "[1] * 3", "lambda: 1", "[x for x in ()]", "[*()]", "{**{}}", "1 is 1",
    "9**9**9", "2**20000", "7**7**7", "1 << 20000", "(1 << 13000) * (1 << 13000)",  # guarded sizes
    "1/0", "0**-1", "1 << -1", "{[1]}", "1 in 5", "2.0**100000",  # errors eval raises as well
    "3 kg", "10%", "Not answerable", "", "[1, 2", "(" * 300 + ")" * 300,  # not expressions
]


@pytest.mark.parametrize("text", AS_EVAL)
def test_constant_expressions_evaluate_as_eval_does(text):
    expected = eval(text)  # this file's own constant texts, never model output
    found = evaluate(text)
    assert found == expected or (found != found and expected != expected)
    assert type(found) is type(expected)


@pytest.mark.parametrize("text", REFUSED)
def test_anything_else_is_refused(text):
    with pytest.raises(NotEvaluated):
        evaluate(text)


def test_the_size_guard_answers_at_once_and_lets_large_values_through():
    start = time.monotonic()
    for text in ("9**9**9", "2**10**10", "10**10**10**10"):
        with pytest.raises(NotEvaluated):
            evaluate(text)
    assert time.monotonic() - start < 0.5
    big = evaluate("2**13000")
    assert big == 2 ** 13000 and big.bit_length() <= MAX_INT_BITS and str(big)  # printable
