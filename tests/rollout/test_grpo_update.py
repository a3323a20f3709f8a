"""A GRPO update of the Hugging Face model from a real rollout batch, with verl's update math:
observation tokens never reach the gradient (and the check can fail), verl's advantages equal a
group normalisation written out here, and one step moves a sample's log-prob with its advantage."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, prompt_batch, sample_prompts
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.training.grpo import actor_config, grpo_advantages, grpo_loss, grpo_step, response_log_probs

N = 4
TEMPERATURE = 0.7
REWARDS = [0.0, 1.0, 3.0, 2.0, 1.0, 0.5, 0.25, 2.0]  # distinct within each group: no zero advantage


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tiny_processor, tiny_llm):
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, retriever, n=N, max_turns=3,
                       calculate_log_probs=True, temperature=TEMPERATURE)
    batch = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2), agent))
    observed = batch.batch["response_mask"].bool() & ~batch.batch["loss_mask"].bool()
    assert len(batch) == 2 * N and observed.any(), "the rollout must hold observation tokens"
    return batch


def fresh_model(model_dir):
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


def log_prob_gradient(model_dir, processor, batch, mask_key):
    loss, log_prob, _, _ = grpo_loss(fresh_model(model_dir), processor, batch, REWARDS, N, TEMPERATURE,
                                     actor_config(N), mask_key=mask_key)
    log_prob.retain_grad()
    loss.backward()
    return log_prob.grad


def test_observation_tokens_get_no_gradient(tiny_model_dir, tiny_processor, rollout):
    grad = log_prob_gradient(tiny_model_dir, tiny_processor, rollout, "loss_mask")
    sampled = rollout.batch["loss_mask"].bool()
    observed = rollout.batch["response_mask"].bool() & ~sampled
    assert (grad[observed] == 0).all()
    assert (grad[~rollout.batch["response_mask"].bool()] == 0).all()  # padding
    assert (grad[sampled] != 0).all()


def test_control_observations_in_the_mask_get_a_gradient(tiny_model_dir, tiny_processor, rollout):
    """The same loss with observation tokens put into the mask on purpose: the check above can fail."""
    grad = log_prob_gradient(tiny_model_dir, tiny_processor, rollout, "response_mask")
    observed = rollout.batch["response_mask"].bool() & ~rollout.batch["loss_mask"].bool()
    assert (grad[observed] != 0).all()


def test_verl_advantages_equal_a_group_normalisation(rollout):
    rewards = [0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # one skewed group, one with no spread
    advantages = grpo_advantages(rollout, rewards, N)
    # The oracle: (r - mean) / (std + eps) per prompt, std with Bessel's correction (torch.std), eps 1e-6.
    groups = np.asarray(rewards).reshape(-1, N)
    oracle = ((groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + 1e-6)).ravel()
    mask = rollout.batch["loss_mask"].bool()
    for row in range(len(rewards)):
        assert torch.allclose(advantages[row][mask[row]], torch.tensor(oracle[row], dtype=torch.float32), atol=1e-6)
        assert (advantages[row][~mask[row]] == 0).all()
    assert abs(oracle[0] + 1.5) < 1e-5 and (oracle[4:] == 0).all()


def sequence_log_prob(model, processor, batch, row):
    with torch.no_grad():
        log_prob = response_log_probs(model, processor, batch, TEMPERATURE)
    return float((log_prob[row] * batch.batch["loss_mask"][row]).sum())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_step_moves_the_sample_with_its_advantage(tiny_model_dir, tiny_processor, rollout, sign):
    model = fresh_model(tiny_model_dir)
    before = sequence_log_prob(model, tiny_processor, rollout, 0)
    rewards = [sign * r for r in [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]  # sample 0: advantage of `sign`
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    metrics = grpo_step(model, optimizer, tiny_processor, rollout, rewards, N, TEMPERATURE)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0 and metrics["advantage_std"] > 0
    after = sequence_log_prob(model, tiny_processor, rollout, 0)
    assert sign * (after - before) > 0, (before, after)


def test_response_log_probs_equal_the_engines_on_freely_sampled_tokens(tiny_model_dir, tiny_processor, tiny_llm):
    """The log-probs the update differentiates are those the engine sampled from (where no grammar
    constrains the turn: under the action grammar vLLM reports the constrained distribution)."""
    from tests.rollout.test_families import _FreeLastTurn

    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    base = make_agent(tiny_model_dir, tiny_processor, tiny_llm, retriever, n=2, max_turns=3,
                      calculate_log_probs=True, temperature=TEMPERATURE)
    agent = _FreeLastTurn(str(tiny_model_dir), base.config, tiny_processor.tokenizer, tiny_processor,
                          inference_engine=tiny_llm, retriever=retriever)
    agent.driver.free_from = {}
    batch = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2), agent))
    with torch.no_grad():
        log_prob = response_log_probs(fresh_model(tiny_model_dir), tiny_processor, batch, TEMPERATURE)
    free = batch.batch["loss_mask"].bool().clone()
    for row in range(len(free)):
        free[row, :agent.driver.free_from.get(row, free.shape[1])] = False
    assert free.sum() > 20
    assert (log_prob - batch.batch["rollout_log_probs"]).abs()[free].max() < 1e-3


def test_tokens_the_grammar_forced_carry_no_gradient_into_the_model(tiny_model_dir, tiny_processor, rollout):
    """Under the action grammar a forced token's log-prob is 0 for the constrained policy whatever
    the weights: the update gives it a constant 0. Control: the same batch marked grammar-free."""
    from vrag_rollout.training.grpo import grammar_forced

    assert rollout.meta_info["action_grammar"]
    forced = grammar_forced(rollout)
    sampled = rollout.batch["loss_mask"].bool()
    assert forced.any() and (forced <= sampled).all() and (sampled & ~forced).any()
    assert (rollout.batch["rollout_log_probs"][forced] == 0).all()

    model = fresh_model(tiny_model_dir)
    log_prob = response_log_probs(model, tiny_processor, rollout, TEMPERATURE)
    assert (log_prob[forced] == 0).all() and (log_prob[sampled & ~forced] != 0).all()
    log_prob[forced].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())

    free = copy.copy(rollout)
    free.meta_info = {**rollout.meta_info, "action_grammar": False}
    assert grammar_forced(free) is None
    control = response_log_probs(fresh_model(tiny_model_dir), tiny_processor, free, TEMPERATURE)
    assert (control[forced] != 0).all()
