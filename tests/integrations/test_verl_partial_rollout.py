"""Partial rollouts as verl's fully asynchronous trainer runs them, on the real engine.

verl 0.9.1 interrupts a rollout for a weight sync by aborting the requests in flight; its
`FullyAsyncLLMServerClient.generate` then resubmits each with the tokens generated so far and
hands the loop one merged answer, with the weight versions it was sampled under
(`min_global_steps`, `max_global_steps`). Here verl's own client runs between `vrag_agent` and
the engine (`integrations/verl/local.py`'s worker), over a server that aborts every free turn
after a few tokens, twice (bumping the weight version), and answers the last resubmission in full.

Oracles: at temperature 0 (so a resubmitted request continues exactly where it was cut), every
episode equals the one the same worker samples with no interruption, token for token, with the
same masks and pages; the project's `check` passes on verl's batch; the trajectories that were
interrupted carry `min_global_steps` 1 and `max_global_steps` 2. The first turn
is a grammar-constrained tool call (never interrupted: a resubmitted request would restart its
grammar), so pages are shown before the interrupted turns.

The fully asynchronous trainer's data path: each row goes as its rollouter sends it (verl's
`prepare_single_generation_data`, the worker with the resume loop, a pickled `RolloutSample` on
verl's `MessageQueue`, a real Ray actor; all rows at once, as the rollouter keeps several samples
in flight), and the trainer's `assemble_batch_from_rollout_samples` builds the batch. Each abort is
a weight sync, and so is each tool call's time out. Oracles: the uninterrupted episodes again,
`check`, and each trajectory's weight versions and verl's partial-rollout statistics against the
versions the server recorded per trajectory. Without
`multi_turn.enable` verl swaps the rows' agent for `single_turn_agent`; the project's reward, called
by verl's reward manager, refuses those rows."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.engine.token_server import LocalTokenServer  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import SAMPLE_COLUMN  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROWS = 4
ABORT_AFTER = 6  # tokens a free turn's request gets before it is aborted
CUTS_PER_TURN = 2  # a turn is cut twice: its answer is merged from three requests


class AbortingServer(LLMServerClient):
    """The server verl's resume loop calls (its base class's `generate`): the engine, aborting the
    first request of each free turn after `ABORT_AFTER` tokens as a weight sync would, and moving
    to the next weight version when it does."""

    sync_every_abort = False  # True: each abort is a weight sync of its own (version + 1), else 1 -> 2 once
    sync_between_turns = False  # True: a sync (version + 1) also while each tool call is out

    def __init__(self, config, load_balancer_handle=None, *, engine: LocalTokenServer, **kwargs):
        self.config, self.engine = config, engine
        self.version, self.aborts = 1, 0
        # request id -> (the prompt length its resubmission has, times this turn was cut)
        self.resumes: dict[str, tuple[int, int]] = {}
        self.answered: dict[str, set] = collections.defaultdict(set)  # request id -> versions that sampled it

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
        params = dict(sampling_params)
        length, cuts = self.resumes.get(request_id, (None, 0))
        cuts = cuts if length == len(prompt_ids) else 0  # a new turn, or this turn resubmitted
        if self.sync_between_turns and cuts == 0 and request_id in self.answered:
            self.version += 1  # a later turn of a known trajectory: the weights changed during its tool call
        interrupt = "structured_outputs" not in params and cuts < CUTS_PER_TURN and params["max_tokens"] > ABORT_AFTER
        if interrupt:
            params["max_tokens"] = ABORT_AFTER
        answer = await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=params,
                                            image_data=image_data)
        extra = {"global_steps": self.version}
        self.answered[request_id].add(self.version)
        if interrupt and len(answer.token_ids) == ABORT_AFTER and answer.token_ids[-1] not in self.eos_ids:
            self.resumes[request_id] = (len(prompt_ids) + ABORT_AFTER, cuts + 1)
            self.aborts += 1
            self.version = self.version + 1 if self.sync_every_abort else 2  # weights synced while it was out
            return TokenOutput(token_ids=answer.token_ids, log_probs=answer.log_probs, stop_reason="aborted",
                               extra_fields=extra)
        return TokenOutput(token_ids=answer.token_ids, log_probs=answer.log_probs, stop_reason="completed",
                           extra_fields=extra)


class ResumingClient(FullyAsyncLLMServerClient, AbortingServer):
    """verl's fully async client (its `generate`: resubmit until not aborted, merge, record the
    weight versions) over the aborting server instead of Ray's load balancer."""


