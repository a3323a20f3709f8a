"""EasyR1's GRPO advantages and policy loss agree with volcengine verl's, which the project trains with.

`vrag_rollout/training/grpo.py` (`vrag-rollout learn`) takes its math from volcengine verl
(`grpo_advantages`, `policy_loss`); an EasyR1 job takes it from EasyR1's `verl.trainer.core_algos`.
On one agent-shaped batch (observation holes and padding in the loss mask, a group whose rewards
are all equal, ratios past both clip bounds and past the dual clip) both give the same advantages,
loss, loss gradient and clip metrics, with EasyR1's default clip settings handed to verl's config
(the defaults differ: EasyR1 clips the ratio at 1 + 0.3 above, verl at 1 + 0.2).

Skipped where EasyR1 is not the importable `verl` (CI), as the other real-EasyR1 tests are. Both
packages are named `verl`: EasyR1's is loaded from its folder under another name, and verl's runs
in a child process whose path holds only this repository (so the venv's verl, not EasyR1, is found).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vrag_rollout.integrations import easyr1 as glue

REPO = Path(__file__).resolve().parents[2]
ALIAS = "easyr1_verl_core_algos_test"  # EasyR1's `verl` under a name that cannot clash

N = 4  # samples per prompt
# 3 prompts x N samples, response length 8. loss mask: 1 = sampled by the policy, 0 = an observation
# (inside a response) or padding (after it); every row ends with sampled tokens or padding.
RESPONSE = torch.tensor([[1] * 8] * 4 + [[1] * 6 + [0] * 2] * 4 + [[1] * 8] * 4)
LOSS_MASK = torch.tensor([
    [1, 1, 0, 0, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0, 1, 1, 1],
    [1, 1, 1, 0, 0, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 0, 0],
    [1, 0, 0, 1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 0, 0],
    [1, 1, 0, 0, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 0, 0, 0, 0, 1, 1],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 0, 0, 1, 1],
]) * RESPONSE
REWARDS = [1.0, 0.0, 0.5, 0.1,  0.3, 0.3, 0.3, 0.3,  0.0, 0.0, 1.0, 0.6]  # the middle group: all equal

# EasyR1 loss_avg_mode -> verl loss_agg_mode with the same definition
LOSS_MODES = {"token": "token-mean", "seq": "seq-mean-token-mean"}

VERL_SIDE = """
import json, sys
from types import SimpleNamespace
import torch
import verl
from vrag_rollout.training import grpo

