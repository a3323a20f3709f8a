"""Each benchmark's answer scoring on hand-worked cases from its published definition.

Expected numbers are worked out by hand from the published rules (the arithmetic is in the
comments), never by calling the code under test a second way.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from vrag_rollout.data.sources import SOURCE_FORMATS
from vrag_rollout.evaluation.scorers import SCORERS, scorer_for
from vrag_rollout.evaluation.scorers.vidoseek import with_verdict

MMLB = scorer_for("mmlongbench-doc")
LDU = scorer_for("longdocurl")
SVQA = scorer_for("slidevqa")
VIDO = scorer_for("vidoseek")


def mmlb(prediction, reference, answer_format, answerable=True):
    return MMLB.score(prediction, reference, answer_format, answerable)["accuracy"]


def ldu(prediction, reference, answer_format):
    return LDU.score(prediction, reference, answer_format)["accuracy"]


# ---- the common interface

def test_every_project_set_has_a_scorer_and_an_unknown_one_is_refused():
    assert set(SCORERS) == set(SOURCE_FORMATS) | {"questions"}  # your own questions: converted without --from
    with pytest.raises(ValueError, match="docvqa"):
        scorer_for("docvqa")


@pytest.mark.parametrize("name, answer_format", [("vidoseek", None), ("slidevqa", None), ("mmdocir", None),
                                                 ("mmlongbench-doc", "Str"), ("longdocurl", "String")])
def test_a_missing_answer_scores_zero_and_is_counted(name, answer_format):
    scorer = scorer_for(name)
    row = scorer.score(None, "Berlin", answer_format, True, question="Where?")
    assert row["accuracy"] == 0.0 and row["answered"] == 0.0
    assert all(value == 0.0 for key, value in row.items() if key in ("accuracy", "f1", "contains"))
    total = scorer.aggregate([scorer.score("Berlin", "Berlin", answer_format, True), row])
    assert (total["accuracy"], total["count"], total["unanswered"]) == (0.5, 2.0, 1.0)
    assert scorer.aggregate([])["count"] == 0.0 and scorer.aggregate([])["accuracy"] == 0.0


def test_mmdocir_gets_the_generic_squad_scorer():
    scorer = scorer_for("mmdocir")
    assert scorer.score("The U.S.A.", "usa")["accuracy"] == 1.0  # articles and ASCII punctuation dropped
    # "red blue" vs "red": P = 1/2, R = 1, F1 = 2 * 1/2 * 1 / (3/2) = 2/3
    row = scorer.score("red, blue", "red")
    assert row["accuracy"] == 0.0 and row["f1"] == pytest.approx(2 / 3)


def imported_modules(path: Path, root: Path) -> set[str]:
    """The modules a file imports, relative imports resolved against its package."""
    package = list(path.relative_to(root).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            found.add(".".join(base + ([node.module] if node.module else [])))
    return found


def test_the_evaluation_package_imports_only_the_standard_library_and_core():
    root = Path(__file__).resolve().parents[2]
    for path in (root / "vrag_rollout" / "evaluation").rglob("*.py"):
        for name in imported_modules(path, root):
            allowed = (name.split(".")[0] in sys.stdlib_module_names
                       or name.startswith(("vrag_rollout.core", "vrag_rollout.evaluation")))
            assert allowed, f"{path.relative_to(root)} imports {name}"


def test_the_import_check_can_fail(tmp_path):
    module = tmp_path / "vrag_rollout" / "evaluation" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("from ..engine import llm\nimport numpy\nfrom .scorers import base\n")
    assert imported_modules(module, tmp_path) == {"vrag_rollout.engine", "numpy", "vrag_rollout.evaluation.scorers"}


# ---- MMLongBench-Doc (eval/eval_score.py)

@pytest.mark.parametrize("prediction, expected", [
    ("8", 1.0), (" 8 ", 1.0),
    ("8.0", 1.0),      # int(float("8.0")) == 8
    ("8.7", 1.0),      # int(float("8.7")) truncates to 8: as published
    ("eight", 0.0),    # no number words in MMLongBench-Doc
    ("1,008", 0.0), ("", 0.0), ("nan", 0.0), ("inf", 0.0),
])
def test_mmlongbench_int(prediction, expected):
    assert mmlb(prediction, "8", "Int") == expected


@pytest.mark.parametrize("prediction, expected", [
    ("101", 1.0),     # |101 - 100| = 1 <= 0.01 * max(100, 101) = 1.01
    ("99", 1.0),      # |99 - 100| = 1 <= 0.01 * 100 = 1.00: the edge, inside
    ("98.99", 0.0),   # 1.01 > 1.00; rounded to max(min(2, 1), 2) = 2 decimals 98.99 != 100.0
    ("101.02", 0.0),  # 1.02 > 1.0102; 101.02 != 100.0 at 2 decimals
    ("$100", 1.0), ("100%", 1.0),
    ("about 100", 0.0),
])
def test_mmlongbench_float_tolerance(prediction, expected):
    assert mmlb(prediction, "100", "Float") == expected


def test_mmlongbench_float_rounding_and_percentages():
    # 0.104 vs 0.1: not within 1 % (0.004 > 0.00104) but both round to 0.10 at 2 decimals
    assert mmlb("0.104", "0.1", "Float") == 1.0
    assert mmlb("0.106", "0.1", "Float") == 0.0  # rounds to 0.11
    # reference "21%" is 21.0; it matches 21, 21 / 100 = 0.21 and 21 * 100 = 2100
    assert [mmlb(p, "21%", "Float") for p in ("21", "21%", "0.21", "2100", "0.25")] == [1, 1, 1, 1, 0]


def test_mmlongbench_str_anls_and_its_threshold():
    # cleaned "berlin school" (13 chars) vs "berlin schol": one deletion, ANLS 1 - 1/13 = 12/13
    assert mmlb("berlin schol", "Berlin School", "Str") == pytest.approx(12 / 13)
    assert mmlb('"Berlin School (Germany)"', "Berlin School", "Str") == 1.0  # quotes, "(...)" dropped
    assert mmlb("abcx", "abcd", "Str") == pytest.approx(0.75)  # 1 - 1/4
    assert mmlb("abxy", "abcd", "Str") == 0.0  # 1 - 2/4 = 0.5, at the threshold: 0
    assert mmlb("", "abcd", "Str") == 0.0


def test_mmlongbench_str_exact_match_references():
    # a date reference is compared exactly: ANLS would have given 1 - 1/10 = 0.9
    assert mmlb("2019-05-02", "2019-05-01", "Str") == 0.0
    assert mmlb("2019-05-01", "2019-05-01", "Str") == 1.0
    assert mmlb("page 12", "Page 13", "Str") == 0.0  # "page ..." is exact too (ANLS 6/7 otherwise)


def test_mmlongbench_unanswerable():
    assert mmlb("Not answerable", "Not answerable", "None", answerable=False) == 1.0
    assert mmlb("not answerable", "Not answerable", "None", answerable=False) == 1.0  # lower-cased
    # the trailing "." is not cleaned: ANLS 1 - 1/15 = 14/15
    assert mmlb("Not answerable.", "Not answerable", "None", answerable=False) == pytest.approx(14 / 15)
    assert mmlb("12", "Not answerable", "None", answerable=False) == 0.0


@pytest.mark.parametrize("prediction, expected", [
    ("['White', '10%']", 1.0),
    ("['10%', 'white']", 1.0),   # both sorted: order does not matter
    ("['White']", 0.0),          # lengths differ
    ("White, 10%", 0.0),         # not a list: one item against two
    ("['White', '10%'", 0.0),    # unreadable list
])
def test_mmlongbench_list(prediction, expected):
    assert mmlb(prediction, "['White', '10%']", "List") == expected


def test_mmlongbench_list_of_words_takes_the_lowest_item_anls():
    # sorted: ["circle", "rectangle"] vs ["circl", "rectangle"]: min(1 - 1/6, 1) = 5/6
    assert mmlb("['Rectangle', 'Circl']", "['Circle', 'Rectangle']", "List") == pytest.approx(5 / 6)


def test_mmlongbench_refuses_an_unknown_answer_format():
    with pytest.raises(ValueError, match="answer_format"):
        MMLB.score("3", "3", None, True)


def test_mmlongbench_aggregate_accuracy_and_f1():
    rows = [
        MMLB.score("8", "8", "Int", True),                                 # answerable, 1
        MMLB.score("berlin schol", "Berlin School", "Str", True),          # answerable, 12/13
        MMLB.score("Not answerable", "3", "Int", True),                    # answerable, 0
        MMLB.score("Not answerable", "Not answerable", "None", False),    # unanswerable, 1
        MMLB.score("12", "Not answerable", "None", False),                # unanswerable, 0
        MMLB.score(None, "Not answerable", "None", False),                # unanswerable, no answer, 0
    ]
    total = MMLB.aggregate(rows)
    # accuracy = (1 + 12/13 + 0 + 1 + 0 + 0) / 6 = (38/13) / 6 = 19/39
    assert total["accuracy"] == pytest.approx(19 / 39)
    # recall: answerable rows 1-3, (1 + 12/13) / 3 = 25/39
    assert total["recall"] == pytest.approx(25 / 39)
    # precision: same sum over predictions other than "Not answerable" (rows 1, 2, 5, 6) = (25/13) / 4 = 25/52
    assert total["precision"] == pytest.approx(25 / 52)
    # F1 = 2 * (25/39)(25/52) / (25/39 + 25/52) = 2 * 25 / (52 + 39) = 50/91
    assert total["f1"] == pytest.approx(50 / 91)
    assert (total["count"], total["answerable"], total["predicted_answerable"], total["unanswered"]) == (6, 3, 4, 1)


def test_mmlongbench_f1_is_zero_without_answerable_questions():
    total = MMLB.aggregate([MMLB.score("Not answerable", "Not answerable", "None", False)])
    assert (total["accuracy"], total["f1"]) == (1.0, 0.0)


# ---- LongDocURL (utils/utils_score_v3.py)

@pytest.mark.parametrize("prediction, expected", [
    ("3", 1.0), ("$3", 1.0), ("3 kg", 1.0),
    ("3.0", 0.0),    # read as the float 3.0, whose text "3.0" is no int: unlike MMLongBench-Doc
    ("three", 0.0),
    ("", 0.0),
])
def test_longdocurl_integer(prediction, expected):
    assert ldu(prediction, "3", "Integer") == expected


def test_longdocurl_integer_commas():
    assert ldu("96395", "96,395", "Integer") == 1.0  # the reference's comma is dropped
    # the prediction is read by eval first: "96,395" is the tuple (96, 395), the list [96, 395]
    # after the JSON round trip, "[96 395]" once cleaned: no int
    assert ldu("96,395", "96395", "Integer") == 0.0


@pytest.mark.parametrize("prediction, expected", [
    ("0.125", 1.0),   # reference 12.5 / 100
    ("12.5", 1.0), ("12.5%", 1.0),
    ("12.6", 1.0),    # |0.1| <= 0.01 * 12.6 = 0.126
    ("12.7", 0.0),    # 0.2 > 0.127; 12.7 != 12.5 at 2 decimals
])
def test_longdocurl_float(prediction, expected):
    assert ldu(prediction, "12.5%", "Float") == expected


def test_longdocurl_string():
    assert ldu("dywegy.merger transaction", "Dywegy.Merger Transaction", "String") == 1.0
    # cleaned "1,200 meters" -> "1200 meters" -> "meters".rstrip-ped -> "1200": a number, compared exactly
    assert ldu("1200", "1,200 meters", "String") == 1.0
    assert ldu("Not answerable", "Not answerable", "None") == 1.0


def test_longdocurl_list_of_words_is_greedy_and_penalises_extra_items():
    gold = ["Circle", "Rectangle"]
    assert ldu("['Rectangle', 'Circle']", gold, "List") == 1.0  # order does not matter
    # each gold item finds an exact match: mean 1, scaled by sqrt(min(1, 2/3))
    assert ldu("['rectangle', 'circle', 'square']", gold, "List") == pytest.approx((2 / 3) ** 0.5)
    # "rectangle" vs "circle": longest common subsequence "rcle", so the edit distance is at
    # least 9 - 4 = 5 and ANLS at most 4/9 <= 0.5: 0;
    # mean (1 + 0) / 2 = 0.5, scaled by sqrt(min(1, 2/1)) = 1
    assert ldu("['circle']", gold, "List") == 0.5
    assert ldu("[]", gold, "List") == 0.0


def test_longdocurl_list_of_numbers_keeps_order():
    assert ldu("[10, 20]", "[10, 20]", "List") == 1.0
    assert ldu("[20, 10]", "[10, 20]", "List") == 0.0  # joined "20-10" != "10-20"
    assert ldu("[{'name': 'A', 'value': 3}]", ["A-3"], "List") == 1.0  # a dict item is its values joined


def test_longdocurl_aggregate_is_the_mean_score():
    rows = [LDU.score("3", "3", "Integer"), LDU.score("['circle']", ["Circle", "Rectangle"], "List"),
            LDU.score(None, "3", "Integer")]
    # (1 + 0.5 + 0) / 3 = 0.5
    assert LDU.aggregate(rows) == {"accuracy": 0.5, "count": 3.0, "unanswered": 1.0}


# ---- SlideVQA (evaluate.py)

def slidevqa(prediction, reference, question=""):
    row = SVQA.score(prediction, reference, question=question)
    return row["accuracy"], pytest.approx(row["f1"])


def test_slidevqa_number_words_and_replacements():
    assert slidevqa("Three", "3") == (1.0, 1.0)
    assert slidevqa("Sales & Marketing", "sales and marketing") == (1.0, 1.0)  # both "sales , marketing"
    assert slidevqa("25 percent", "25%") == (1.0, 1.0)
    assert slidevqa("Yes, it is.", "Yes") == (1.0, 1.0)   # cut to its first word
    assert slidevqa("north america", "North") == (1.0, 1.0)  # published quirk: starts with "no"


def test_slidevqa_drops_the_unit_the_question_asks_about():
    assert slidevqa("3 slides", "3", "how many slides show a map?") == (1.0, 1.0)
    # the cue is case-sensitive: "How many" drops nothing, tokens ["3", "slides"] vs ["3"]:
    # P = 1/2, R = 1, F1 = 2/3
    assert slidevqa("3 slides", "3", "How many slides show a map?") == (0.0, 2 / 3)


def test_slidevqa_token_f1_and_its_zero_cases():
    # "red and blue" -> "red , blue" -> ["red", "blue"] vs ["red"]: F1 = 2 * 1/2 * 1 / (3/2) = 2/3
    assert slidevqa("red and blue", "red") == (0.0, 2 / 3)
    assert slidevqa("", "") == (0.0, 0.0)       # no common token: 0 even for two empty answers
    assert slidevqa("it’s", "its") == (0.0, 0.0)  # the curly quote is not ASCII punctuation


def test_slidevqa_aggregate():
    rows = [SVQA.score("Three", "3"), SVQA.score("red and blue", "red"), SVQA.score(None, "red")]
    total = SVQA.aggregate(rows)
    assert total["accuracy"] == pytest.approx(1 / 3)  # (1 + 0 + 0) / 3
    assert total["f1"] == pytest.approx(5 / 9)        # (1 + 2/3 + 0) / 3
    assert (total["count"], total["unanswered"]) == (3.0, 1.0)


# ---- ViDoSeek (rule-based scores; the judge's prompt and parser: test_vrag_protocol.py)

def test_vidoseek_unicode_normalization():
    row = VIDO.score("It’s “Berlin”—in 2019.", "berlin in 2019")
    # "its berlin in 2019" (4 tokens) vs "berlin in 2019" (3): F1 = 2 * 3 / (4 + 3) = 6/7
    assert (row["accuracy"], row["contains"]) == (0.0, 1.0) and row["f1"] == pytest.approx(6 / 7)
    assert VIDO.score("２０１９", "2019")["accuracy"] == 1.0          # full-width digits (NFKC)
    assert VIDO.score("2019–2020", "2019 2020")["accuracy"] == 1.0  # an en dash parts words
    assert VIDO.score("The U.S.A.", "usa")["accuracy"] == 1.0


def test_vidoseek_containment_is_by_whole_tokens_in_order():
    assert VIDO.score("Berlinale", "Berlin")["contains"] == 0.0
    row = VIDO.score("2019 in berlin", "berlin in 2019")
    assert (row["accuracy"], row["f1"], row["contains"]) == (0.0, 1.0, 0.0)
    assert VIDO.score("anything", "")["contains"] == 0.0


def test_vidoseek_aggregate_with_verdicts():
    rows = [with_verdict(VIDO.score("Berlin", "berlin"), True),
            with_verdict(VIDO.score("It’s “Berlin”—in 2019.", "berlin in 2019"), None),  # unreadable
            with_verdict(VIDO.score(None, "berlin"), False)]
    total = VIDO.aggregate(rows)
    assert total["accuracy"] == pytest.approx(1 / 3)  # (1 + 0 + 0) / 3
    assert total["f1"] == pytest.approx(13 / 21)     # (1 + 6/7 + 0) / 3 = (13/7) / 3
    assert total["contains"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
    assert total["judge_accuracy"] == pytest.approx(1 / 3)  # only the first verdict is True
    assert (total["judge_count"], total["judge_unreadable"], total["unanswered"]) == (3.0, 1.0, 1.0)
    assert "judge_accuracy" not in VIDO.aggregate([VIDO.score("Berlin", "berlin")])
