"""The example verl jobs (examples/verl/): every override of each script is accepted by verl
0.9.1's own `ppo_trainer` config (composed by hydra as `verl.trainer.main_ppo` composes it), and
the agent-loop file each names registers `vrag_agent` with settings the agent accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("hydra", reason="verl's config is composed with hydra-core (the test extra)")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "examples" / "verl").glob("grpo_*.sh"))


def overrides(script: Path) -> list[str]:
    return re.findall(r"^\s+([\w.]+=\S+?)\s*\\$", script.read_text(), re.MULTILINE)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_verl_accepts_every_override(script):
    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    found = overrides(script)
    assert len(found) > 20 and any(o.startswith("actor_rollout_ref.rollout.agent.agent_loop_config_path=") for o in found)
    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=found)  # an unknown key is refused here
    rollout = config.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "vrag_agent" and rollout.mode == "async"
    assert config.data.max_response_length == rollout.response_length  # one episode budget, stated once
    assert OmegaConf.select(config, "reward.custom_reward_function.name") == "compute_score"
    assert (REPO / config.reward.custom_reward_function.path).is_file()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_agent_loop_file_registers_the_agent_with_valid_settings(script):
    from omegaconf import OmegaConf

    from vrag_rollout.config import AgentRolloutConfig
    from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME, VragAgentLoop

    path = next(o.split("=", 1)[1] for o in overrides(script) if "agent_loop_config_path=" in o)
    entries = OmegaConf.to_container(OmegaConf.load(REPO / path))
    (entry,) = [e for e in entries if e["name"] == AGENT_NAME]
    module, _, name = entry["_target_"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is VragAgentLoop
    AgentRolloutConfig(**entry["vrag"], prompt_length=1024, response_length=4096)  # unknown keys refused
    assert entry["vrag"]["action_format"] == ("tool_call" if "tool_call" in script.stem else "tags")
