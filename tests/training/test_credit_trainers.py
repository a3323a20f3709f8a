"""The turn-level estimators in each trainer's path, on real rollout batches of the tiny model:

- verl 0.9.1: the batch verl's own `AgentLoopWorker` built (the guarded worker of
  tests/integrations/test_verl_guard.py: verl's `_postprocess`, the guard's `turn_ids` tensor),
  scored by the project's reward; `vrag_turn` and `vrag_gigpo` through verl's registry
  (`get_adv_estimator_fn`) and through verl's `ray_trainer.compute_advantage` (patched to hand
  them the batch's columns), checked by `training/credit_check.py`, with the metrics in verl's
  `compute_data_metrics`;
- EasyR1: the stand-in laid out like EasyR1 (tests/rollout/test_easyr1_integration.py; EasyR1 is
  not installed here), given EasyR1's enum check and `compute_advantage` (b44b311, quoted in
  /work/shared/facts/segments-and-estimators.md), on a rollout of the two-pages task by the agent;
  `vrag-rollout view` of that rollout shows each turn's reward.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from tests.integrations.test_verl_guard import N, rolled  # noqa: F401 (a fixture)
from tests.rollout.test_easyr1_integration import easyr1  # noqa: F401 (a fixture)
from vrag_rollout.training.credit_check import check_credit
from vrag_rollout.training.learn import episode_scores

pytestmark = pytest.mark.engine


def demo_truths(count: int) -> list:
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from vrag_rollout.devkit.demo import demo_questions

    truths = []
    for sample in demo_questions()[:count]:
        fact = sample.question.removeprefix("Which page covers ").removesuffix("?")
        doc, page = SAMPLE_FACTS[fact]
        truths.append({"answer": str(page), "doc_id": doc, "gold_pages": [page]})
    return truths


def last_sampled_scores(mask: torch.Tensor, rewards: list) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for row, score in enumerate(rewards):
        out[row, int(mask[row].nonzero().max())] = score
    return out


def test_verl_registry_and_trainer_path_on_verls_own_batch(rolled, tiny_processor):
    from verl.trainer.ppo import core_algos, ray_trainer

    from vrag_rollout.integrations.verl import turn_estimators

    data = rolled.batch
    truths = demo_truths(len(data) // N)
    scores = episode_scores(data, tiny_processor.tokenizer, truths)
    mask = data.batch["response_mask"]  # verl's: 1 on the tokens the policy sampled
    data.batch["token_level_rewards"] = last_sampled_scores(mask, [s["overall"] for s in scores])
    data.non_tensor_batch["reward_model"] = np.array([{"ground_truth": json.dumps(truths[r // N])}
                                                      for r in range(len(data))], dtype=object)
    index = data.non_tensor_batch["uid"]
    assert data.batch["turn_ids"].max() >= 2  # multi-turn episodes

    # the registry, tensors only: turns are the runs of sampled tokens
    registry = core_algos.get_adv_estimator_fn("vrag_turn")
    alone, _ = registry(token_level_rewards=data.batch["token_level_rewards"], response_mask=mask, index=index, config=None)

    assert turn_estimators.patch_compute_advantage() in (True, False)
    assert getattr(ray_trainer.compute_advantage, turn_estimators.MARK)
    pages = turn_estimators.turn_page_ids_from(data.non_tensor_batch["page_ids"], data.batch["turn_ids"], mask)
    assert [[p for t in row for p in t] for row in pages] == [[p for o in row for p in o] for row in data.non_tensor_batch["page_ids"]]
    checked = type("Batch", (), {})()
    checked.batch = {"turn_ids": data.batch["turn_ids"], "response_mask": mask}
    checked.non_tensor_batch = {"turn_page_ids": np.array(pages + [None], dtype=object)[:-1]}
    off = [[0.0] * (len(p) - 1) + [s["overall"]] for p, s in zip(pages, scores)]
    for name, estimator in (("vrag_turn", "turn"), ("vrag_gigpo", "gigpo")):
        out = ray_trainer.compute_advantage(data, name)
        advantages = out.batch["advantages"]
        assert check_credit(checked, truths, scores, off, advantages, estimator, N, mask_key="response_mask") == []
        assert advantages.abs().sum() > 0 and advantages[mask == 0].abs().max() == 0
        if name == "vrag_turn":  # the rollout's turn ids and the mask's runs agree on this batch
            assert torch.equal(advantages, alone)
        found = out.meta_info[turn_estimators.METRICS_KEY]
        assert {"reward/turn/1/mean", "advantage/turn/1/mean", "advantage/turn/2/std"} <= set(found)
    # the planted mistake is caught on the real batch too
    planted = advantages.clone()
    row, col = ((data.batch["turn_ids"] > 0) & (mask == 0)).nonzero()[0].tolist()
    planted[row, col] = 1.0
    assert check_credit(checked, truths, scores, off, planted, "gigpo", N, mask_key="response_mask")
    # the metrics reach what verl's trainer logs
    data.batch["token_level_scores"] = data.batch["token_level_rewards"]
    data.batch["returns"] = data.batch["advantages"]
    logged = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    assert "reward/turn/1/mean" in logged and "advantage/turn/1/mean" in logged


EASYR1_CORE_ALGOS = '''
    from enum import Enum

    class AdvantageEstimator(str, Enum):  # b44b311 core_algos.py:76-86
        GAE = "gae"
        GRPO = "grpo"
        REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
        REMAX = "remax"
        RLOO = "rloo"

    def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma, **kwargs):
        raise AssertionError("EasyR1's REINFORCE++ must have been replaced")

    ADV_ESTIMATOR_MAP = {"reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage}

    def compute_advantage_return(name, **kwargs):
        return ADV_ESTIMATOR_MAP[name](**kwargs)
'''

EASYR1_RAY_TRAINER = '''
    from .core_algos import AdvantageEstimator, compute_advantage_return

    def check_estimator(name):  # RayPPOTrainer.__init__, ray_trainer.py:208-209
        if name not in list(AdvantageEstimator):
            raise NotImplementedError(f"Unknown advantage estimator: {name}.")

    def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0):  # ray_trainer.py:137-155
        adv_inputs = {"token_level_rewards": data.batch["token_level_rewards"],
                      "response_mask": data.batch["response_mask"], "index": data.non_tensor_batch["uid"],
                      "gamma": gamma, "lam": lam}
        data.batch["advantages"], data.batch["returns"] = compute_advantage_return(adv_estimator, **adv_inputs)
        return data

    def compute_data_metrics(batch, use_critic=False):
        return {"response_length/mean": float(batch.batch["response_mask"].sum(-1).float().mean())}
'''


def test_easyr1_enum_check_and_compute_advantage_on_a_two_pages_rollout(easyr1, tiny_model_dir, tiny_processor,
                                                                        tiny_llm, tmp_path):
    from tensordict import TensorDict

    from tests.rollout.agent_helpers import make_agent, prompt_batch
    from tests.rollout.learn_runs import fixture_retriever
    from vrag_rollout.devkit.credit_task import credit_questions, credit_regex
    from vrag_rollout.integrations import easyr1 as glue

    for rel, text in (("trainer/core_algos.py", EASYR1_CORE_ALGOS), ("trainer/ray_trainer.py", EASYR1_RAY_TRAINER)):
        (easyr1 / rel).write_text(textwrap.dedent(text))
    samples, truths = credit_questions(3)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, fixture_retriever(), n=4,
                       max_turns=3, action_regex=credit_regex(), seed=3)
    output = agent.generate_sequences(prompt_batch(tiny_processor, samples, agent))
    scores = episode_scores(output, tiny_processor.tokenizer, truths)
    n = len(output) // len(truths)

    glue.install_agent_rollout()
    from verl.protocol import DataProto
    from verl.trainer import ray_trainer

    with pytest.raises(NotImplementedError):
        ray_trainer.check_estimator("vrag_nonsense")
    ray_trainer.check_estimator("vrag_turn")  # the enum now holds ours
    ray_trainer.check_estimator("vrag_gigpo")
    assert glue.check_estimator("vrag_gigpo") == []

    mask = output.batch["loss_mask"]  # the adapter's response_mask (easyr1_masks)
    tensors = {"response_mask": mask.clone(), "turn_ids": output.batch["turn_ids"].clone(),
               "token_level_rewards": last_sampled_scores(mask, [s["overall"] for s in scores])}
    columns = {"uid": np.array([f"u{r // n}" for r in range(len(output))], dtype=object),
               "turn_page_ids": output.non_tensor_batch["turn_page_ids"],
               "ground_truth": np.array([json.dumps(truths[r // n]) for r in range(len(output))], dtype=object)}
    for name, estimator in (("vrag_turn", "turn"), ("vrag_gigpo", "gigpo")):
        data = DataProto(TensorDict(dict(tensors), batch_size=[len(output)]), dict(columns), {})
        data = ray_trainer.compute_advantage(data, ray_trainer.AdvantageEstimator(name))
        off = [[0.0] * (len(p) - 1) + [s["overall"]] for p, s in zip(output.non_tensor_batch["turn_page_ids"], scores)]
        checked = type("Batch", (), {"batch": {**tensors, "loss_mask": mask}, "non_tensor_batch": columns})()
        assert check_credit(checked, truths, scores, off, data.batch["advantages"], estimator, n) == []
        logged = ray_trainer.compute_data_metrics(data)
        assert "response_length/mean" in logged and "reward/turn/1/mean" in logged and "advantage/turn/1/mean" in logged
    assert max(len(p) for p in columns["turn_page_ids"]) >= 2

    # `vrag-rollout view` of the same rollout: a `per turn` line per episode whose values are its
    # reward split by turn, the view's own arithmetic (verify/ imports only verify/) against core.turn_rewards
    import re

    from vrag_rollout.core.turn_rewards import PRESETS, turn_rewards
    from vrag_rollout.devkit.demo import add_truths_and_rewards
    from vrag_rollout.verify.saved_batch import save_rollout
    from vrag_rollout.verify.view import write_html

    add_truths_and_rewards(output, tiny_processor.tokenizer, truths)
    path = tmp_path / "credit.pt"
    save_rollout(output, path, processor=tiny_processor, model_path=tiny_model_dir, config=agent.config)
    write_html(path, tmp_path / "credit.html")
    lines = re.findall(r'<p class="reward turns"><b>per turn</b> (.*?)</p>', (tmp_path / "credit.html").read_text())
    assert len(lines) == len(output)
    for row, line in enumerate(lines):
        values = [float(v) for v in re.findall(r"turn \d+ (-?[0-9.]+)", line)]
        pages = output.non_tensor_batch["turn_page_ids"][row]
        want = turn_rewards(pages, output.non_tensor_batch["reward"][row], truths[row // n], PRESETS["retrieval"]).total
        assert values == pytest.approx(want, abs=0.005 + 1e-9), (line, want)
    assert any(v > 0 for line in lines for v in map(float, re.findall(r"turn \d+ (-?[0-9.]+)", line)[:-1]))

