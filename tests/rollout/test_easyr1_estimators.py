"""EasyR1's advantage estimators on agent batches (observation tokens masked inside a response).

CI has no EasyR1, so EasyR1's functions are not imported: the oracles below are written from
their definitions in hiyouga/EasyR1 b44b311 `verl/trainer/core_algos.py` and
`verl/utils/torch_functional.py`, and the expected numbers are worked out by hand. Where a real
EasyR1 is importable, `test_real_easyr1_reinforce_plus_plus_is_replaced` runs against it.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from vrag_rollout.integrations import easyr1 as glue


# ---- oracles: EasyR1's definitions, restated ----
def easyr1_reinforce_pp_returns(rewards, mask, gamma):
    """core_algos.compute_reinforce_plus_plus_outcome_advantage: G = r_t + gamma G; ret_t = G; G *= mask_t."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns


def easyr1_masked_whiten(values, mask):
    """torch_functional.masked_whiten: (v - masked mean) / sqrt(unbiased masked var + 1e-8)."""
    mask = mask.float()
    mean = (values * mask).sum() / (mask.sum() + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8)
    var = var * mask.sum() / (mask.sum() - 1)
    return (values - mean) / torch.sqrt(var + 1e-8)


GAMMA = 0.5
# one response: sampled 0-1, observation 2-3, sampled 4-5 (reward 1 on the last sampled token), padding 6
AGENT_MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0]])
AGENT_REWARD = torch.tensor([[0, 0, 0, 0, 0, 1.0, 0]])


def test_easyr1_reinforce_pp_cuts_earlier_turns_off_on_agent_masks():
    """The defect, measured with EasyR1's definition: the first turn gets no return at all."""
    returns = easyr1_reinforce_pp_returns(AGENT_REWARD, AGENT_MASK, GAMMA)
    assert returns[0, [0, 1, 4, 5]].tolist() == [0.0, 0.0, 0.5, 1.0]


def test_returns_skip_observation_tokens():
    returns = glue.skip_observation_returns(AGENT_REWARD, AGENT_MASK, GAMMA)
    # by hand: the sampled tokens 0, 1, 4, 5 are 3, 2, 1, 0 sampled steps before the reward
    assert returns[0].tolist() == [0.125, 0.25, 0.0, 0.0, 0.5, 1.0, 0.0]
    # = EasyR1's definition on the policy's own tokens (observations deleted)
    compact = easyr1_reinforce_pp_returns(torch.tensor([[0, 0, 0, 1.0]]), torch.ones(1, 4), GAMMA)
    assert returns[0, [0, 1, 4, 5]].tolist() == compact[0].tolist()


