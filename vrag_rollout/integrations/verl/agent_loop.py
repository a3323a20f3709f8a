"""The VRAG agent as a verl agent loop, registered as `vrag_agent`.

verl (volcengine, `verl.experimental.agent_loop`) runs one `AgentLoopBase` per trajectory:
`run(sampling_params, **row)` generates through `server_manager.generate` (token ids in, token ids
and logprobs out) and returns an `AgentLoopOutput`, which verl's worker pads, batches and gives
positions (the family's `get_rope_index`) and processor inputs (from the images).

Here each trajectory is one `Episode` driven by `schedules.run_episode` through an
`EpisodeDriver` shared by the process's loops (`shared_driver`): the same per-turn step, action
formats, budget, observations, retriever client, sampling plan and seeds as the EasyR1 rollout,
which holds the same driver; only the engine is verl's (`ServerDriver` writes each turn's
sampling parameters in verl's server conventions). The output carries the trainer view: prompt and response ids with every image's
pad run expanded, the loss mask as `response_mask`, the rollout logprobs (0 on observations),
the images in sequence order as `multi_modal_data["images"]`, and per-episode facts in
`extra_fields` (`termination_reason`, `page_ids`, `budget_overflow`, `turn_ids`, ...). Under a
context policy the episode is several rows and `run` returns a list, one output per row, for verl's
v1 trainer; other trainer settings are refused at loop init (`segments.py`).

Configuration: the loop's entry in verl's `agent_loop_config_path` file, whose keys besides
`name` and `_target_` reach `__init__` (hydra): `vrag` (a dict of `AgentRolloutConfig` fields:
`retriever_url`, `action_format`, `top_n`, `max_turns`, ...) and `model_path` (default: the
trainer's `actor_rollout_ref.model.path`: a local directory or a hub id, read through the
Hugging Face cache; a path whose config cannot be read is refused, since the checkpoint's padded
vocabulary rows could not be banned). Lengths, temperature, top_p, top_k and
`calculate_log_probs` come from verl's rollout config, so the two never disagree.

Tool calls: up to `retriever_max_concurrency` retriever batches are out at once; the calls of
trajectories that arrive while all of them are out leave together as the next batch
(`rollout.tool_batcher`; `merge_tool_calls: false` in the loop's entry sends each trajectory's
calls on their own, as verl's own tool loop does).

Seeds: `request_seed(seed, 0, sample, turn)` with `sample` the row's `vrag_sample` column when
it has one (tests compare with the EasyR1 rollout at the same seeds), else `trajectory_number()`:
unique in the process and drawn from a random base per process. verl runs several
`AgentLoopWorker` processes, all at data-parallel rank 0, and splits a step's n copies of a
prompt across them: a counter that started at the same value in each would give copies in
different workers the same noise (identical GRPO samples).

Prompt images: as verl's `RLHFDataset` puts them in the messages (a PIL image, a dict with
`bytes` or `image`, a path or URL string), each read as an RGB PIL image (`images.prompt_images`).

Partial rollouts: verl's resume loop resubmits an aborted request with the same sampling
parameters; a grammar (`action_regex`, `first_turn_action_regex`) would restart from its
beginning after the partial text, so the loop refuses a grammar where verl resumes aborted
requests (`partial_rollouts_on`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from ...core.episode import Episode
from ...formats import format_named
from ...data.prompts import expand_pads
from ...engine.sampling import request_seed
from ...families import UnreadableModelError, logits_width
from ...rollout import tool_batcher
from ...rollout.driver import EpisodeDriver
from ...rollout.schedules import ScheduleClock, run_episode
from .images import prompt_images
from .segments import calling_worker, refuse_unfit_trainer, row_outputs
from .turns import turn_output

AGENT_NAME = "vrag_agent"
# verl's rollout config fields the agent takes as they are (the loop never disagrees with verl on them)
FROM_VERL = ("prompt_length", "response_length", "temperature", "top_p", "top_k", "calculate_log_probs")
SAMPLE_COLUMN = "vrag_sample"
VERL_LOGPROBS_MODE = "processed_logprobs"  # verl's rollout.logprobs_mode default

_drivers: dict = {}
_drivers_lock = threading.Lock()
ROW_SAMPLES = 1 << 20  # row-given sample indices (`vrag_sample`) stay below this


class _TrajectoryNumbers:
    """Sample numbers (for seeds) of trajectories whose rows give none: consecutive within a
    process, from a random base drawn by each process on first use, so that no two processes
    (verl's workers, each at dp rank 0; a forked copy of one) share a number, short of a 2**-40
    chance per pair."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: Optional[int] = None
        self._numbers: Iterator[int] = iter(())

    def next(self) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a new process, or a fork of one that had drawn
                self._pid = os.getpid()
                self._numbers = itertools.count(ROW_SAMPLES + (secrets.randbits(40) << 20))
            return next(self._numbers)


_trajectory_numbers = _TrajectoryNumbers()


def trajectory_number() -> int:
    """The next sample number of this process for a row without `vrag_sample`."""
    return _trajectory_numbers.next()


def agent_config(rollout_config: Any, vrag: dict) -> dict:
    """The `AgentRolloutConfig` fields: verl's lengths and sampling settings, then `vrag`'s own."""
    taken = {key: rollout_config.get(key) for key in FROM_VERL if rollout_config.get(key) is not None}
    clash = sorted(set(taken) & set(vrag))
    if clash:
        raise ValueError(f"vrag_agent: set {clash} in actor_rollout_ref.rollout, not in the loop's vrag settings")
    return {**vrag, **taken, "n": 1}


class ServerDriver(EpisodeDriver):
    """The episode driver with verl's sampling-parameter conventions: a dict (verl's server
    builds the SamplingParams) and `logprobs` as a flag; every trajectory is call 0 (its sample
    number makes its seeds its own)."""

    def request(self, episode: Episode, turn: int) -> tuple:
        seed = request_seed(self.sampling.seed, 0, episode.index, turn, self.dp_rank)
        params = self.sampling.params_kwargs(episode.remaining, seed, first_turn=turn == 0)
        params.pop("n", None)
        params["logprobs"] = "logprobs" in params
        return episode.engine_prompt(), params


def shared_driver(model_path: str, settings: dict, tokenizer: Any, processor: Any) -> ServerDriver:
    """One driver per process and settings: its retriever client, observer and sampling plan are
    shared by every trajectory's loop (each is thread-safe; episodes are the loops' own). The
    engine is verl's, in another process: the padded rows to ban are the checkpoint's."""
    key = (model_path, json.dumps(settings, sort_keys=True, default=str))
    with _drivers_lock:
        if key not in _drivers:
            _drivers[key] = ServerDriver(model_path, settings, tokenizer, processor,
                                         logits_width=checkpoint_width(model_path))
        return _drivers[key]


def checkpoint_width(model_path: str) -> int:
    """The logits width of verl's model (a local directory or a hub id, as `model_config` reads
    it). Refused when unreadable: without it the padded rows (ids no text decodes to) go unbanned
    and the policy may sample them into the training batch."""
    try:
        return logits_width(model_path, required=True)
    except UnreadableModelError as error:
        raise UnreadableModelError(
            f"vrag_agent: {error}. The loop bans the padded vocabulary rows of the checkpoint, so it must read its "
            "config.json here: set the loop's model_path (its entry in agent_loop_config_path) to the checkpoint's "
            "local directory, or make the hub id readable from this worker's Hugging Face cache") from error


def end_of_sequence_ids(tokenizer: Any, model_path: str) -> tuple[int, ...]:
    """The ids vLLM ends a sequence at: the generation config's EOS ids and the tokenizer's."""
    from transformers import GenerationConfig

    ids = set()
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


def partial_rollouts_on(server_manager: Any, trainer_config: Any) -> bool:
    """Whether verl resubmits this loop's aborted requests (partial rollouts), as verl 0.9.1
    decides it: its `FullyAsyncLLMServerClient` (the fully async trainer's rollouter, the v1
    async trainers) does unless the config has `async_training.partial_rollout: false`; a config
    that sets `async_training.partial_rollout: true` says so whatever the client."""
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    config = getattr(server_manager, "config", None) or trainer_config
    async_training = config.get("async_training") if hasattr(config, "get") else None
    setting = async_training.get("partial_rollout") if async_training is not None else None
    if isinstance(server_manager, FullyAsyncLLMServerClient):
        return setting is None or bool(setting)
    return bool(setting)


def refuse_grammar_under_partial_rollouts(driver: EpisodeDriver, server_manager: Any, trainer_config: Any) -> None:
    """A resubmitted request matches its grammar again from the start after the partial text
    (`<th` + `<think>…`): the merged turn would be neither a sample of the grammar nor the turn an
    uninterrupted request gives. Refused before any trajectory samples."""
    grammars = [name for name in ("action_regex", "first_turn_action_regex") if getattr(driver.config, name)]
    if grammars and partial_rollouts_on(server_manager, trainer_config):
        raise ValueError(
            f"vrag_agent: {' and '.join(grammars)} (a grammar on the loop's turns) cannot be used with verl's "
            "partial rollouts (async_training.partial_rollout, on by default where verl's FullyAsyncLLMServerClient "
            "serves the loop): a resumed request restarts its grammar after the partial text. Drop the grammar from "
            "the loop's vrag settings, or set async_training.partial_rollout=false")


@register(AGENT_NAME)
class VragAgentLoop(AgentLoopBase):
    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any, *args: Any,
                 vrag: Optional[dict] = None, model_path: Optional[str] = None, merge_tool_calls: bool = True,
                 **kwargs: Any):
        super().__init__(trainer_config, server_manager, tokenizer, processor, *args, **kwargs)
        self.merge_tool_calls = merge_tool_calls
        self.model_path = model_path or str(self.config.actor_rollout_ref.model.path)
        settings = agent_config(self.rollout_config, dict(vrag or {}))
        self.driver = shared_driver(self.model_path, settings, tokenizer, processor)
        # a context policy's rows need verl's v1 worker, a per-token loss and GRPO (segments.py)
        refuse_unfit_trainer(self.driver.config, self.config, calling_worker())
        refuse_grammar_under_partial_rollouts(self.driver, server_manager, self.config)
        self.eos_ids = end_of_sequence_ids(self.driver.tokenizer, self.model_path)
        config = self.driver.config
        self.rollout_meta = {**self.driver.rollout_meta(), "action_format": config.action_format,
                             "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p}
        if config.calculate_log_probs:  # the engine is verl's: its logprobs mode is verl's setting
            self.rollout_meta["rollout_log_probs_mode"] = str(self.rollout_config.get("logprobs_mode",
                                                                                      VERL_LOGPROBS_MODE))

    async def run(self, sampling_params: dict, **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        driver = self.driver
        sample = kwargs.get(SAMPLE_COLUMN)
        episode, prompt_ids = self._episode(kwargs, int(sample) if sample is not None else trajectory_number())
        await asyncio.to_thread(self._preflight, episode.doc_id, kwargs.get(driver.config.page_count_key))
        request_id = uuid.uuid4().hex
        clock = ScheduleClock()
        steps: dict = {}  # the weight versions the turns were sampled with (verl's fully async trainer)

        async def generate(request: dict, params: dict) -> Any:
            answer = await self.server_manager.generate(
                request_id, prompt_ids=request["prompt_token_ids"], sampling_params=dict(params),
                image_data=(request.get("multi_modal_data") or {}).get("image"))
            versions = answer.extra_fields or {}
            if "min_global_steps" in versions:
                steps.setdefault("min_global_steps", versions["min_global_steps"])
            if "max_global_steps" in versions:
                steps["max_global_steps"] = versions["max_global_steps"]
            return turn_output(answer.token_ids, answer.log_probs, stop_reason=answer.stop_reason,
                               max_tokens=params["max_tokens"], stop_strings=driver.stop_strings,
                               eos_ids=self.eos_ids,
                               decode=lambda ids: driver.tokenizer.decode(ids, skip_special_tokens=True))

        # several batches at once only where execute_tools is this process's own (no rank broadcast to order)
        width = driver.config.retriever_max_concurrency if driver.sync.is_local else 1
        tools = tool_batcher.for_loop(driver, driver.execute_tools, width).execute if self.merge_tool_calls else None
        await run_episode(driver, episode, generate, clock, tools)
        episode.finish("max_turns")  # no-op for an episode that ended
        return self._output(episode, prompt_ids, clock, steps)

    def _preflight(self, doc_id: Optional[str], page_count: Any) -> None:
        """The rollout's retriever preflight (`retriever_preflight`) for this row's document (None:
        corpus scope), before its first turn: the driver lists the index once per process and
        answers every later trajectory from that listing (`retrieval.preflight.DocumentCheck`)."""
        from ...retrieval.preflight import page_count_value

        count = page_count_value(page_count)
        self.driver.preflight([doc_id], None if count is None else [count])

    def _episode(self, row: dict, sample: int) -> tuple[Episode, list[int]]:
        """The row's episode and its prompt in the trainer's view (each image's pads expanded);
        a prompt longer than `prompt_length` is refused here (verl pads but never cuts it, and a
        longer row breaks its batch)."""
        driver = self.driver
        messages = row["raw_prompt"]
        images = prompt_images(messages)
        prompt_tools = format_named(driver.config.action_format).prompt_tools(driver.config)
        tools = {"tools": list(prompt_tools)} if prompt_tools else {}
        template = Path(driver.config.chat_template).read_text(encoding="utf-8") if driver.config.chat_template else None
        text = driver.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                   chat_template=template, **tools)
        ids = driver.tokenizer.encode(text, add_special_tokens=False)
        if driver.config.doc_id_key not in row:
            raise ValueError(f"vrag_agent: the row has no {driver.config.doc_id_key!r} column: the agent searches "
                             "each sample's document, or the whole corpus where it is null (convert the dataset "
                             "with `vrag-rollout convert-dataset --layout verl`)")
        doc_id = row[driver.config.doc_id_key]  # None: corpus scope (`core.scope`)
        driver.format.check_prompts([ids], driver.tokenizer)
        grids = []
        if images:
            found = driver.processor.image_processor(images=images, return_tensors="pt")
            grids = [tuple(int(x) for x in grid) for grid in found["image_grid_thw"]]
        prompt_ids = expand_pads(ids, grids, driver.vision_tokens.image_pad, driver.merge_size)
        if len(prompt_ids) > driver.config.prompt_length:
            raise ValueError(f"vrag_agent: a prompt of {len(prompt_ids)} tokens (images expanded) exceeds "
                             f"actor_rollout_ref.rollout.prompt_length={driver.config.prompt_length}: raise it, or "
                             "filter long prompts out of the dataset (data.filter_overlong_prompts)")
        episode = Episode(index=sample, prompt_engine_ids=ids, prompt_images=images,
                          doc_id=None if doc_id is None else str(doc_id),
                          response_length=driver.config.response_length, max_images=driver.max_images)
        return episode, prompt_ids

    def _output(self, episode: Episode, prompt_ids: list[int], clock: ScheduleClock,
                steps: dict) -> AgentLoopOutput | list[AgentLoopOutput]:
        """The episode as verl's output: one `AgentLoopOutput`, or under a context policy a list,
        one per row of the episode in order (`segments.row_outputs`)."""
        driver = self.driver
        with_logprobs = bool(driver.config.calculate_log_probs)
        extra = {"termination_reason": episode.termination, "page_ids": [list(p) for p in episode.page_ids],
                 "budget_overflow": episode.budget_overflow, "num_searches": episode.searches,
                 "num_fetches": episode.fetches, "num_crops": episode.crops,
                 "retriever_errors": episode.retriever_errors, "bad_requests": episode.bad_requests,
                 "doc_id": episode.doc_id,
                 "image_regions": list(episode.image_regions),
                 # each response token's turn (from 1; the guard's worker makes it the batch's
                 # (B, R) `turn_ids` tensor: integrations/verl/guard.py)
                 "turn_ids": list(episode.turn_ids),
                 # how it was sampled, as the EasyR1 rollout's meta_info says it (verl keeps no
                 # batch-level meta): `vrag-rollout check` reads it from this column
                 "rollout_meta": self.rollout_meta,
                 # the images again as a column (the pages' shared entries, their bytes, never
                 # pixels per sample): what `vrag-rollout check` and the viewer read
                 "multi_modal_data": {"images": list(episode.prompt_images) + [page.entry for page in episode.images]},
                 # verl's reward manager adds this column's entries to the reward's extra_info
                 "tool_extra_fields": {"page_ids": [list(p) for p in episode.page_ids]},
                 **steps}

        def output(part: Any, response_mask: list[int], logprobs: Optional[list[float]], images: list,
                   extra_fields: dict, final: bool = True) -> AgentLoopOutput:
            # the episode's clock on its last row only: verl sums and averages these per output
            return AgentLoopOutput(
                prompt_ids=prompt_ids, response_ids=list(part.response_ids), response_mask=response_mask,
                response_logprobs=logprobs, multi_modal_data={"images": images} if images else None,
                num_turns=part.turns,
                metrics=AgentLoopMetrics(generate_sequences=clock.engine, tool_calls=clock.sample_tool_wait)
                if final else AgentLoopMetrics(), extra_fields=extra_fields)

        if driver.config.edits_context:
            return row_outputs(episode, output, extra, with_logprobs)
        images = list(episode.prompt_images) + [page.image for page in episode.images]
        return output(episode, list(episode.loss_mask), list(episode.logprobs) if with_logprobs else None, images, extra)
