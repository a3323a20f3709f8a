"""Partial rollouts as verl's fully asynchronous trainer runs them, on the real engine, in both
action formats and with the sampling options the loop takes from verl.

verl 0.9.1 interrupts a rollout for a weight sync by aborting the requests in flight; its
`FullyAsyncLLMServerClient.generate` then resubmits each with the tokens generated so far and
hands the loop one merged answer, with the weight versions it was sampled under
(`min_global_steps`, `max_global_steps`). Here verl's own client runs between `vrag_agent` and
the engine (`integrations/verl/local.py`'s worker), over `partial_rollouts.PolicyServer`: the
engine, scripting the turns the random tiny model could not write (as a server-side grammar that
resumes exactly; the loop itself may not hold a grammar under partial rollouts), and aborting
where the test says.

Oracles, at temperature 0, each format (tags with every stop string of the region action too;
tool_call): every turn of every episode is aborted, early and at every token boundary inside its
stop string or closing tag, and each episode equals the uninterrupted one token for token (masks,
pages, termination too). In the tags format a resubmission that began inside a stop string writes
on past it (the defect this guards: the merged answer is cut where the stop string completes, as an
uninterrupted request is). The project's `check` passes on the batch, and the trajectories carry
`min_global_steps` 1 and `max_global_steps` 2. Above temperature 0 (with top-p and top-k) free
turns are aborted three times each: `check` passes and every merged turn's rollout logprobs match
a forward pass of the model.

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
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.integrations.partial_rollouts import (  # noqa: E402
    CLOSING_TAGS, TAIL, PolicyServer, ResumingClient, SyncingClient, inside_markers, without_resume_backoff)
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import SAMPLE_COLUMN  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.formats import FORMATS  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROWS = {"tags": 1, "tool_call": 2}
# What each turn writes. Tags: both region actions first (no page is shown yet: error observations,
# no retriever call), then a recorded search, a fetch and the answer; each action's script runs on
# past its stop string (TAIL), which only a resubmission begun inside the stop string reaches.
SCRIPTS = {
    "tags": ("<bbox>[100, 100, 600, 600]</bbox>" + TAIL, "<crop>2, [100, 100, 600, 600]</crop>" + TAIL,
             "<search>lost-time incidents per year</search>" + TAIL, "<fetch>image, 2</fetch>" + TAIL,
             "<answer>2</answer>"),
    "tool_call": ('<think>look it up</think>\n<tool_call>\n{"name": "fetch", "arguments": {"page": 2, "mode": "image"}}'
                  "\n</tool_call>", "<think>found it</think>\n<answer>2</answer>"),
}
FREE_CUTS = (3, 11, 26)  # where each free turn is aborted above temperature 0


def settings_for(processor, action_format: str, **overrides) -> dict:
    """The demo rollout's settings without the loop's grammar (refused under partial rollouts;
    the server scripts the turns instead), greedy, with the region action in the tags format."""
    config = demo_config(**demo_page_band(processor), action_format=action_format, n=1, temperature=0.0,
                         retriever_fixtures=str(SAMPLE_RETRIEVAL), max_turns=len(SCRIPTS[action_format]),
                         response_length=1024, region_action=action_format == "tags")
    config = dataclasses.replace(config, action_regex=None, first_turn_action_regex=None, **overrides)
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


def stop_strings(action_format: str) -> tuple:
    """The format's stop strings, the region action's included."""
    return FORMATS[action_format].stop_strings_for(SimpleNamespace(region_action=True))


def serve(worker, client_cls, tokenizer, **policy):
    """`worker` over `client_cls` (a policy server, or verl's resume loop over one) on its engine."""
    worker.llm_client = client_cls(config=worker.config, engine=worker.llm_client, tokenizer=tokenizer, **policy)
    return worker


@pytest.fixture(scope="module")
def no_backoff():
    with without_resume_backoff():
        yield


@pytest.fixture(scope="module")
def plain_runs(tiny_model_dir, tiny_processor, tiny_llm):
    """format -> (the uninterrupted batch, its server's record of each turn's tokens), run once."""
    done: dict = {}

    def run(action_format: str):
        if action_format not in done:
            worker = serve(local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, action_format)),
                           PolicyServer, tiny_processor.tokenizer, scripts=SCRIPTS[action_format])
            rows = prompt_rows(sample_prompts(ROWS[action_format], with_images=False), action_format)
            done[action_format] = asyncio.run(worker.generate_sequences(rows)), worker.llm_client
        return done[action_format]

    return run


