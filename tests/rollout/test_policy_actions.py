"""Actions a policy really writes, on real vLLM output: each case is forced by a grammar that
writes it on purpose, and the rollout must end or correct the episode as actions.py documents,
never crash or stall the batch."""

from __future__ import annotations

import pytest

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, prompt_batch, sample_prompts
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient

CASES = {
    # grammar: (termination, searches, invalid actions per sample, text that must appear)
    "answer_then_search": (r"<answer>[a-z]{2,5}</answer><search>battery life and Zigbee radio</search>", "answered", 0, 0, None),
    "text_after_answer": (r"<answer>[a-z]{2,5}</answer>[a-z ]{3,10}", "answered", 0, 0, None),
    "unterminated_tag_at_eos": (r"<search>[a-z ]{3,10}", "eos", 0, 0, None),
    "unterminated_tag_at_length": (r"<search>[a-z]{900,1000}</search>", "length", 0, 0, None),
    "empty_query": (r"<search></search>", "max_turns", 0, 2, "error: the search query is empty"),
    "bad_page": (r"<fetch>image, 0</fetch>", "max_turns", 0, 2, "error: page numbers start at 1"),
    "search_then_answer": (r"<search>battery life and Zigbee radio</search>|<answer>[a-z]{2,5}</answer>", None, None, 0, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_policy_written_actions(case, tiny_model_dir, tiny_processor, tiny_llm):
    regex, reason, searches, invalid, text = CASES[case]
    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=2, action_regex=regex,
                       response_length=128)
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2, with_images=False), agent))
    columns, tokenizer = output.non_tensor_batch, tiny_processor.tokenizer
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        assert used <= agent.config.response_length
        decoded = tokenizer.decode(output.batch["responses"][row][:used].tolist())
        if reason is not None:
            assert columns["termination_reason"][row] == reason, (case, decoded)
        if searches is not None:
            assert columns["num_searches"][row] == searches, (case, decoded)
        if text is not None:
            assert decoded.count(text) == 1, (case, decoded)  # corrected once, then the last turn ends it
    metrics = output.meta_info["metrics"]
    assert metrics["rollout/invalid_actions"] == invalid * len(output)
    kinds = {key: value for key, value in metrics.items() if key.startswith("rollout/invalid_actions/")}
    assert kinds == ({f"rollout/invalid_actions/{case}": invalid * len(output)} if invalid else {})
    assert metrics["rollout/retriever_errors"] == 0


PAGE_SIX = {"tags": r"<fetch>image, 6</fetch>",
            "tool_call": r'<tool_call>\n\{"name": "fetch", "arguments": \{"page": 6, "mode": "image"\}\}\n</tool_call>'}


@pytest.mark.parametrize("action_format", sorted(PAGE_SIX))
def test_a_page_the_document_lacks_is_the_policys_mistake(action_format, tiny_model_dir, tiny_processor, tiny_llm):
    """The server refuses page 6 of a 4-page document with a request error code: the sample sees
    the reason, and it is counted as a bad request, not as a retriever failure; the fetch counts
    as a fetch made, in both formats, and as the sample's own failed call (issue 33 item 9)."""
    from vrag_rollout.devkit.demo import demo_prompts

    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=1, max_turns=2,
                       action_format=action_format, prompt_length=1024, action_regex=PAGE_SIX[action_format])
    samples = [s for s in sample_prompts(6, with_images=False) if s.doc_id == "annual_report"]
    output = agent.generate_sequences(demo_prompts(tiny_processor.tokenizer, tiny_processor, samples, agent.config))
    metrics = output.meta_info["metrics"]
    assert metrics["rollout/bad_requests"] == len(samples) > 0
    assert metrics["rollout/retriever_errors"] == 0 and metrics["retriever/failures/request"] == len(samples)
    text = tiny_processor.tokenizer.decode(output.batch["responses"][0][output.batch["response_mask"][0].bool()].tolist())
    assert "error: page 6 is out of range; document 'annual_report' has pages 1..4" in text
    columns = output.non_tensor_batch
    assert list(columns["bad_requests"]) == [1] * len(samples)  # each sample's own
    assert list(columns["retriever_errors"]) == [0] * len(samples)
    assert list(columns["num_fetches"]) == [1] * len(samples)  # made, though refused


