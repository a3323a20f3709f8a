"""The episode driver: everything a rollout does per turn and per batch, without an engine.

`EpisodeDriver` owns the sampling plan, the action format, the observer and the retriever (with
its preflight), and turns a trainer's prompt batch into episodes and the finished episodes back
into the trainer's batch. It never generates: a schedule (`schedules.py`) is handed the driver
and an engine and calls the driver's per-turn hooks (the `schedules.Driver` protocol) around
the engine's turns. The EasyR1-facing rollout classes (`agent.py`) hold one driver and their
vLLM engine; verl's agent loop holds one driver per process and generates through verl's server
(`integrations/verl`), so the same code settles every turn whichever trainer runs it.

Contract:
- `EpisodeDriver(model_path, config, tokenizer, processor, logits_width=, tools=True, ...)`: the
  model family is read from `model_path`/`processor` (an unsupported model is refused here); the
  rows past the tokenizer up to `logits_width` (the padded embedding rows of released
  checkpoints) are banned from sampling, with the vision special tokens. With `tools=False` the
  driver runs one turn per sample and has no retriever (the single-turn rollout).
- `start_call()` numbers a rollout call (every request seed includes it); `episodes(prompts, n)`
  and `assemble(prompts, episodes, n, clock)` map a batch in and out; `rollout_meta()` is what
  a checker needs to know of how the batch was sampled.
- Threads: the hooks that read or change an episode run on the schedule's loop thread;
  `tool_outcomes` and `observe_outcomes` may run in a tool thread and read no episode (see
  docs/concurrency.md). `preflight` may be called from several threads at once (verl's loops
  call it per trajectory): it asks the retriever once per process and retriever
  (`retrieval.preflight.DocumentCheck`), and answers later calls from that listing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional

import numpy as np
import torch
from tensordict import TensorDict

from ..config import AgentRolloutConfig
from ..core import step
from ..core.actions import Crop, Fetch, Search
from ..core.batch import (BatchSpec, batch_rows, collect_metrics, episode_columns, response_position_ids,
                          response_tensors)
from ..core.episode import Episode
from ..core.observation import ObservationBuilder, VisionTokens
from ..core.prompt_images import engine_images, image_key, prompt_entries
from ..core.serial_tokenizer import private_copy
from ..core.context_edit import ContextEditor, ContextPolicy
from ..core.vision import fit_to_band, lowered_band, narrowed_band, page_band, page_of, processor_floor
from ..engine.group_sync import LocalSync, sync_for
from ..engine.sampling import BANNED_LOGIT_BIAS, SamplingPlan, data_parallel_rank, request_seed
from ..families import detect_family, padded_token_ids
from ..protocol import object_array
from ..turn_output import TurnOutput
from ..formats import format_named
from .schedules import ScheduleClock, call_within

logger = logging.getLogger(__name__)

# Seconds a tool batch may take beyond the retriever's own deadline: decoding and resizing its
# pages and building the observations (milliseconds a page; this only bounds a stuck thread).
DECODE_SLACK_S = 60.0


class EpisodeDriver:
    def __init__(self, model_path: str, config: Any, tokenizer: Any, processor: Any = None, *,
                 logits_width: Optional[int] = None, tools: bool = True, retriever: Any = None,
                 data_parallel_rank: Optional[int] = None, group_sync: Any = None):
        self.config = AgentRolloutConfig.from_any(config)
        if self.config.response_length < 1 or self.config.prompt_length < 1:
            raise ValueError("prompt_length and response_length must be set (> 0) in the rollout config")
        # An unsupported model fails here, naming the supported families.
        self.family = detect_family(model_path, processor)
        # Tool threads tokenize too: every use goes through the tokenizer's lock, on a copy of the
        # caller's tokenizer (the trainer tokenizes with its own, without the lock, and a failed
        # call's tool threads may still be finishing when it does).
        self.tokenizer = private_copy(tokenizer)
        self.processor = processor
        self.vision_tokens = VisionTokens.from_tokenizer(self.tokenizer)
        self.max_images = self.config.images_per_sample()
        self.merge_size = _merge_size(processor)
        # The ranks of a tensor-parallel group must see identical tool outcomes (group_sync.py).
        self.sync = group_sync or sync_for(self.config.tensor_parallel_size) or LocalSync()
        self.observations = ObservationBuilder(
            self.tokenizer, self.vision_tokens, max_text_tokens=self.config.max_fetch_text_tokens)
        format_class = format_named(self.config.action_format) if tools else None
        self.stop_strings = format_class.stop_strings_for(self.config) if format_class else ()
        self.sampling = SamplingPlan(
            self.config,
            # vision tokens, and the padded embedding rows no text decodes to (released checkpoints)
            banned_token_ids=self.vision_tokens.banned + padded_token_ids(logits_width, len(self.tokenizer)),
            stop=self.stop_strings,
            action_regex=self.config.action_regex,
            first_turn_regex=self.config.first_turn_action_regex,
            logprobs=self.config.calculate_log_probs,
        )
        self.logprobs_mode: Optional[str] = None  # the engine's, where the holder knows it
        self._calls = 0  # rollout calls started so far
        self.call_number = 0  # the number of the current call: part of every request seed
        # Also part of every seed: the same prompt on two data-parallel ranks gets other noise.
        self.dp_rank = data_parallel_rank if data_parallel_rank is not None else _dp_rank(self.config)
        self.format = self.retriever = self.observer = self.band = None
        self.context_editor: Optional[ContextEditor] = None
        self._document_check: Any = None  # the preflight's cache, per retriever (`_documents`)
        self._document_check_lock = threading.Lock()
        if format_class is not None:
            from .tools import Observer

            if processor is None:
                raise ValueError("vLLMRolloutAgent needs the model's processor (page grids must match the actor's)")
            self.band = page_band(processor, self.config.page_min_pixels, self.config.page_max_pixels)
            self.retriever = retriever or self._default_retriever()
            self.observer = Observer(self.observations, self.band)
            self._set_bands(self.band, processor_floor(processor))
            self.format = format_class(self.config, self.tokenizer, grounding_frame=self.family.grounding_frame)
            self.sampling.banned.extend(self.format.banned_token_ids)

    @property
    def shrinks_pages(self) -> bool:
        """Whether pages may be shown below the page band (thumbnails, a visual-token budget)."""
        config = self.config
        return bool(config.search_page_max_pixels or config.visual_token_budget
                    or (config.edits_context and config.context_edit_form == "thumbnail"))

    @property
    def max_turns(self) -> int:
        return self.config.max_turns if self.format is not None else 1

    def start_call(self) -> None:
        """Number a new rollout call. Taken before anything can fail: no seed or request id of a
        failed call is used again by the next one."""
        self.call_number, self._calls = self._calls, self._calls + 1

    # ---- one turn of one sample (the shared, pure step) ----
    def ready(self, episode: Episode) -> bool:
        """Whether the sample generates again; under a context policy its context is edited
        first (which may close a segment: `core.context_edit`)."""
        if self.context_editor is not None and not episode.done:
            self.context_editor.edit(episode)
        return _stamped(episode, step.ready(episode))

    def request(self, episode: Episode, turn: int) -> tuple:
        seed = request_seed(self.sampling.seed, self.call_number, episode.index, turn, self.dp_rank)
        return episode.engine_prompt(), self.sampling.params(episode.remaining, seed, first_turn=turn == 0)

    def after_generation(self, episode: Episode, output: TurnOutput, turn: int) -> Any:
        """Append the sampled tokens and settle the action; returns it when it needs the retriever."""
        last_turn = turn == self.max_turns - 1
        if self.format is None:
            action = step.after_generation(episode, output, last_turn=last_turn, fetch_modes=self.config.fetch_modes,
                                           observations=self.observations)
        else:
            action = self.format.after_generation(episode, output, last_turn=last_turn, observations=self.observations)
        _stamped(episode)
        return action

    # ---- tools ----
    def execute_tools(self, calls: list) -> list:
        """Observations for a batch of tool calls: the source rank's outcomes, decoded here."""
        room = self.room(calls)
        outcomes = self.sync.share(lambda: call_within(lambda: self.tool_outcomes(calls), self.tool_deadline_s))
        return self.observe_outcomes(calls, outcomes, room)

    def room(self, calls: list) -> list:
        """Response budget, image slots and visual tokens left (`tools.Room`) of each call's
        episode, read on the loop thread when the calls go out: what their observations may fill
        (a tool thread reads no episode)."""
        from .tools import Room

        budget = self.config.visual_token_budget
        return [Room(episode.remaining, episode.image_slots,
                     max(budget - episode.visual_tokens, 0) if budget else None) for episode, _ in calls]

    @property
    def tool_deadline_s(self) -> Optional[float]:
        """How long one batch of tool calls may take: the client's own bound on one call, plus
        room to decode the pages it returns; None when no retriever states a bound."""
        bound = getattr(self.retriever, "deadline_s", None)
        return None if bound is None else float(bound) + DECODE_SLACK_S

    def tool_outcomes(self, calls: list) -> list:
        """The retriever's outcomes (pages or failures) for a batch of calls, per call as the
        format groups them; pure I/O."""
        from .tools import call_retriever

        self._need_tools()
        flat = call_retriever(self.format.requests(calls), self.retriever, self.config.top_n, band=self.observer.band)
        return self.format.regroup(calls, flat)

    def observe_outcomes(self, calls: list, outcomes: list, room: list) -> list:
        """Pages decoded and observations built for each call, within the `room` each episode had
        when the calls went out (no episode is read or changed: this may run in a tool thread)."""
        self._need_tools()
        return self.format.observe(self.observer, calls, outcomes, room)

    def apply_tools(self, calls: list, results: list) -> None:
        self._need_tools()
        for (episode, action), result in zip(calls, results):
            if isinstance(action, Search):
                episode.searches += 1
            elif isinstance(action, Fetch):
                episode.fetches += 1
            elif isinstance(action, Crop):
                episode.crops += 1
            episode.searches += result.searches
            episode.fetches += result.fetches
            episode.crops += result.crops
            episode.retriever_errors += int(result.retriever_error)
            episode.bad_requests += int(result.bad_request)
            episode.undecodable_pages += result.decode_errors
            step.observe(episode, result.observation, result.overflow)
            _stamped(episode)

    def _need_tools(self) -> None:
        if self.format is None:  # no stop strings: tool calls cannot occur
            raise RuntimeError("this rollout has no tools")

    def _default_retriever(self) -> Any:
        from ..retrieval.client import RetrieverClient

        config = self.config
        transport = None
        if config.retriever_fixtures:
            from ..retrieval.fixtures import FixtureTransport

            transport = FixtureTransport.load(config.retriever_fixtures)
        return RetrieverClient(
            config.retriever_url,
            timeout=config.retriever_timeout,
            retries=config.retriever_retries,
            max_concurrency=config.retriever_max_concurrency,
            api_key=config.retriever_api_key,
            transport=transport,
        )

    # ---- before a batch ----
    def preflight(self, doc_ids: list[Optional[str]], page_counts: Optional[list] = None) -> None:
        """Refuse (or warn about) a batch the retriever cannot serve, before any sampling. The
        source rank asks; every rank of a tensor-parallel group gets its answer."""
        from ..retrieval.preflight import enforce

        mode = self.config.retriever_preflight
        if mode == "off":
            return
        problem = self.sync.share(lambda: self._documents().problem(doc_ids, page_counts))
        enforce(problem, mode, logger)

    def _documents(self) -> Any:
        """The preflight's `DocumentCheck` of the current retriever (a retriever replaced since
        starts a new one: it may serve another index)."""
        from ..retrieval.preflight import DocumentCheck

        with self._document_check_lock:
            if self._document_check is None or self._document_check.client is not self.retriever:
                self._document_check = DocumentCheck(self.retriever)
            return self._document_check

    def before_rollout(self, meta: dict) -> None:
        """Per call: the retriever's counters reset, and the page band narrowed to the trainer's."""
        if self.format is None:
            return
        stats = getattr(self.retriever, "stats", None)
        if stats is not None:
            stats.reset()
        # The actor rescales every image into the trainer's data pixel band before its processor
        # runs: pages must already lie inside it or their grids would change under the actor.
        band = narrowed_band(self.band, meta.get("min_pixels"), meta.get("max_pixels"))
        self._set_bands(band, processor_floor(self.processor, meta.get("min_pixels")))

    def _set_bands(self, band: Any, floor_pixels: int) -> None:
        """The observer's bands (full, search thumbnails, the floor) and the context editor,
        whose thumbnails are rendered within them."""
        config = self.config
        self.observer.band, self.observer.floor_pixels = band, floor_pixels
        self.observer.search_band = None
        if config.search_page_max_pixels is not None:
            self.observer.search_band = lowered_band(band, config.search_page_max_pixels, floor_pixels)
            if self.observer.search_band is None:
                raise ValueError(f"search_page_max_pixels {config.search_page_max_pixels} is below the smallest page "
                                 f"the trainer keeps ({floor_pixels} pixels): raise it, or lower the trainer's min_pixels")
        self.context_editor = None
        if config.edits_context:
            thumbnails = self.observer.search_band or lowered_band(band, band.max_pixels // 4, floor_pixels) or band
            self.context_editor = ContextEditor(
                ContextPolicy(config.context_keep_turns, config.context_keep_pages, config.context_edit_form,
                              config.context_edit_slack),
                self.vision_tokens.vision_start, self.vision_tokens.vision_end, self.vision_tokens.image_pad,
                encode=self.observations.encode_text,
                thumbnail=lambda page: self._thumbnail(page, thumbnails))

    def _thumbnail(self, page: Any, band: Any) -> Any:
        """A page shown again smaller: one shared entry per page and band (`pages.PageCache`)."""
        entry = self.observer.pages.get(("thumbnail", page.entry.key, band), lambda: fit_to_band(page.image, band).entry)
        return page_of(entry, band)

    def failure_warning(self, metrics: dict) -> Optional[str]:
        """A warning for a batch whose retriever calls failed too often, or None."""
        from ..retrieval.preflight import failure_rate_warning

        return None if self.format is None else failure_rate_warning(metrics, self.config.retriever_failure_warn_rate)

    # ---- a trainer's batch in and out ----
    def episodes(self, prompts: Any, n: int) -> list[Episode]:
        """`n` adjacent episodes per prompt row; with tools, the prompts are checked against the
        format and the retriever is asked about their documents first."""
        input_ids = prompts.batch["input_ids"]
        attention = prompts.batch["attention_mask"]
        raw_ids = prompts.non_tensor_batch.get("raw_prompt_ids")
        entries = prompt_entries(prompts.non_tensor_batch.get("multi_modal_data"), len(input_ids))
        doc_ids = self.doc_ids(prompts)
        episodes = []
        for row in range(len(input_ids)):
            engine_ids = list(raw_ids[row]) if raw_ids is not None else self._collapse(input_ids[row], attention[row])
            images = engine_images(entries[row], prompts.meta_info)
            for copy in range(n):
                episodes.append(Episode(index=row * n + copy, prompt_engine_ids=engine_ids, prompt_images=images,
                                        doc_id=doc_ids[row], response_length=self.config.response_length,
                                        max_images=self.max_images))
        if self.format is not None:
            # Decoding is the format's business: only the one that checks prompts pays for it.
            self.format.check_prompts([episode.prompt_engine_ids for episode in episodes[::n]], self.tokenizer)
            self.preflight(doc_ids, self._page_counts(prompts))
        return episodes

    def doc_ids(self, prompts: Any) -> list[Optional[str]]:
        if self.format is None:
            return [None] * len(prompts.batch["input_ids"])
        key = self.config.doc_id_key
        column = prompts.non_tensor_batch.get(key)
        if column is None:
            raise ValueError(
                f"the prompts carry no {key!r} column: the agent searches inside each sample's document, "
                f"so the trainer must pop {key!r} into the generation batch (see docs/easyr1.md)"
            )
        return [None if value is None else str(value) for value in column]

    def _page_counts(self, prompts: Any) -> Optional[list]:
        """The page counts the data recorded per sample (None where it recorded none), or None
        for a batch without the column."""
        column = prompts.non_tensor_batch.get(self.config.page_count_key)
        if column is None:
            return None
        from ..retrieval.preflight import page_count_value

        return [page_count_value(value) for value in column]

    def _collapse(self, ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
        """Left padding removed and each expanded image pad run collapsed to one pad."""
        pad = self.vision_tokens.image_pad
        out: list[int] = []
        for token in ids[mask.bool()].tolist():
            if token == pad and out and out[-1] == pad:
                continue
            out.append(token)
        return out

    def assemble(self, prompts: Any, episodes: list[Episode], n: int, clock: ScheduleClock) -> Any:
        """The trainer's batch: one row per episode, or per segment under a context policy (an
        episode's rows adjacent, in order, each beside its prompt)."""
        meta = prompts.meta_info
        spec = BatchSpec(
            response_length=self.config.response_length,
            pad_token_id=_pad_token_id(meta, self.tokenizer),
            image_pad_id=self.vision_tokens.image_pad,
            merge_size=self.merge_size,
            position_layout=self.config.position_ids_layout,
            image_key=image_key(prompts.non_tensor_batch.get("multi_modal_data")),
            with_logprobs=self.config.calculate_log_probs,
            segmented=self.config.edits_context,
        )
        rows = batch_rows(episodes)
        prompt_of = torch.tensor([row.episode.index // n for row in rows], dtype=torch.long)
        prompt_ids = prompts.batch["input_ids"][prompt_of]
        prompt_mask = prompts.batch["attention_mask"][prompt_of]
        prompt_positions = prompts.batch["position_ids"][prompt_of]
        tensors = response_tensors(rows, spec)
        for key in ("response_mask", "loss_mask", "sampled_mask"):
            if key in tensors:
                tensors[key] = tensors[key].to(prompt_mask.dtype)
        tensors.update(
            prompts=prompt_ids,
            input_ids=torch.cat([prompt_ids, tensors["responses"]], dim=-1),
            attention_mask=torch.cat([prompt_mask, tensors["response_mask"]], dim=-1),
            position_ids=response_position_ids(prompt_positions, prompt_mask, rows, spec),
        )
        entries = prompt_entries(prompts.non_tensor_batch.get("multi_modal_data"), len(prompts.batch["input_ids"]))
        non_tensors = episode_columns(rows, [entries[int(k)] for k in prompt_of], spec)
        # each episode's own latency: from the call's start to the turn that ended it
        non_tensors["episode_seconds"] = np.array(
            [max(0.0, (row.episode.ended_at or time.perf_counter()) - clock.started) for row in rows], dtype=np.float64)
        if self.format is not None:  # the document each sample searched, beside its episode
            key = self.config.doc_id_key
            non_tensors[key] = object_array([prompts.non_tensor_batch[key][int(k)] for k in prompt_of])
        meta_out = dict(meta)
        timing = clock.metrics()
        meta_out["metrics"] = collect_metrics(episodes, self._client_stats(), time.perf_counter() - clock.started)
        meta_out["metrics"].update(timing)
        meta_out.update(self.rollout_meta())
        return type(prompts)(
            batch=TensorDict(tensors, batch_size=[len(rows)]),
            non_tensor_batch=non_tensors,
            meta_info=meta_out,
        )

    def _client_stats(self) -> dict:
        stats = getattr(self.retriever, "stats", None)
        return stats.snapshot() if stats is not None else {}

    def rollout_meta(self) -> dict:
        """What a checker needs to know of how the batch was sampled (its `meta_info` entries)."""
        meta: dict = {"model_family": self.family.name,
                      # Under a grammar vLLM's logprobs are those of the constrained distribution (README).
                      "action_grammar": self.sampling.constrained}
        # the grammars themselves: `check --forward` replays them (verify/check/grammar_replay.py)
        meta.update({key: value for key, value in (("action_regex", self.sampling.action_regex),
                                                   ("first_turn_action_regex", self.sampling.first_turn_regex))
                     if value})
        if self.config.calculate_log_probs:
            meta["rollout_log_probs_mode"] = self.logprobs_mode or "unknown"
            # What the sampled distribution had applied, for checkers that recompute it.
            meta["logit_bias"] = {int(token): BANNED_LOGIT_BIAS for token in self.sampling.banned}
        if self.format is not None:  # the pixel band pages were resized into in this call
            band, lowest = self.observer.band, self.observer.band.min_pixels
            if self.shrinks_pages:  # thumbnails and budgets go down to the smallest page the trainer keeps
                lowest = min(lowest, max(self.observer.floor_pixels, band.factor ** 2))
            meta["page_pixel_band"] = (lowest, band.max_pixels)
        return meta


def _stamped(episode: Episode, result: Any = None) -> Any:
    """Note when `episode` ended (the first time it is seen done); returns `result`."""
    if episode.done and episode.ended_at is None:
        episode.ended_at = time.perf_counter()
    return result


def _dp_rank(config: AgentRolloutConfig) -> int:
    return data_parallel_rank(config.tensor_parallel_size)


def _merge_size(processor: Any) -> int:
    image_processor = getattr(processor, "image_processor", processor)
    return int(getattr(image_processor, "merge_size", 2) or 2)


def _pad_token_id(meta: dict, tokenizer: Any) -> int:
    pad = meta.get("pad_token_id", tokenizer.pad_token_id)
    if pad is None:
        pad = tokenizer.eos_token_id
    return int(pad)


__all__ = ["DECODE_SLACK_S", "EpisodeDriver"]