def cut_plan(server):
    """Abort each turn early and at every token boundary inside its stop string or closing tag."""
    return inside_markers(server.turn_tokens, server.decode, stop_strings("tags") + CLOSING_TAGS)


@pytest.fixture(scope="module", params=["tags", "tool_call"])
def scripted(request, plain_runs, tiny_model_dir, tiny_processor, tiny_llm, no_backoff):
    action_format = request.param
    plain, recorded = plain_runs(action_format)
    worker = serve(local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, action_format)),
                   ResumingClient, tiny_processor.tokenizer, scripts=SCRIPTS[action_format], cuts=cut_plan(recorded))
    rows = prompt_rows(sample_prompts(ROWS[action_format], with_images=False), action_format)
    resumed = asyncio.run(worker.generate_sequences(rows))
    return action_format, plain, resumed, worker.llm_client


def test_episodes_cut_at_every_turn_and_inside_stop_strings_equal_the_uninterrupted_ones(scripted):
    action_format, plain, resumed, client = scripted
    turns = [turn for trajectory in client.trajectories.values() for turn in trajectory.turns]
    assert len(turns) == ROWS[action_format] * len(SCRIPTS[action_format])
    assert all(turn.aborts >= 2 for turn in turns), [turn.aborts for turn in turns]  # early and inside its end
    if action_format == "tags":  # a resubmission begun inside each stop string wrote on past it
        assert set(client.resumed_past_stop) == set(stop_strings("tags")), client.resumed_past_stop
    for key in ("responses", "response_mask", "attention_mask"):
        assert resumed.batch[key].tolist() == plain.batch[key].tolist(), key
    # resubmitted prefixes are recomputed by a prefill, not decoded: float noise only
    assert (resumed.batch["rollout_log_probs"] - plain.batch["rollout_log_probs"]).abs().max() < 1e-4
    for column in ("termination_reason", "page_ids", "num_crops", "num_searches", "num_fetches"):
        assert list(resumed.non_tensor_batch[column]) == list(plain.non_tensor_batch[column]), column
    reasons = resumed.non_tensor_batch["termination_reason"]
    assert set(reasons) == {"answered"}, reasons
    assert all(sum(map(len, pages)) > 0 for pages in resumed.non_tensor_batch["page_ids"])  # pages were shown


def test_the_resumed_batch_checks_and_carries_its_weight_versions(scripted, tiny_model_dir):
    _, _, resumed, _ = scripted
    report = check_batch(from_dataproto(resumed, model_path=tiny_model_dir), tiny_model_dir)
    assert report.ok, report.human()
    versions = list(zip(resumed.non_tensor_batch["min_global_steps"], resumed.non_tensor_batch["max_global_steps"]))
    assert (1, 2) in versions, versions  # a trajectory sampled across the sync
    assert all(lo is not None and hi is not None and lo <= hi for lo, hi in versions), versions


@pytest.mark.parametrize("action_format,sampling", [("tags", {"temperature": 1.0, "top_p": 0.9}),
                                                    ("tool_call", {"temperature": 0.7, "top_k": 50})])