NATIVE_CASES = {
    # grammar of every turn: (error text in the tool response or None, searches per sample, the
    # invalid kind counted per turn or None)
    "invalid_json": (r'<tool_call>\n\{"name": "search", "arguments": \{"query": "x"\n</tool_call>',
                     "error: the tool call is not valid JSON", 0, "invalid_json"),
    "unknown_tool": (r'<tool_call>\n\{"name": "browse", "arguments": \{\}\}\n</tool_call>',
                     "error: unknown tool 'browse'", 0, "unknown_tool"),
    "ill_typed_arguments": (r'<tool_call>\n\{"name": "fetch", "arguments": \{"page": "two", "mode": "image"\}\}\n</tool_call>',
                            "error: fetch needs an integer 'page' from 1", 0, "bad_arguments"),
    "missing_arguments": (r'<tool_call>\n\{"name": "search", "arguments": \{\}\}\n</tool_call>',
                          "error: search needs a non-empty string 'query'", 0, "bad_arguments"),
    "unclosed_call_at_eos": (r'<tool_call>\n\{"name": "search"', "error: a <tool_call> was not closed", 0, "unclosed_call"),
    "text_after_call": (r'<tool_call>\n\{"name": "search", "arguments": \{"query": "battery life and Zigbee radio"\}\}\n'
                        r'</tool_call> and then [a-z]{3,8}', "error: text after </tool_call> was ignored", 1, "text_after_call"),
    "two_calls": (r'<tool_call>\n\{"name": "search", "arguments": \{"query": "battery life and Zigbee radio"\}\}\n'
                  r'</tool_call>\n<tool_call>\n\{"name": "fetch", "arguments": \{"page": 1, "mode": "image"\}\}\n</tool_call>',
                  None, 1, None),
}


@pytest.mark.parametrize("case", sorted(NATIVE_CASES))
def test_native_tool_calls_a_policy_writes(case, tiny_model_dir, tiny_processor, tiny_llm):
    """Malformed native calls get an error tool response and count as invalid actions, by kind;
    valid calls in the same turn still run (two calls in one turn are answered in one tool turn).
    Never a crash or a stalled batch."""
    from vrag_rollout.devkit.demo import demo_prompts

    regex, error, searches, kind = NATIVE_CASES[case]
    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=1, max_turns=2, action_format="tool_call",
                       prompt_length=1024, action_regex=regex)
    samples = sample_prompts(2, with_images=False)
    output = agent.generate_sequences(demo_prompts(tiny_processor.tokenizer, tiny_processor, samples, agent.config))
    tok = tiny_processor.tokenizer
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        text = tok.decode(output.batch["responses"][row][:used].tolist(), skip_special_tokens=False)
        assert output.non_tensor_batch["termination_reason"][row] == "max_turns", text[-200:]
        # One tool turn (the second turn is the last): one answer per call, one more for text after them.
        assert text.count("<tool_response>") == (2 if case in ("two_calls", "text_after_call") else 1)
        if error:
            assert error in text
        assert output.non_tensor_batch["num_searches"][row] == searches
    metrics = output.meta_info["metrics"]
    invalid = 0 if kind is None else 2 * len(output)  # both turns hold the mistake
    assert metrics["rollout/invalid_actions"] == invalid
    kinds = {key: value for key, value in metrics.items() if key.startswith("rollout/invalid_actions/")}
    assert kinds == ({} if kind is None else {f"rollout/invalid_actions/{kind}": invalid})


def test_a_native_call_cut_at_the_length_limit(tiny_model_dir, tiny_processor, tiny_llm):
    """A call still open when sampling hits the length limit (max_tokens is the episode's
    remaining budget) is never executed: the episode ends with "length", its last token a
    sampled one, and the cut call is counted apart from invalid actions."""
    from vrag_rollout.devkit.demo import demo_prompts

    regex = r'<tool_call>\n\{"name": "search", "arguments": \{"query": "[a-z]{900,1000}"\}\}\n</tool_call>'
    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=3, action_format="tool_call",
                       prompt_length=1024, response_length=64, action_regex=regex)
    output = agent.generate_sequences(demo_prompts(tiny_processor.tokenizer, tiny_processor,
                                                   sample_prompts(2, with_images=False), agent.config))
    assert list(output.non_tensor_batch["termination_reason"]) == ["length"] * len(output)
    assert output.meta_info["metrics"]["rollout/tool_calls_cut"] == len(output)
    assert output.meta_info["metrics"]["rollout/invalid_actions"] == 0
    assert output.meta_info["metrics"]["rollout/searches"] == 0
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        assert used == agent.config.response_length and bool(output.batch["loss_mask"][row][used - 1])