def test_returns_equal_easyr1_where_the_mask_has_no_holes():
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0, 0, 0], [0.5, 0.0, 2.0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    for gamma in (1.0, 0.9):
        assert torch.allclose(glue.skip_observation_returns(rewards, mask, gamma),
                              easyr1_reinforce_pp_returns(rewards, mask, gamma))


def test_a_reward_on_an_observation_token_still_reaches_earlier_turns():
    rewards = torch.tensor([[0, 0, 0, 2.0, 0, 0, 0]])  # e.g. a KL term or a misplaced score
    returns = glue.skip_observation_returns(rewards, AGENT_MASK, 1.0)
    assert returns[0].tolist() == [2.0, 2.0, 0, 0, 0, 0, 0]


def test_reinforce_pp_estimator_whitens_with_easyr1s_whiten():
    estimator = glue.make_reinforce_plus_plus(easyr1_masked_whiten)
    rewards = torch.cat([AGENT_REWARD, torch.tensor([[0, 0, 0, 0, 0, 0, 0.0]])])
    mask = torch.cat([AGENT_MASK, torch.tensor([[1, 1, 1, 0, 0, 0, 0]])])
    advantages, returns = estimator(token_level_rewards=rewards, response_mask=mask, gamma=GAMMA, index=None)
    # returns on masked tokens: [.125 .25 .5 1] and [0 0 0]; mean 1.875/7, unbiased var by hand:
    values = [0.125, 0.25, 0.5, 1.0, 0.0, 0.0, 0.0]
    mean = sum(values) / 7
    var = sum((v - mean) ** 2 for v in values) / 6
    assert advantages[0, 5].item() == pytest.approx((1.0 - mean) / math.sqrt(var + 1e-8), rel=1e-5)
    assert advantages[1, 0].item() == pytest.approx((0.0 - mean) / math.sqrt(var + 1e-8), rel=1e-5)
    assert returns[0, 0].item() == 0.125


# ---- outcome estimators: EasyR1's definitions on the reward the integration places ----
def scores_on_last_sampled(values, sampled, full):
    scores = torch.zeros(sampled.shape)
    last_full = [max(i for i, m in enumerate(row) if m) for row in full.tolist()]
    for row, value in enumerate(values):
        scores[row, last_full[row]] = value  # where EasyR1's reward manager puts it
    return glue.place_on_last_sampled(scores, sampled, full)


def test_score_moves_from_an_observation_to_the_last_sampled_token():
    full = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    sampled = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    scores = scores_on_last_sampled([3.0, 2.0], sampled, full)
    assert scores.tolist() == [[0, 3.0, 0, 0, 0], [0, 0, 2.0, 0, 0]]
    untouched = torch.zeros(1, 3)  # nothing sampled at all: left where it was
    untouched[0, 2] = 1.0
    assert glue.place_on_last_sampled(untouched, torch.zeros(1, 3), torch.ones(1, 3)).tolist() == [[0, 0, 1.0]]


def test_grpo_rloo_passk_on_an_agent_group():
    # two samples of one prompt, scores 1 and 0; sample 0 ends on an observation (exact fill)
    full = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    sampled = torch.tensor([[1, 0, 0, 0], [1, 0, 1, 0]])
    rewards = scores_on_last_sampled([1.0, 0.0], sampled, full)
    total = rewards.sum(-1)  # what EasyR1's outcome estimators read
    assert total.tolist() == [1.0, 0.0]
    assert rewards[0, 0] == 1.0  # on a token the loss sees
    # GRPO: (s - mean) / (std + 1e-6), torch.std unbiased: std of {1, 0} = sqrt(1/2)
    grpo = (total - 0.5) / (math.sqrt(0.5) + 1e-6)
    assert (grpo.unsqueeze(-1) * sampled)[0].tolist() == pytest.approx([0.7071058, 0, 0, 0], abs=1e-6)
    # RLOO: s - mean of the others = +1, -1; pass@k: best gets (r_max - r_2nd) / (std + 1e-6), the other 0
    assert (total - total.flip(0)).tolist() == [1.0, -1.0]
    assert (1.0 - 0.0) / (math.sqrt(0.5) + 1e-6) == pytest.approx(1.4142107, abs=1e-6)


@pytest.mark.parametrize("name", ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "remax"])
def test_supported_estimators_pass_the_check(name):
    assert glue.check_estimator(name) == []


def test_gae_is_refused_with_the_reason():
    [problem] = glue.check_estimator("gae")
    assert "gae" in problem and "Boolean value of Tensor" in problem
    assert "unknown" in glue.check_estimator("ppo_magic")[0]

    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    rollout = Obj(name=glue.AGENT_ROLLOUT_NAME, page_min_pixels=None, page_max_pixels=None,
                  prompt_length=10, response_length=10, max_num_batched_tokens=100)
    config = Obj(data=Obj(min_pixels=None, max_pixels=None), worker=Obj(rollout=rollout),
                 algorithm=Obj(adv_estimator="gae"))
    assert any("gae" in p for p in glue.check_agent_config(config))
    config.algorithm.adv_estimator = "grpo"
    assert glue.check_agent_config(config) == []


