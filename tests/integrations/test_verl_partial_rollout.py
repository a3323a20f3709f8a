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
grammar), so pages are shown before the interrupted turns."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.engine.token_server import LocalTokenServer  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402

ROWS = 4
ABORT_AFTER = 6  # tokens a free turn's request gets before it is aborted
CUTS_PER_TURN = 2  # a turn is cut twice: its answer is merged from three requests


class AbortingServer(LLMServerClient):
    """The server verl's resume loop calls (its base class's `generate`): the engine, aborting the
    first request of each free turn after `ABORT_AFTER` tokens as a weight sync would, and moving
    to the next weight version when it does."""

    def __init__(self, config, load_balancer_handle=None, *, engine: LocalTokenServer, **kwargs):
        self.config, self.engine = config, engine
        self.version, self.aborts = 1, 0
        # request id -> (the prompt length its resubmission has, times this turn was cut)
        self.resumes: dict[str, tuple[int, int]] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
        params = dict(sampling_params)
        length, cuts = self.resumes.get(request_id, (None, 0))
        cuts = cuts if length == len(prompt_ids) else 0  # a new turn, or this turn resubmitted
        interrupt = "structured_outputs" not in params and cuts < CUTS_PER_TURN and params["max_tokens"] > ABORT_AFTER
        if interrupt:
            params["max_tokens"] = ABORT_AFTER
        answer = await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=params,
                                            image_data=image_data)
        extra = {"global_steps": self.version}
        if interrupt and len(answer.token_ids) == ABORT_AFTER and answer.token_ids[-1] not in self.eos_ids:
            self.resumes[request_id] = (len(prompt_ids) + ABORT_AFTER, cuts + 1)
            self.aborts += 1
            self.version = 2  # the weights were synced while the request was out
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
