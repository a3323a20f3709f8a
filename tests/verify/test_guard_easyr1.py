"""The live guard wired into EasyR1's path (`integrations/easyr1/guard.py`), on a real rollout
batch, through the stand-in EasyR1 of `tests/rollout/test_easyr1_integration.py` (EasyR1 is not
installed here; `scripts/check_easyr1.py --plant all` runs the same against a real checkout).

The rollout worker's dispatcher builds the adapter with a `LiveGuard` from `worker.rollout`'s
fields; the adapter guards the agent's batch before EasyR1's masks; the trainer's patched
`compute_data_metrics` turns the rows' verdicts and the old log-probs into `guard/` metrics.
The batch is a rollout of the released-shape tiny Qwen2-VL: the released ids and logits width, as
EasyR1 meets them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.rollout.test_easyr1_integration import _agent_config, easyr1  # noqa: F401 (a fixture)
from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import roll
from tests.verify.test_guard import trainer_batch
from vrag_rollout.devkit.planted_defects import DEFECTS, plant
from vrag_rollout.integrations import easyr1 as glue
from vrag_rollout.verify.guard import GUARD_COLUMN, GuardFailure
from vrag_rollout.verify.saved_batch import load_rollout

SERVED: list = []  # the batch the stand-in agent "generates"


@pytest.fixture(scope="module")
def released_processor(released_qwen2vl):
    return released_qwen2vl.processor


@pytest.fixture(scope="module")
def released_rollout(released_qwen2vl, tmp_path_factory):
    """The demo grammar's rollout (as `grammar_rollout`) on the released-shape model."""
    model = released_qwen2vl
    path = tmp_path_factory.mktemp("released") / "grammar.pt"
    return roll(model.model_dir, model.processor, model.llm, sample_prompts(6), path, calculate_log_probs=True)


class ServedBatch:
    """An agent whose generate_sequences returns the next prepared batch (a real rollout's)."""

    def __init__(self, model_path, config, tokenizer, processor, *, inference_engine=None, **kwargs):
        self.config, self.inference_engine = config, inference_engine

    def generate_sequences(self, prompts):
        return SERVED.pop(0)


def easyr1_batch(saved):
    """The rollout's batch as EasyR1's DataProto (the stand-in's) holds it."""
    from verl.protocol import DataProto

    plain = trainer_batch(saved)
    tensors = TensorDict({k: v.clone() for k, v in plain.batch.items()}, batch_size=[len(saved)])
    return DataProto(tensors, dict(plain.non_tensor_batch), dict(plain.meta_info))


@pytest.fixture
def worker_rollout(easyr1, released_rollout, released_processor, monkeypatch, tmp_path):  # noqa: F811
    def build(mode):
        monkeypatch.setenv(glue.AGENT_CLASS_ENV, f"{__name__}:ServedBatch")
        glue.install_agent_rollout()
        import verl.workers.fsdp_workers as fw

        # every sample's positions compared, so the shifted-positions sample is always among them
        config = _agent_config(guard=mode, guard_samples_dir=str(tmp_path / mode), n=2, guard_positions_fraction=1.0)
        return fw.vLLMRollout(model_path=str(released_rollout.model_dir), config=config, tokenizer=None,
                              processor=released_processor)
    return build


def test_drop_in_the_worker_and_guard_metrics_in_the_trainer(worker_rollout, released_rollout, released_processor,
                                                            tmp_path):
    from verl.protocol import DataProto
    from verl.trainer import ray_trainer

    rollout = worker_rollout("drop")
    assert isinstance(rollout, glue.EasyR1RolloutAdapter) and rollout._live_guard.mode == "drop"
    batch = easyr1_batch(load_rollout(released_rollout.path))
    taken: set = set()
    planted = sorted(plant(name, batch, released_processor, taken) for name in DEFECTS)
    SERVED.append(batch)
    out = rollout.generate_sequences(DataProto(None, {}, {}))
    # EasyR1's loss mask (response_mask) is the agent's loss mask, zeroed on exactly the planted samples
    bad = [s for s in range(len(out.batch["responses"])) if out.non_tensor_batch[GUARD_COLUMN][s]["bad"]]
    assert bad == planted
    assert torch.equal(out.batch["response_mask"], out.batch["loss_mask"])
    kept = [s for s in range(len(out.batch["responses"])) if s not in planted]
    assert int(out.batch["response_mask"][planted].sum()) == 0 and int(out.batch["response_mask"][kept].sum()) > 0
    assert sorted(p.name for p in (tmp_path / "drop").iterdir()) == ["step_00001.pt"]  # the bad samples, saved

    # the trainer: old log-probs union'd in, then its per-step metrics (patched) carry guard/
    out.batch["old_log_probs"] = out.batch["rollout_log_probs"] + 0.5 * (out.batch["turn_ids"] == 2)
    out.meta_info["action_grammar"] = False  # the drift's arithmetic; the grammar case is refused below
    metrics = ray_trainer.compute_data_metrics(out, use_critic=False)
    assert metrics["guard/checked"] == len(out.batch["responses"]) and metrics["guard/dropped"] == len(planted)
    assert metrics["guard/bad"] == len(planted) and metrics["guard/bad/positions"] >= 1
    assert metrics["guard/drift/turn_2/mean"] == pytest.approx(0.5) and metrics["guard/drift/turn_1/max"] == 0
    assert metrics["guard/drift/worst_turn"] == 2 and "response_length/mean" in metrics
    out.meta_info["action_grammar"] = True
    assert not any(k.startswith("guard/drift") for k in ray_trainer.compute_data_metrics(out))


def test_fail_stops_the_step_and_off_builds_no_guard(worker_rollout, released_rollout, released_processor):
    from verl.protocol import DataProto

    rollout = worker_rollout("fail")
    batch = easyr1_batch(load_rollout(released_rollout.path))
    row = plant("past_the_stop", batch, released_processor, set())
    SERVED.append(batch)
    with pytest.raises(GuardFailure, match=f"sample {row}"):
        rollout.generate_sequences(DataProto(None, {}, {}))
    assert worker_rollout("off")._live_guard is None
    clean = easyr1_batch(load_rollout(released_rollout.path))
    SERVED.append(clean)
    out = worker_rollout("warn").generate_sequences(DataProto(None, {}, {}))
    assert not any(verdict["bad"] for verdict in out.non_tensor_batch[GUARD_COLUMN])
    assert isinstance(out.non_tensor_batch[GUARD_COLUMN], np.ndarray)