def settings_for(processor) -> dict:
    first_turn = demo_config(action_format="tool_call").first_turn_action_regex
    config = demo_config(**demo_page_band(processor), action_format="tool_call", n=1, temperature=0.0,
                         retriever_fixtures=str(SAMPLE_RETRIEVAL), max_turns=3, response_length=1024)
    config = dataclasses.replace(config, action_regex=None, first_turn_action_regex=first_turn)
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tiny_processor, tiny_llm):
    settings = settings_for(tiny_processor)
    samples = sample_prompts(ROWS, with_images=False)
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    plain = asyncio.run(worker.generate_sequences(prompt_rows(samples, "tool_call")))
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    client = ResumingClient(config=worker.config, engine=worker.llm_client)
    client.eos_ids = {tiny_processor.tokenizer.convert_tokens_to_ids("<|im_end|>"), tiny_processor.tokenizer.eos_token_id}
    worker.llm_client = client
    resumed = asyncio.run(worker.generate_sequences(prompt_rows(samples, "tool_call")))
    return plain, resumed, client


def test_interrupted_episodes_equal_the_uninterrupted_ones(runs):
    plain, resumed, client = runs
    assert client.aborts == CUTS_PER_TURN * ROWS, client.aborts  # every free turn was cut twice
    for key in ("responses", "response_mask", "attention_mask"):
        assert resumed.batch[key].tolist() == plain.batch[key].tolist(), key
    # resubmitted prefixes are recomputed by a prefill, not decoded: float noise only
    assert (resumed.batch["rollout_log_probs"] - plain.batch["rollout_log_probs"]).abs().max() < 1e-4
    for column in ("termination_reason", "page_ids"):
        assert list(resumed.non_tensor_batch[column]) == list(plain.non_tensor_batch[column]), column
    assert sum(len(turn) for turns in resumed.non_tensor_batch["page_ids"] for turn in turns) > 0


def test_the_resumed_batch_checks_and_carries_its_weight_versions(runs, tiny_model_dir):
    _, resumed, _ = runs
    report = check_batch(from_dataproto(resumed, model_path=tiny_model_dir), tiny_model_dir)
    assert report.ok, report.human()
    versions = list(zip(resumed.non_tensor_batch["min_global_steps"], resumed.non_tensor_batch["max_global_steps"]))
    assert (1, 2) in versions, versions  # a trajectory sampled across the sync
    assert all(lo is not None and hi is not None and lo <= hi for lo, hi in versions), versions


# ---- the fully asynchronous trainer's data path: rollouter -> Ray message queue -> trainer ----

class SyncingClient(ResumingClient):
    """verl's resume loop over the aborting server, each abort a weight sync of its own, and a sync
    while each trajectory's tool call is out (so a trajectory's first version is not its cut turn's)."""

    sync_every_abort = True
    sync_between_turns = True


def fully_async_config(worker, multi_turn: bool):
    from omegaconf import OmegaConf

    return OmegaConf.merge(worker.config, {"actor_rollout_ref": {"rollout": {"n": 1, "multi_turn": {"enable": multi_turn}}},
                                           "trainer": {"balance_batch": False}})


def single_sample_rows(samples, row: int, config):
    """One dataset row as the rollouter feeds it: verl's `prepare_single_generation_data` of the
    row's dict (repeated `n` times), with the uid the rollouter gives it."""
    import numpy as np
    from verl.experimental.fully_async_policy.detach_utils import prepare_single_generation_data

    rows = prompt_rows(samples[row:row + 1], "tool_call")
    rows.non_tensor_batch[SAMPLE_COLUMN] = np.array([row], dtype=object)  # the uninterrupted run's seeds
    full = prepare_single_generation_data({**dict(rows.batch.items()), **rows.non_tensor_batch}, config)
    full.non_tensor_batch["uid"] = np.array([f"uid_sample_{row}"] * len(full), dtype=object)
    return full


@pytest.fixture(scope="module")
def queued(tiny_model_dir, tiny_processor, tiny_llm):
    """Each row goes the way verl's fully async rollouter sends it (one sample at a time through
    the worker, with verl's resume loop over weight syncs, pickled into a `RolloutSample` and put
    on the real `MessageQueue` Ray actor); the trainer's side takes them off the queue and
    assembles its batch with `assemble_batch_from_rollout_samples`."""
    ray = pytest.importorskip("ray")
    import numpy as np
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample, assemble_batch_from_rollout_samples
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient

    samples = sample_prompts(ROWS, with_images=False)
    worker = local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor))
    client = SyncingClient(config=worker.config, engine=worker.llm_client)
    client.eos_ids = {tiny_processor.tokenizer.convert_tokens_to_ids("<|im_end|>"), tiny_processor.tokenizer.eos_token_id}
    worker.llm_client = client
    config = fully_async_config(worker, multi_turn=True)

    async def rollouter_then_trainer():
        queue = MessageQueueClient(MessageQueue.remote(config, max_queue_size=ROWS))

        async def process_single_sample(row: int):  # the rollouter's per-sample task; all rows at once
            full = single_sample_rows(samples, row, config)
            out = await worker.generate_sequences(full)
            out.non_tensor_batch["uid"] = full.non_tensor_batch["uid"]  # as the rollouter re-sets it
            sample = RolloutSample(full_batch=out, sample_id=f"sample_{row}", epoch=0, rollout_status={"row": row})
            assert await queue.put_sample(ray.cloudpickle.dumps(sample))

        await asyncio.gather(*[process_single_sample(row) for row in range(ROWS)])
        taken = []
        for _ in range(ROWS):
            data, _left = await queue.get_sample()
            taken.append(ray.cloudpickle.loads(data))
        return taken

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    try:
        taken = asyncio.run(rollouter_then_trainer())
    finally:
        ray.shutdown()
    assert sorted(s.sample_id for s in taken) == [f"sample_{row}" for row in range(ROWS)]
    batch = assemble_batch_from_rollout_samples(taken, tiny_processor.tokenizer, config, None)
    assert [f"uid_{s.sample_id}" for s in taken] == list(batch.non_tensor_batch["uid"])  # in queue order
    assert isinstance(batch.non_tensor_batch["processing_times"][0], (float, np.floating))
    return batch, client


