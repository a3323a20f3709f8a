"""check and view on a small real batch of every supported family (one engine per family, shared
with the rest of the session): the clean batch passes, planted defects are caught, rollout
logprobs without a grammar agree with the family's own forward pass, and a model of another
family is refused."""

from __future__ import annotations

import pytest

from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import caught, drawing, roll, runs, set_token
from vrag_rollout.verify.check import CheckInputError, check_batch
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.data.prompts import PromptSample
from vrag_rollout.verify.saved_batch import load_rollout
from vrag_rollout.verify.view import render

MODEL_TYPES = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl"}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_batches(request, family_models, tmp_path_factory):
    model = family_models(request.param)
    where = tmp_path_factory.mktemp(request.param)
    grammar = roll(model.model_dir, model.processor, model.llm, sample_prompts(3), where / "grammar.pt",
                    calculate_log_probs=True)
    samples = [PromptSample(question="Which page covers revenue?", doc_id="annual_report",
                            images=[drawing(200, 180, 0), drawing(200, 180, 1)])]
    free = roll(model.model_dir, model.processor, model.llm, samples, where / "free.pt",
                 calculate_log_probs=True, action_regex=None, response_length=32)
    return model, grammar, free


def test_clean_batch_passes(family_batches):
    model, grammar, _ = family_batches
    saved = load_rollout(grammar.path)
    assert saved.model_family == MODEL_TYPES[model.family]
    report = check_batch(saved, model.model_dir)
    assert report.ok, report.human()
    assert report.model_family == MODEL_TYPES[model.family]


def test_forward_agrees_without_grammar(family_batches):
    model, _, free = family_batches
    report = check_batch(load_rollout(free.path), model.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["tokens"] > 0 and report.forward["max_gap"] < 1e-3


def test_planted_defects_are_caught(family_batches):
    model, grammar, _ = family_batches
    image_pad = model.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    saved = load_rollout(grammar.path)
    row = next(r for r in range(len(saved)) if runs(saved.tensors["input_ids"][r].tolist(), image_pad))
    start, end = runs(saved.tensors["input_ids"][row].tolist(), image_pad)[-1]
    saved.tensors["position_ids"][row, 1:, end:] += 1
    caught(check_batch(saved, model.model_dir), "positions", row, end)

    saved = load_rollout(grammar.path)
    vision_end = model.processor.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    set_token(saved, row, end - 1, vision_end)  # the run ends one pad early
    caught(check_batch(saved, model.model_dir), "image_tokens", row, start, "pad run of")


def test_model_of_another_family_is_refused(family_batches, family_models):
    model, grammar, _ = family_batches
    other = family_models(next(name for name in FAMILY_NAMES if name != model.family))
    with pytest.raises(CheckInputError, match=f"made by a {MODEL_TYPES[model.family]} model"):
        check_batch(load_rollout(grammar.path), other.model_dir)


def test_view_shows_every_image(family_batches):
    _, grammar, _ = family_batches
    saved = load_rollout(grammar.path)
    page = render(saved)
    assert page.count('class="episode"') == len(saved)
    assert page.count('class="thumb"') == sum(len(images) for images in saved.images)


def test_the_live_guard_finds_no_bad_sample_in_clean_batches(family_batches):
    """No false alarm on either batch of the family (every sample's positions compared)."""
    from vrag_rollout.verify.guard import Guard

    model, grammar, free = family_batches
    guard = Guard(model.model_dir, positions_fraction=1.0)
    for rollout in (grammar, free):
        report = guard.inspect(rollout.output, rollout.config)
        assert report.ok, report.lines()
