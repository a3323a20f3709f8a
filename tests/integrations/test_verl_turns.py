"""verl's token-level answer recovered as vLLM's finish (`integrations/verl/turns.py`), with the
real tokenizer: a stop string wins over the length limit and cuts the text as vLLM's
detokenizer does, an EOS is a plain stop, a full budget is "length", anything else "abort"."""

from __future__ import annotations

from vrag_rollout.core.actions import TOOL_STOPS
from vrag_rollout.integrations.verl.turns import turn_output


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