def test_easyr1_gae_really_fails_on_batches_of_two():
    """The refusal's reason, checked: EasyR1's GAE branches on a batch column."""
    mask = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="Boolean value of Tensor"):
        if mask[:, 0]:  # the statement in compute_gae_advantage_return
            pass


# ---- ReMax: the trainer's sequence of pops and unions, on the trainer's DataProto ----
class FakeAgent:
    """Returns what the agent returns (shapes and columns), n samples per prompt."""

    inference_engine = "engine"

    def generate_sequences(self, prompts):
        from verl.protocol import DataProto

        n = int(prompts.meta_info.get("n", 2))
        greedy = prompts.meta_info.get("temperature") == 0
        rows = len(prompts.batch) * n
        docs = np.repeat(prompts.non_tensor_batch["doc_id"], n)
        pages = [[[f"{docs[r]}_{1 if greedy else r + 2}"]] for r in range(rows)]
        mm = [{"images": ["prompt.png", f"page{1 if greedy else r + 2}.png"]} for r in range(rows)]
        response_mask = torch.tensor([[1, 1, 1, 1]] * rows)
        loss_mask = torch.tensor([[1, 0, 0, 1]] * rows)
        tensors = {"prompts": prompts.batch["input_ids"].repeat_interleave(n, 0),
                   "responses": torch.full((rows, 4), 7),
                   "input_ids": torch.cat([prompts.batch["input_ids"].repeat_interleave(n, 0), torch.full((rows, 4), 7)], -1),
                   "attention_mask": torch.ones(rows, 6, dtype=torch.long),
                   "response_mask": response_mask, "loss_mask": loss_mask}
        non_tensors = {"multi_modal_data": np.array(mm, dtype=object), "doc_id": docs,
                       "page_ids": np.array(pages + [None], dtype=object)[:-1],
                       "termination_reason": np.array(["answered"] * rows, dtype=object)}
        meta = dict(prompts.meta_info, metrics={"rollout/turns_mean": 2.0 if not greedy else 1.0})
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def _trainer_batch():
    from verl.protocol import DataProto

    truth = json.dumps({"answer": "a", "doc_id": "d", "gold_pages": [1]})
    batch = DataProto.from_single_dict({
        "input_ids": torch.ones(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2, dtype=torch.long),
        "position_ids": torch.zeros(2, 2, dtype=torch.long),
        "raw_prompt_ids": np.array([None, None], dtype=object),
        "multi_modal_data": np.array([{"images": ["prompt.png"]}] * 2, dtype=object),
        "doc_id": np.array(["d", "e"], dtype=object), "ground_truth": np.array([truth, truth], dtype=object),
    }, meta_info={"min_pixels": 1, "max_pixels": 10, "video_fps": 2.0})
    batch.non_tensor_batch["raw_prompt_ids"] = np.array([[1], [2]] + [None], dtype=object)[:-1]
    batch.non_tensor_batch["uid"] = np.array(["u1", "u2"], dtype=object)
    return batch


def _remax_step(generate):
    """ray_trainer._make_batch_data's ReMax branch (b44b311), step by step."""
    from verl.protocol import DataProto

    pop = glue.make_generation_pop(DataProto.pop)
    new_batch = _trainer_batch()
    gen_batch = pop(new_batch, batch_keys=["input_ids", "attention_mask", "position_ids"],
                    non_tensor_batch_keys=["raw_prompt_ids", "multi_modal_data"],
                    meta_info_keys=["min_pixels", "max_pixels", "video_fps"])
    gen_output = generate(gen_batch)
    baseline_batch = copy.deepcopy(gen_batch)
    baseline_batch.meta_info["temperature"] = 0
    baseline_batch.meta_info["n"] = 1
    baseline_output = generate(baseline_batch)
    new_batch = new_batch.union(baseline_output)
    baseline_view = glue.reward_view(new_batch)  # what the baseline's reward function reads
    new_batch.pop(batch_keys=list(baseline_output.batch.keys()))
    new_batch = new_batch.repeat(repeat_times=2, interleave=True)
    return new_batch.union(gen_output), baseline_view