def test_above_temperature_zero_merged_turns_check_and_match_a_forward_pass(
        action_format, sampling, tiny_model_dir, tiny_processor, tiny_llm, no_backoff):
    """Free turns (no script) sampled with verl's temperature, top-p and top-k, each cut three
    times: the batch checks, and the merged turns' rollout logprobs are the model's own (the forward
    check, in the distribution they were sampled from)."""
    settings = settings_for(tiny_processor, action_format, response_length=40, **sampling)
    worker = serve(local_worker(tiny_model_dir, tiny_llm, settings), ResumingClient, tiny_processor.tokenizer,
                   cuts=lambda prompt, turn: FREE_CUTS)
    batch = asyncio.run(worker.generate_sequences(prompt_rows(sample_prompts(2, with_images=False), action_format)))
    assert worker.llm_client.aborts == len(FREE_CUTS) * 2, worker.llm_client.aborts
    report = check_batch(from_dataproto(batch, model_path=tiny_model_dir), tiny_model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["tokens"] >= 2 * FREE_CUTS[-1], report.forward


# ---- the fully asynchronous trainer's data path: rollouter -> Ray message queue -> trainer ----

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
def queued(plain_runs, tiny_model_dir, tiny_processor, tiny_llm, no_backoff):
    """Each row goes the way verl's fully async rollouter sends it (one sample at a time through
    the worker, with verl's resume loop over weight syncs, pickled into a `RolloutSample` and put
    on the real `MessageQueue` Ray actor); the trainer's side takes them off the queue and
    assembles its batch with `assemble_batch_from_rollout_samples`."""
    ray = pytest.importorskip("ray")
    import numpy as np
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample, assemble_batch_from_rollout_samples
    from verl.experimental.fully_async_policy.message_queue import MessageQueue, MessageQueueClient

    rows = ROWS["tool_call"]
    samples = sample_prompts(rows, with_images=False)
    _, recorded = plain_runs("tool_call")
    worker = serve(local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, "tool_call")), SyncingClient,
                   tiny_processor.tokenizer, scripts=SCRIPTS["tool_call"], cuts=cut_plan(recorded))
    config = fully_async_config(worker, multi_turn=True)

    async def rollouter_then_trainer():
        queue = MessageQueueClient(MessageQueue.remote(config, max_queue_size=rows))

        async def process_single_sample(row: int):  # the rollouter's per-sample task; all rows at once
            full = single_sample_rows(samples, row, config)
            out = await worker.generate_sequences(full)
            out.non_tensor_batch["uid"] = full.non_tensor_batch["uid"]  # as the rollouter re-sets it
            sample = RolloutSample(full_batch=out, sample_id=f"sample_{row}", epoch=0, rollout_status={"row": row})
            assert await queue.put_sample(ray.cloudpickle.dumps(sample))

        await asyncio.gather(*[process_single_sample(row) for row in range(rows)])
        taken = []
        for _ in range(rows):
            data, _left = await queue.get_sample()
            taken.append(ray.cloudpickle.loads(data))
        return taken

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    try:
        taken = asyncio.run(rollouter_then_trainer())
    finally:
        ray.shutdown()
    assert sorted(s.sample_id for s in taken) == [f"sample_{row}" for row in range(rows)]
    batch = assemble_batch_from_rollout_samples(taken, tiny_processor.tokenizer, config, None)
    assert [f"uid_{s.sample_id}" for s in taken] == list(batch.non_tensor_batch["uid"])  # in queue order
    assert isinstance(batch.non_tensor_batch["processing_times"][0], (float, np.floating))
    return batch, worker.llm_client


def row_of(uid: str) -> int:
    return int(uid.rsplit("_", 1)[1])


def test_the_fully_async_queue_delivers_the_uninterrupted_episodes(queued, plain_runs):
    batch, client = queued
    plain, _ = plain_runs("tool_call")
    assert client.aborts > 0
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
    assert len(seen) == ROWS["tool_call"] and carried == seen, (carried, seen)
    spans = [hi - lo for lo, hi in seen]
    for request_id, versions in client.answered.items():  # at least its own aborts and its tool calls' syncs
        turns = client.trajectories[request_id].turns
        assert max(versions) - min(versions) >= sum(turn.aborts for turn in turns) + len(turns) - 1, request_id
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

    worker = local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, "tool_call", response_length=32))
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
