import pytest

from vrag_rollout.core.actions import Answer, Fetch, Invalid, Search, Stop, parse_action


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        ("<think>find it</think><search>revenue table</search>", "</search>", Search("revenue table")),
        ("<search>  padded query \n</search>", "</search>", Search("padded query")),
        # the token that completed the stop string may carry characters after it
        ("<search>chart</search>\n", "</search>", Search("chart")),
        ("<fetch>image, 3</fetch>", "</fetch>", Fetch("image", 3)),
        ("<fetch>text,12</fetch>", "</fetch>", Fetch("text", 12)),
        ("<fetch>IMAGE 2</fetch>", "</fetch>", Fetch("image", 2)),
        ("<fetch>4-th</fetch>", "</fetch>", Fetch("image", 4)),
        # an earlier, completed call does not count: the last opening tag does
        ("<search>a</search><result>x</result><search>b</search>", "</search>", Search("b")),
    ],
)
def test_tool_calls(text, stop, expected):
    assert parse_action(text, "stop", stop) == expected


@pytest.mark.parametrize(
    "text, stop, fragment",
    [
        ("<search>   </search>", "</search>", "empty"),
        ("no opening tag</search>", "</search>", "<search> is missing"),
        ("<fetch>image, 0</fetch>", "</fetch>", "start at 1"),
        ("<fetch>audio, 2</fetch>", "</fetch>", "not available"),
        ("<fetch>page three</fetch>", "</fetch>", "cannot read fetch"),
        ("<search>" + "q" * 600 + "</search>", "</search>", "longer than"),
    ],
)
def test_malformed_calls_explain_themselves(text, stop, fragment):
    action = parse_action(text, "stop", stop)
    assert isinstance(action, Invalid)
    assert fragment in action.message


def test_fetch_mode_restriction():
    assert isinstance(parse_action("<fetch>text, 2</fetch>", "stop", "</fetch>", ("image",)), Invalid)
    assert parse_action("<fetch>image, 2</fetch>", "stop", "</fetch>", ("image",)) == Fetch("image", 2)


def test_end_of_turn_kinds():
    assert parse_action("<answer>42</answer>", "stop", None) == Answer("42")
    # several EOS ids: vLLM reports the non-primary one as an int stop_reason
    assert parse_action("<answer>a</answer> <answer> b </answer>", "stop", 151643) == Answer("b")
    assert parse_action("I give up", "stop", None) == Stop("eos")
    assert parse_action("<search>unfinished", "length", None) == Stop("length")
    assert parse_action("", "abort", None) == Stop("abort")
