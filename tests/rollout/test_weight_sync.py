"""Syncing Hugging Face weights into the running engine (`engine/weights.py`), checked against a
transformers forward pass: a perturbed model synced in is served (gap <= 1e-3), the same model
not synced is caught (gap > 1e-3), and the original weights synced back are served again.

Every family runs in both tiny-model shapes (the released one at the released logits width). The
engines are the session's shared ones (tests/conftest.py): every test leaves its engine on
the original weights, and the module's fixture syncs them back and verifies that at the end."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForImageTextToText

from vrag_rollout.devkit.tiny_model import RELEASED, SHAPES
from vrag_rollout.engine import weights
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.engine.weights import (SYNC_TOLERANCE, WeightSyncError, check_synced, logprob_gap,
                                         sync_weights)

GAPS: dict = {}  # (family, what) -> gap, printed at the end for the report


def perturbed(model):
    """A copy with noise on the LM head, one decoder layer's MLP, the first vision block and the
    vision merger (so a sync that missed the vision tower, or kept its cached outputs, shows)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1234)
    targets = [name for name, tensor in other.state_dict().items() if tensor.ndim == 2 and (
        name.startswith("lm_head") or ".layers.0.mlp.down_proj" in name or ".blocks.0.mlp" in name
        or ".merger." in name)]
    assert any(name.startswith("lm_head") for name in targets) and any(".merger." in n for n in targets), targets
    with torch.no_grad():
        for name in targets:
            tensor = other.get_parameter(name)
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.5 * float(tensor.std()))
    return other


@pytest.fixture(scope="module", ids=lambda param: "-".join(param), params=[
    pytest.param((family, shape), marks=[pytest.mark.released_shape] if shape == RELEASED else [])
    for shape in SHAPES for family in FAMILY_NAMES])
def family_model(request, family_models):
    """Every family in both shapes: the released one syncs at the released logits width."""
    return family_models(*request.param)


@pytest.fixture(scope="module")
def models(family_model):
    """(original HF model, perturbed copy); syncs the original back into the engine at the end."""
    original = AutoModelForImageTextToText.from_pretrained(family_model.model_dir, dtype=torch.float32).eval()
    yield SimpleNamespace(original=original, perturbed=perturbed(original))
    sync_weights(family_model.llm, original)
    check_synced(family_model.llm, original, family_model.processor)


def _gap(fm, model, what):
    gap = logprob_gap(fm.llm, model, fm.processor)
    GAPS[(fm.model_dir.name, what)] = gap
    print(f"\n{fm.family}: {what}: max logprob gap {gap:.3e}")
    return gap


def test_unsynced_weights_are_caught(family_model, models):
    """The control: the engine still has the original weights, the perturbed model disagrees."""
    fm = family_model
    assert _gap(fm, models.original, "original, not synced") <= SYNC_TOLERANCE
    assert _gap(fm, models.perturbed, "perturbed, not synced") > SYNC_TOLERANCE
    with pytest.raises(WeightSyncError, match="logprob gap"):
        check_synced(fm.llm, models.perturbed, fm.processor)


def test_synced_weights_are_served(family_model, models):
    fm = family_model
    try:
        count = sync_weights(fm.llm, models.perturbed)
        assert count == len(models.perturbed.state_dict())
        assert _gap(fm, models.perturbed, "perturbed, synced") <= SYNC_TOLERANCE
        assert _gap(fm, models.original, "original vs synced perturbed") > SYNC_TOLERANCE
    finally:
        sync_weights(fm.llm, models.original)


def test_original_weights_are_restored(family_model, models):
    fm = family_model
    sync_weights(fm.llm, models.perturbed)
    sync_weights(fm.llm, models.original)
    assert _gap(fm, models.original, "original, restored") <= SYNC_TOLERANCE
    assert _gap(fm, models.perturbed, "perturbed vs restored original") > SYNC_TOLERANCE


def test_a_sync_that_keeps_stale_caches_is_caught(family_model, models, monkeypatch):
    """Weights loaded but the prefix cache (KV of the long prompt) and the encoder cache (the
    image's embeddings) kept from the old weights: the check must fail, on text and on the image."""
    fm = family_model
    block = fm.llm.llm_engine.vllm_config.cache_config.block_size
    assert len(fm.processor.tokenizer(weights.DEFAULT_PROMPTS[1]).input_ids) > block
    logprob_gap(fm.llm, models.original, fm.processor)  # the original's KV and image embeddings cached
    try:
        with monkeypatch.context() as patched:
            patched.setattr(weights, "drop_stale_state", lambda llm: None)
            sync_weights(fm.llm, models.perturbed)
        stale_text = logprob_gap(fm.llm, models.perturbed, fm.processor, prompts=weights.DEFAULT_PROMPTS[1:2],
                                 with_image=False)
        stale_image = logprob_gap(fm.llm, models.perturbed, fm.processor, prompts=weights.DEFAULT_PROMPTS[:1])
        GAPS[(fm.model_dir.name, "perturbed, synced, caches kept")] = (stale_text, stale_image)
        print(f"\n{fm.family}: caches kept: gap {stale_text:.3e} (long text), {stale_image:.3e} (image)")
        assert stale_text > SYNC_TOLERANCE and stale_image > SYNC_TOLERANCE
        weights.drop_stale_state(fm.llm)
        assert _gap(fm, models.perturbed, "perturbed, synced, caches then dropped") <= SYNC_TOLERANCE
    finally:
        sync_weights(fm.llm, models.original)


def test_a_partial_state_dict_is_refused(family_model, models):
    """A state dict without the vision tower leaves engine parameters unloaded: an error, not a
    quietly half-synced engine."""
    fm = family_model
    language_only = {name: tensor for name, tensor in models.perturbed.state_dict().items() if "visual" not in name}
    try:
        with pytest.raises(WeightSyncError, match="engine parameters got no tensor"):
            sync_weights(fm.llm, SimpleNamespace(state_dict=lambda: language_only))
    finally:
        sync_weights(fm.llm, models.original)


def test_an_unreachable_engine_is_refused():
    with pytest.raises(WeightSyncError, match="cannot reach the engine's model"):
        sync_weights(SimpleNamespace(llm_engine=SimpleNamespace()), torch.nn.Linear(2, 2))