inputs = torch.load(sys.argv[1])
batch = SimpleNamespace(batch={"response_mask": inputs["response_mask"], "loss_mask": inputs["loss_mask"]})
advantages = grpo.grpo_advantages(batch, inputs["rewards"], inputs["n"])
out = {"verl": verl.__file__, "advantages": advantages, "losses": {}}
for mode, fields in inputs["configs"].items():
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    loss, metrics = grpo.policy_loss(log_prob, inputs["old_log_prob"], advantages, inputs["loss_mask"],
                                     grpo.actor_config(inputs["n"], **fields))
    loss.backward()
    out["losses"][mode] = {"loss": loss.detach(), "grad": log_prob.grad, "metrics": metrics}
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def easyr1():
    """EasyR1's `verl` package loaded afresh from its folder under `ALIAS` (no patch of the
    integration applied to it), or a skip where EasyR1 is not installed."""
    root = glue.easyr1_location()
    if root is None:
        pytest.skip("EasyR1 is not installed")
    spec = importlib.util.spec_from_file_location(ALIAS, root / "__init__.py", submodule_search_locations=[str(root)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[ALIAS] = package
    try:
        spec.loader.exec_module(package)
        yield {"core_algos": importlib.import_module(f"{ALIAS}.trainer.core_algos"),
               "actor_config": importlib.import_module(f"{ALIAS}.workers.actor.config"), "root": root}
    finally:
        for name in [m for m in sys.modules if m == ALIAS or m.startswith(ALIAS + ".")]:
            del sys.modules[name]


def log_probs() -> tuple[torch.Tensor, torch.Tensor]:
    """(old, new) log-probs: new - old spans both clip bounds and the dual clip; masked positions
    hold absurd values that must not matter."""
    generator = torch.Generator().manual_seed(0)
    old = -3.0 * torch.rand(LOSS_MASK.shape, generator=generator)
    new = old + 0.6 * torch.randn(LOSS_MASK.shape, generator=generator)
    new[1, 0] = old[1, 0] + 1.5   # ratio 4.5 > dual clip 3 on a negative advantage (row 1: reward 0)
    new[0, 1] = old[0, 1] + 0.5   # ratio 1.65, past 1 + clip_ratio_high on a positive advantage
    new[2, 7] = old[2, 7] - 0.5   # ratio 0.61, below 1 - clip_ratio_low on a negative advantage
    new[LOSS_MASK == 0] = old[LOSS_MASK == 0] + 10.0
    return old, new


def easyr1_reward_tensor() -> torch.Tensor:
    """Each row's score on its last sampled token, as EasyR1's reward manager (with the
    integration's patch) places it."""
    out = torch.zeros(LOSS_MASK.shape)
    for row, score in enumerate(REWARDS):
        out[row, int(LOSS_MASK[row].nonzero().max())] = score
    return out


def easyr1_defaults(actor_config_module) -> dict:
    return {f.name: f.default for f in dataclasses.fields(actor_config_module.ActorConfig)
            if f.default is not dataclasses.MISSING}


def run_verl_side(tmp_path: Path, old: torch.Tensor, new: torch.Tensor, configs: dict) -> dict:
    """volcengine verl's numbers through `vrag_rollout.training.grpo`, in a child process."""
    inputs, outputs = tmp_path / "inputs.pt", tmp_path / "outputs.pt"
    torch.save({"response_mask": RESPONSE, "loss_mask": LOSS_MASK, "rewards": REWARDS, "n": N,
                "old_log_prob": old, "log_prob": new, "configs": configs}, inputs)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # not EasyR1's folder: the venv's verl
    done = subprocess.run([sys.executable, "-c", VERL_SIDE, str(inputs), str(outputs)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(outputs)


def test_grpo_advantages_and_policy_loss_match_verl(easyr1, tmp_path):
    core_algos = easyr1["core_algos"]
    defaults = easyr1_defaults(easyr1["actor_config"])
    old, new = log_probs()

    # EasyR1: advantages with the inputs ray_trainer.compute_advantage builds (uid groups of N)
    adv_inputs = {"token_level_rewards": easyr1_reward_tensor(), "response_mask": LOSS_MASK,
                  "index": np.array([f"uid-{row // N}" for row in range(len(REWARDS))], dtype=object),
                  "gamma": 1.0, "lam": 1.0}
    assert core_algos.ADV_ESTIMATOR_MAP["grpo"] is core_algos.compute_grpo_outcome_advantage
    advantages, _returns = core_algos.compute_grpo_outcome_advantage(**adv_inputs)

    # verl: EasyR1's default clip settings in verl's ActorConfig, for each loss averaging mode
    configs = {mode: {"clip_ratio_low": defaults["clip_ratio_low"], "clip_ratio_high": defaults["clip_ratio_high"],
                      "clip_ratio_c": defaults["clip_ratio_dual"], "loss_agg_mode": agg}
               for mode, agg in LOSS_MODES.items()}
    verl_out = run_verl_side(tmp_path, old, new, configs)
    assert not Path(verl_out["verl"]).is_relative_to(easyr1["root"]), verl_out["verl"]  # really the other verl

    torch.testing.assert_close(advantages, verl_out["advantages"], rtol=1e-6, atol=1e-6)
    assert advantages[LOSS_MASK == 0].abs().max() == 0            # nothing on observations or padding
    assert advantages[4:8].abs().max() == 0                      # equal rewards: no advantage
    assert advantages[0:4].abs().max() > 0.5 and advantages[8:12].abs().max() > 0.5

    for mode in LOSS_MODES:
        log_prob = new.clone().requires_grad_(True)
        # as DataParallelPPOActor.update_policy calls it, with EasyR1's defaults
        loss, metrics = core_algos.compute_policy_loss(
            old_log_probs=old, log_probs=log_prob, advantages=advantages, response_mask=LOSS_MASK,
            clip_ratio_low=defaults["clip_ratio_low"], clip_ratio_high=defaults["clip_ratio_high"],
            clip_ratio_dual=defaults["clip_ratio_dual"], tau_positive=defaults["tau_positive"],
            tau_negative=defaults["tau_negative"], loss_type=defaults["loss_type"], loss_avg_mode=mode)
        loss.backward()
        theirs = verl_out["losses"][mode]
        torch.testing.assert_close(loss.detach(), theirs["loss"], rtol=1e-5, atol=1e-7, msg=f"{mode} loss")
        torch.testing.assert_close(log_prob.grad, theirs["grad"], rtol=1e-5, atol=1e-7, msg=f"{mode} gradient")
        assert log_prob.grad[LOSS_MASK == 0].abs().max() == 0
        verl_metrics = theirs["metrics"]
        assert metrics["pg_clipfrac_higher"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-6)
        assert metrics["pg_clipfrac_lower"] == pytest.approx(verl_metrics["actor/pg_clipfrac_lower"], abs=1e-6)
        assert metrics["ppo_kl"] == pytest.approx(verl_metrics["actor/ppo_kl"], abs=1e-6)
        # the batch did reach the clipped branches it was built for
        assert metrics["pg_clipfrac_higher"] > 0 and metrics["pg_clipfrac_lower"] > 0, json.dumps(metrics)

