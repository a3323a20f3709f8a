"""verl's token-level answer recovered as vLLM's finish (`integrations/verl/turns.py`), with the
real tokenizer: a stop string wins over the length limit and cuts the text as vLLM's
detokenizer does, an EOS is a plain stop, a full budget is "length", anything else "abort".

Partial rollouts: verl's resume loop merges an aborted request with its resubmission, and vLLM
looks for stop strings only in the resubmission's own output, so an abort inside a stop string
leaves the merged answer running past it. Each stop string of each action format is split at
every character offset; the turn keeps exactly the tokens (and their logprobs) of an
uninterrupted request: up to the token in which the stop string completes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from vrag_rollout.core.actions import TOOL_STOPS
from vrag_rollout.integrations.verl.turns import turn_output
from vrag_rollout.formats import FORMATS

TAIL = " and I keep writing.<answer>2</answer>"  # what a resubmitted request samples past the stop
# The text before each stop string, as an action of that stop's tag writes it.
BODIES = {"</search>": "<search>revenue by region", "</fetch>": "<fetch>image, 2",
          "</crop>": "<crop>2, [10, 20, 500, 600]", "</bbox>": "<bbox>[10, 20, 500, 600]"}


def every_stop_string() -> list[str]:
    """The stop strings of every action format, with every option that adds some."""
    config = SimpleNamespace(region_action=True)
    stops = sorted({stop for fmt in FORMATS.values() for stop in fmt.stop_strings_for(config)})
    assert set(stops) == set(BODIES), stops  # a new stop string needs a body here
    return stops


def recover(tokenizer, text, *, max_tokens=64, stop_reason="completed", eos=()):
    ids = tokenizer.encode(text, add_special_tokens=False) + list(eos)
    return turn_output(ids, [-0.5] * len(ids), stop_reason=stop_reason, max_tokens=max_tokens,
                       stop_strings=TOOL_STOPS, eos_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),),
                       decode=lambda t: tokenizer.decode(t, skip_special_tokens=True))


def test_a_stop_string_is_a_stop_even_on_the_last_allowed_token(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    text = "<search>revenue by region</search>"
    out = recover(tokenizer, text, max_tokens=len(tokenizer.encode(text, add_special_tokens=False)))
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", "</search>", text)
    assert out.logprobs == tuple([-0.5] * len(out.token_ids))


def test_eos_length_and_abort(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answered = recover(tokenizer, "<answer>3</answer>", eos=[im_end])
    assert (answered.finish_reason, answered.stop_reason, answered.text) == ("stop", None, "<answer>3</answer>")
    words = "one two three four five six"
    cut = recover(tokenizer, words, max_tokens=len(tokenizer.encode(words, add_special_tokens=False)))
    assert cut.finish_reason == "length"
    assert recover(tokenizer, words, max_tokens=200).finish_reason == "abort"  # neither stop nor full budget
    assert recover(tokenizer, words, max_tokens=3, stop_reason="aborted").finish_reason == "abort"


def kept_by_vllm(first_ids: list[int], second_ids: list[int], chars_needed: int, decode) -> list[int]:
    """The ids an uninterrupted request keeps, from how the two parts were tokenized: all of the
    first part, then the second part's tokens up to the one that completes the stop string
    (`chars_needed` characters into the second part; each token decodes on its own here)."""
    kept, seen = list(first_ids), 0
    for token in second_ids:
        if seen >= chars_needed:
            break
        kept.append(token)
        seen += len(decode([token]))
    return kept


@pytest.mark.parametrize("stop", every_stop_string())
def test_an_abort_at_every_offset_inside_a_stop_string_keeps_only_the_uninterrupted_tokens(tiny_processor, stop):
    tokenizer = tiny_processor.tokenizer
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731 - vLLM's detokenization
    eos = [tokenizer.convert_tokens_to_ids(name) for name in ("<|im_end|>", "<|endoftext|>")]
    before = "<think>the table</think>" + BODIES[stop]
    text = before + stop + TAIL
    for offset in range(len(stop) + 1):  # 0 and len(stop): the abort at either edge of it
        split = len(before) + offset
        first = tokenizer.encode(text[:split], add_special_tokens=False)
        second = tokenizer.encode(text[split:], add_special_tokens=False) + eos[:1]
        ids = first + second
        logprobs = [-(i + 1) / 100 for i in range(len(ids))]  # each token's own, to see they stay aligned
        out = turn_output(ids, logprobs, stop_reason="completed", max_tokens=len(ids) + 10,
                          stop_strings=every_stop_string(), eos_ids=eos, decode=decode)
        kept = kept_by_vllm(first, second, len(stop) - offset, decode)
        assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, before + stop), offset
        assert list(out.token_ids) == kept, (offset, [decode([t]) for t in out.token_ids[len(first) - 1:]])
        assert list(out.logprobs) == logprobs[:len(kept)], offset
        assert not set(out.token_ids) & set(eos), offset


@pytest.mark.parametrize("offset", range(len("</tool_call>") + 1))
def test_a_tool_call_turn_split_inside_its_closing_tag_ends_at_its_end_of_turn(tiny_processor, offset):
    """The native format ends a turn with its end-of-turn token (no stop string): a token, which
    no abort splits; the merged answer is kept whole."""
    tokenizer = tiny_processor.tokenizer
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = '<think>look it up</think>\n<tool_call>\n{"name": "fetch", "arguments": {"page": 2}}\n</tool_call>'
    split = len(text) - len("</tool_call>") + offset
    ids = (tokenizer.encode(text[:split], add_special_tokens=False)
           + tokenizer.encode(text[split:], add_special_tokens=False) + [im_end])
    stops = FORMATS["tool_call"].stop_strings_for(SimpleNamespace(region_action=True))
    out = turn_output(ids, [-0.25] * len(ids), stop_reason="completed", max_tokens=len(ids) + 1, stop_strings=stops,
                      eos_ids=(im_end,), decode=lambda t: tokenizer.decode(t, skip_special_tokens=True))
    assert (out.finish_reason, out.stop_reason, out.text, list(out.token_ids)) == ("stop", None, text, ids)


def test_the_stop_is_found_with_logarithmically_many_decodes(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return tokenizer.decode(ids, skip_special_tokens=True)

    text = "<think>" + "a long thought " * 60 + "</think><fetch>image, 2</fetch>" + TAIL * 10
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = turn_output(ids, None, stop_reason="completed", max_tokens=len(ids), stop_strings=TOOL_STOPS, eos_ids=(),
                      decode=decode)
    assert out.text.endswith("</fetch>") and out.logprobs is None
    assert len(calls) <= math.ceil(math.log2(len(ids))) + 3, (len(calls), len(ids))