def test_remax_baseline_output_is_stripped_and_the_step_goes_through():
    adapter = glue.EasyR1RolloutAdapter(FakeAgent())
    batch, baseline_view = _remax_step(adapter.generate_sequences)
    assert len(batch) == 4
    assert [m["images"][1] for m in batch.non_tensor_batch["multi_modal_data"]] == [
        "page2.png", "page3.png", "page4.png", "page5.png"]  # the samples' pages, not the baseline's
    assert torch.equal(batch.batch["response_mask"], torch.tensor([[1, 0, 0, 1]] * 4))  # loss mask
    # the baseline's reward saw its own (greedy) pages
    truths = [json.loads(t) for t in baseline_view.non_tensor_batch["ground_truth"]]
    assert [t["page_ids"] for t in truths] == [[["d_1"]], [["e_1"]]]
    # and the samples' reward sees theirs, not the baseline's
    sample_truths = [json.loads(t) for t in glue.reward_view(batch).non_tensor_batch["ground_truth"]]
    assert [t["page_ids"] for t in sample_truths] == [[["d_2"]], [["d_3"]], [["e_4"]], [["e_5"]]]
    assert batch.non_tensor_batch[glue.METRICS_COLUMN][0] == {"rollout/turns_mean": 2.0}


def test_remax_without_stripping_fails_as_reported():
    agent = FakeAgent()
    with pytest.raises((ValueError, AssertionError), match="multi_modal_data|not the same"):
        _remax_step(lambda prompts: glue.easyr1_masks(agent.generate_sequences(prompts)))


def test_only_the_remax_baseline_call_is_recognised():
    mark = glue.GENERATION_MARK
    assert glue.is_remax_baseline({mark: True, "temperature": 0, "n": 1})
    assert not glue.is_remax_baseline({mark: True})                       # the training generation
    assert not glue.is_remax_baseline({"temperature": 0, "n": 1, "top_p": 1.0})  # greedy validation


def test_real_easyr1_reinforce_plus_plus_is_replaced():
    if glue.easyr1_location() is None:
        pytest.skip("EasyR1 is not installed")
    glue.install_agent_rollout(rollout=False, multi_modal_cache=False, generation_columns=False, reward_view=False)
    from verl.trainer.core_algos import compute_advantage_return

    _, returns = compute_advantage_return("reinforce_plus_plus", token_level_rewards=AGENT_REWARD,
                                          response_mask=AGENT_MASK, gamma=GAMMA, index=None)
    assert returns[0, [0, 1, 4, 5]].tolist() == [0.125, 0.25, 0.5, 1.0]


# ---- the engine EasyR1 builds: vision input-norm buffers after a dummy load ----
def test_vision_input_norm_buffers_are_restored_after_a_dummy_load():
    pytest.importorskip("vllm")
    from torch import nn
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm

    from vrag_rollout.engine.input_norms import restore_input_norms

    mean, std, rescale = [0.5, 0.4, 0.3], [0.25, 0.5, 1.0], 1 / 255
    with set_current_vllm_config(VllmConfig()):
        model = nn.Sequential(nn.Linear(2, 2), FusedMMInputNorm(mean, std, rescale))
        with torch.no_grad():  # what vLLM's dummy loader does to persistent buffers
            model[1].weight.uniform_(-1e-3, 1e-3)
            model[1].bias.uniform_(-1e-3, 1e-3)
        linear = model[0].weight.clone()
        assert restore_input_norms(model, make_norm=lambda: FusedMMInputNorm(mean, std, rescale)) == 1
    # by hand: weight = rescale / std, bias = -mean / std
    assert model[1].weight.tolist() == pytest.approx([4 / 255, 2 / 255, 1 / 255])
    assert model[1].bias.tolist() == pytest.approx([-2.0, -0.8, -0.3])
    assert torch.equal(model[0].weight, linear)  # nothing else touched
    assert restore_input_norms(nn.Linear(2, 2), make_norm=None) == 0
