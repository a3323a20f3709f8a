"""Per-request sampling settings (pure apart from the vLLM SamplingParams class it fills).

EasyR1 copies every rollout config field that SamplingParams also has; this module does the same,
then fixes what a multi-turn agent needs: stop strings kept in the output (so detokenize is on),
a per-turn `max_tokens`, vision special tokens banned, and one distinct seed per sample and turn
so that the n samples of a prompt differ even under a fixed config seed.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence

# Fields the agent sets itself; a config or override never sets them directly.
_AGENT_OWNED = {"n", "max_tokens", "seed", "stop", "include_stop_str_in_output", "detokenize", "logit_bias", "logprobs"}
BANNED_LOGIT_BIAS = -100.0


def sampling_field_names() -> frozenset:
    from vllm import SamplingParams

    return frozenset(name for name in SamplingParams.__struct_fields__ if not name.startswith("_"))


def request_seed(base_seed: Optional[int], step: int, sample: int, turn: int, rank: int = 0) -> Optional[int]:
    """A seed unique to (data-parallel rank, rollout step, sample, turn) derived from the config
    seed; None stays None.

    Reusing the config seed for every copy of a prompt would give n identical samples; `sample`
    is an index within this rank's shard, so the rank keeps the same prompt on two data-parallel
    ranks from getting the same noise.
    """
    if base_seed is None:
        return None
    key = f"{base_seed}:{step}:{sample}:{turn}" + (f":dp{rank}" if rank else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class SamplingPlan:
    """Base sampling settings plus temporary overrides (EasyR1's `update_sampling_params`)."""

    def __init__(self, config: Any, banned_token_ids: Sequence[int], stop: Sequence[str] = (),
                 action_regex: Optional[str] = None, logprobs: bool = False,
                 first_turn_regex: Optional[str] = None):
        self._fields = sampling_field_names()
        self.base: dict = {k: getattr(config, k) for k in self._fields - _AGENT_OWNED if hasattr(config, k)}
        self.n = int(config.n)
        self.seed = config.seed
        self.stop = list(stop)
        self.banned = list(banned_token_ids)
        self.action_regex = action_regex
        self.first_turn_regex = first_turn_regex  # an episode's first turn, instead of action_regex
        self.logprobs = logprobs

    @property
    def constrained(self) -> bool:
        """Whether a grammar constrains some turn (the rollout logprobs are then the grammar's)."""
        return bool(self.action_regex or self.first_turn_regex)

    @contextmanager
    def overridden(self, **overrides: Any) -> Iterator["SamplingPlan"]:
        """Apply overrides whose names SamplingParams knows (plus n and seed) for one call."""
        saved = (dict(self.base), self.n, self.seed)
        for key, value in overrides.items():
            if key == "n":
                self.n = int(value)
            elif key == "seed":
                self.seed = value
            elif key in self._fields and key not in _AGENT_OWNED:
                self.base[key] = value
        try:
            yield self
        finally:
            self.base, self.n, self.seed = saved

    def params(self, max_tokens: int, seed: Optional[int], first_turn: bool = False) -> Any:
        from vllm import SamplingParams

        return SamplingParams(**self.params_kwargs(max_tokens, seed, first_turn))

    def params_kwargs(self, max_tokens: int, seed: Optional[int], first_turn: bool = False) -> dict:
        """The keyword arguments of `params` (a server that builds the SamplingParams itself takes these)."""
        kwargs = dict(self.base)
        kwargs.update(
            n=1,
            max_tokens=max_tokens,
            seed=seed,
            detokenize=True,  # stop strings are matched on text
            logit_bias={token: BANNED_LOGIT_BIAS for token in self.banned},
        )
        if self.stop:
            kwargs.update(stop=list(self.stop), include_stop_str_in_output=True)
        if self.logprobs:
            kwargs["logprobs"] = 0  # the sampled token's own logprob
        regex = self.first_turn_regex if first_turn and self.first_turn_regex else self.action_regex
        if regex:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(regex=regex)
        return kwargs


def data_parallel_rank(tensor_parallel_size: int) -> int:
    """This process's data-parallel rank: its global rank over the tensor-parallel group size
    (ranks of one TP group are consecutive, as in EasyR1), 0 outside torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() // max(1, int(tensor_parallel_size))
    return 0


def overrides_from_meta(meta_info: Mapping[str, Any]) -> dict:
    """The meta_info entries that are sampling overrides (EasyR1 passes the whole meta_info)."""
    return {k: v for k, v in meta_info.items() if k not in {"eos_token_id", "pad_token_id"}}
