"""The rollout classes a trainer calls: `BaseRollout`, `vLLMRollout`, `vLLMRolloutAgent`.

Each holds a vLLM engine and an `EpisodeDriver` (`driver.py`: everything per turn and per batch,
engine-free) and runs one of the two schedules (`schedules.py`) with them. `vLLMRollout` is the
single-turn rollout with EasyR1's semantics; `vLLMRolloutAgent` is the multi-turn agent over a
page-image retriever, in either action format (`vrag_rollout/formats/`). The EasyR1 worker reaches the
engine as `inference_engine` and calls `generate_sequences` and `update_sampling_params`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ..progress import report
from ..config import AgentRolloutConfig
from ..engine.llm import VLLMEngine, build_llm, check_engine_limits
from ..engine.sampling import overrides_from_meta
from ..families import detect_family, logits_width
from .driver import EpisodeDriver
from .schedules import ScheduleClock, run_continuous, run_turn_synchronized

logger = logging.getLogger(__name__)


class BaseRollout(ABC):
    @abstractmethod
    def generate_sequences(self, prompts: Any) -> Any:
        """prompts: a DataProto of left-padded prompts -> a DataProto of prompts + responses."""


def _logits_width(engine: Any, model_path: str) -> Optional[int]:
    """The engine's own vocabulary size (what vLLM checks a logit bias against), else the local
    checkpoint's."""
    vocab_size = getattr(getattr(getattr(engine, "llm_engine", None), "model_config", None), "get_vocab_size", None)
    return vocab_size() if vocab_size is not None else logits_width(model_path)


class vLLMRollout(BaseRollout):
    """Single-turn rollout with EasyR1's semantics: n samples per prompt, adjacent.

    `driver_class` builds the rollout's driver: a subclass of `EpisodeDriver` changes what the
    rollout does per turn (e.g. a test's sampling parameters for one turn)."""

    driver_class: type = EpisodeDriver
    with_tools = False

    def __init__(self, model_path: str, config: Any, tokenizer: Any, processor: Any = None, *,
                 inference_engine: Any = None, data_parallel_rank: Optional[int] = None,
                 group_sync: Any = None, retriever: Any = None, **kwargs: Any):
        config = AgentRolloutConfig.from_any(config)
        if config.response_length < 1 or config.prompt_length < 1:
            raise ValueError("prompt_length and response_length must be set (> 0) in the rollout config")
        detect_family(model_path, processor)  # before the engine starts: an unsupported model fails here
        self.inference_engine = inference_engine or build_llm(model_path, config, config.images_per_sample())
        self.engine = VLLMEngine(self.inference_engine)
        self.driver = self.driver_class(
            model_path, config, tokenizer, processor, logits_width=_logits_width(self.inference_engine, model_path),
            tools=self.with_tools, retriever=retriever, data_parallel_rank=data_parallel_rank, group_sync=group_sync)
        self.driver.logprobs_mode = self.logprobs_mode = check_engine_limits(self.driver.config, self.inference_engine)
        self.processor = processor

    # What callers read of the rollout: the driver's own settings, model family and tokenizer.
    @property
    def config(self) -> AgentRolloutConfig:
        return self.driver.config

    @property
    def family(self) -> Any:
        return self.driver.family

    @property
    def tokenizer(self) -> Any:
        return self.driver.tokenizer

    @contextmanager
    def update_sampling_params(self, **kwargs: Any) -> Iterator[None]:
        """Override sampling settings for the duration of one call (as EasyR1 does)."""
        with self.driver.sampling.overridden(**kwargs):
            yield

    def generate_sequences(self, prompts: Any) -> Any:
        driver = self.driver
        clock = ScheduleClock()
        driver.start_call()
        with self.update_sampling_params(**overrides_from_meta(prompts.meta_info)):
            n = driver.sampling.n  # an override of n holds for this call only
            episodes = driver.episodes(prompts, n)
            driver.before_rollout(prompts.meta_info)
            report("rolling out %d episodes (%d questions x %d samples), at most %d turns each", len(episodes),
                   len(episodes) // max(n, 1), n, driver.max_turns)
            if self.config.rollout_mode == "continuous":
                run_continuous(driver, self.inference_engine, episodes, clock,
                               max_inflight=max(1, self.config.retriever_max_concurrency))
            else:
                run_turn_synchronized(driver, self.engine, episodes, clock)
            for episode in episodes:
                episode.finish("max_turns")  # no-op for episodes that already ended
        output = driver.assemble(prompts, episodes, n, clock)
        warning = driver.failure_warning(output.meta_info["metrics"])
        if warning is not None:
            logger.warning("%s", warning)
        return output


class vLLMRolloutAgent(vLLMRollout):
    """Multi-turn search/fetch agent over a page-image retriever, in the tag action format or the
    model's native tool-call format (`action_format`)."""

    with_tools = True

    def __init__(self, model_path: str, config: Any, tokenizer: Any, processor: Any, *,
                 inference_engine: Any = None, retriever: Any = None, **kwargs: Any):
        super().__init__(model_path, config, tokenizer, processor, inference_engine=inference_engine,
                         retriever=retriever, **kwargs)

    @property
    def retriever(self) -> Any:
        """The retriever the driver calls; replacing it here replaces the driver's."""
        return self.driver.retriever

    @retriever.setter
    def retriever(self, retriever: Any) -> None:
        self.driver.retriever = retriever
