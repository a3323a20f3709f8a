"""The example verl jobs (examples/verl/): every override of each script is accepted by verl
0.9.1's own `ppo_trainer` config (composed by hydra as `verl.trainer.main_ppo` composes it), and
the agent-loop file each names registers `vrag_agent` with settings the agent accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

pytest.importorskip("hydra", reason="verl's config is composed with hydra-core (the test extra)")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (REPO / "examples" / "verl").glob("grpo_*.sh"))


def overrides(script: Path, tmp_path: Path) -> list[str]:
    """The trainer arguments the example passes, as the shell expands them: the script runs with a
    `python` on the PATH that prints its arguments instead of training."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(script), "trainer.total_epochs=2"], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{fake.parent}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    return args[2:]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_verl_accepts_every_override(script, tmp_path):
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    found = overrides(script, tmp_path)
    assert found[-1] == "trainer.total_epochs=2"  # the caller's arguments come last: they win
    assert len(found) > 20 and any(o.startswith("actor_rollout_ref.rollout.agent.agent_loop_config_path=") for o in found)
    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=found)  # an unknown key is refused here
    rollout = config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "vrag_agent" and rollout.mode == "async"
    assert rollout.multi_turn.enable  # else the fully async trainer swaps vrag_agent for single_turn_agent
    assert config.data.max_response_length == rollout.response_length  # one episode budget, stated once
    assert OmegaConf.select(config, "reward.custom_reward_function.name") == "compute_score"
    assert (REPO / config.reward.custom_reward_function.path).is_file()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_agent_loop_file_registers_the_agent_with_valid_settings(script, tmp_path):
    from omegaconf import OmegaConf

    from vrag_rollout.config import AgentRolloutConfig
    from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME, VragAgentLoop

    path = next(o.split("=", 1)[1] for o in overrides(script, tmp_path) if "agent_loop_config_path=" in o)
    entries = OmegaConf.to_container(OmegaConf.load(REPO / path))
    (entry,) = [e for e in entries if e["name"] == AGENT_NAME]
    module, _, name = entry["_target_"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is VragAgentLoop
    AgentRolloutConfig(**entry["vrag"], prompt_length=1024, response_length=4096)  # unknown keys refused
    assert entry["vrag"]["action_format"] == ("tool_call" if "tool_call" in script.stem else "tags")