def row_of(uid: str) -> int:
    return int(uid.rsplit("_", 1)[1])


def test_the_fully_async_queue_delivers_the_uninterrupted_episodes(queued, runs):
    batch, _ = queued
    plain = runs[0]
    for i, uid in enumerate(batch.non_tensor_batch["uid"]):
        row = row_of(uid)
        for key in ("responses", "response_mask", "attention_mask", "prompts"):
            assert batch.batch[key][i].tolist() == plain.batch[key][row].tolist(), (key, row)
        for column in ("termination_reason", "page_ids"):
            assert batch.non_tensor_batch[column][i] == plain.non_tensor_batch[column][row], (column, row)


def test_the_assembled_batch_checks_and_its_partial_rollouts_match_the_servers_record(queued, tiny_model_dir):
    batch, client = queued
    report = check_batch(from_dataproto(batch, model_path=tiny_model_dir), tiny_model_dir)
    assert report.ok, report.human()
    # what the server saw: each trajectory (one request id) and the weight versions that sampled it
    seen = sorted((min(v), max(v)) for v in client.answered.values())
    carried = sorted(zip(batch.non_tensor_batch["min_global_steps"], batch.non_tensor_batch["max_global_steps"]))
    assert len(seen) == ROWS and carried == seen, (carried, seen)
    spans = [hi - lo for lo, hi in seen]
    # a cut turn spans CUTS_PER_TURN syncs; more means the first version came from an earlier turn
    assert all(span >= CUTS_PER_TURN for span in spans) and max(spans) > CUTS_PER_TURN, spans
    assert batch.meta_info["fully_async/partial/total_partial_num"] == sum(1 for s in spans if s > 0)
    assert batch.meta_info["fully_async/partial/max_partial_span"] == max(spans)
    assert batch.meta_info["param_version_diversity"] == len({hi for _, hi in seen})


def test_without_multi_turn_the_fully_async_path_runs_another_loop_and_the_reward_refuses_its_rows(
        tiny_model_dir, tiny_processor, tiny_llm):
    """verl's fully async rollouter swaps every row's agent for single_turn_agent unless
    `multi_turn.enable`: the rows roll out with no retrieval, and the project's reward (as verl's
    reward manager calls it) refuses them, naming the setting, instead of scoring them."""
    import numpy as np
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME

    worker = local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor))
    config = fully_async_config(worker, multi_turn=False)
    full = single_sample_rows(sample_prompts(1, with_images=False), 0, config)
    assert list(full.non_tensor_batch["agent_name"]) == ["single_turn_agent"]  # verl's swap
    out = asyncio.run(worker.generate_sequences(full))
    assert "page_ids" not in out.non_tensor_batch  # vrag_agent did not run

    with_it = single_sample_rows(sample_prompts(1, with_images=False), 0, fully_async_config(worker, multi_turn=True))
    assert list(with_it.non_tensor_batch["agent_name"]) == [AGENT_NAME]  # the row's own agent, kept

    compute_score = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(REPO / "examples" / "reward_function" / "vrag_verl.py"), "name": "compute_score",
        "reward_kwargs": {}}}}))
    out.non_tensor_batch["data_source"] = np.array(["vrag"], dtype=object)
    out.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "3", "style": "rule"}], dtype=object)
    out.non_tensor_batch["extra_info"] = np.array([{}], dtype=object)

    async def score():  # the manager binds the running loop when it is made, as in verl's reward worker
        return await NaiveRewardManager(OmegaConf.create({}), tiny_processor.tokenizer, compute_score).run_single(out)

    with pytest.raises(ValueError, match=r"multi_turn\.enable=true"):
        asyncio.run(score())
