"""Rollout configuration: EasyR1's RolloutConfig fields plus the agent's own."""

from __future__ import annotations

import os

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# VRAG's band for result pages, in visual tokens: the pixel band is these times the model's own
# (patch * merge)^2 (28^2 for Qwen2/2.5-VL, 32^2 for Qwen3-VL), unless set in pixels.
DEFAULT_PAGE_MIN_TOKENS = 256
DEFAULT_PAGE_MAX_TOKENS = 512

POSITION_LAYOUTS = ("auto", "4", "3")
ACTION_FORMATS = ("tags", "tool_call")
ROLLOUT_MODES = ("sync", "continuous")
PREFLIGHT_MODES = ("fail", "warn", "off")  # retriever_preflight (rollout/agent.py, retrieval/preflight.py)
GUARD_MODES = ("fail", "drop", "warn", "off")  # guard (verify/guard.py MODES)
GUARD_SAMPLES_AUTO = "auto"  # guard_samples_dir: under the run's output (see the field)
GUARD_SAMPLES_NAME = "guard_bad_samples"
CONTEXT_EDIT_FORMS = ("stub", "thumbnail")  # context_edit_form (core/context_edit.py)


def guard_samples_under(value: Optional[str], run_output: Optional[str]) -> Optional[str]:
    """`guard_samples_dir` resolved: "auto" becomes `guard_bad_samples/` under `run_output` (the
    run's own output directory), or None (save none) when the run names none; else as given."""
    if value != GUARD_SAMPLES_AUTO:
        return value
    return os.path.join(str(run_output), GUARD_SAMPLES_NAME) if run_output else None


@dataclass
class AgentRolloutConfig:
    """Everything `vLLMRollout` and `vLLMRolloutAgent` read.

    The first block mirrors EasyR1's `RolloutConfig` (same names, same meaning) so a trainer's
    rollout section can be passed as is; the second block is the agent's.
    """

    # --- EasyR1 RolloutConfig ---
    name: str = "vllm"
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = 1
    limit_images: int = 0
    dtype: str = "bf16"
    gpu_memory_utilization: float = 0.6
    ignore_eos: bool = False
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    tensor_parallel_size: int = 1
    max_model_len: Optional[int] = None
    max_num_batched_tokens: int = 8192
    disable_log_stats: bool = True
    disable_tqdm: bool = True
    val_override_config: dict = field(default_factory=dict)
    prompt_length: int = -1
    response_length: int = -1
    trust_remote_code: bool = False

    # --- engine construction (not in EasyR1's config; EasyR1 hard-codes these) ---
    # "auto" (default): load the weights from model_path. "dummy": random weights, for a trainer
    # that syncs its actor's weights into the engine before the first rollout. (EasyR1 builds its
    # own engine that way and passes it in; this field is then unused.)
    load_format: str = "auto"
    enable_sleep_mode: bool = True  # ignored where the platform has no sleep mode (CPU)
    # Return each sampled token's logprob under the distribution it was sampled from (vision-token
    # ban and temperature applied; README "Logprobs"). Under action_regex they are the grammar-
    # constrained distribution's, not the model's: meta_info["action_grammar"] says so.
    calculate_log_probs: bool = False

    # --- agent ---
    retriever_url: str = "http://127.0.0.1:8002"
    retriever_api_key: Optional[str] = None
    retriever_timeout: float = 10.0
    retriever_retries: int = 2
    retriever_max_concurrency: int = 4
    # Replay recorded retriever traffic from this fixture file instead of calling retriever_url.
    retriever_fixtures: Optional[str] = None
    # Before sampling a batch: is the retriever reachable, and does it serve every doc_id of the
    # batch? "fail" refuses the batch with a message naming the fix, "warn" logs it once per
    # problem and goes on, "off" skips the check.
    retriever_preflight: str = "fail"
    # A warning when more than this fraction of a batch's retriever items failed.
    retriever_failure_warn_rate: float = 0.25
    top_n: int = 2
    max_turns: int = 4
    # Pixel band result pages are resized into; None: DEFAULT_PAGE_MIN/MAX_TOKENS visual tokens
    # of the model, kept inside its processor's own band.
    page_min_pixels: Optional[int] = None
    page_max_pixels: Optional[int] = None
    fetch_modes: tuple = ("image", "text")
    # --- visual budgets that keep one sequence (README "Context budget") ---
    # Search results as thumbnails: at most this many pixels a page (None: the page band);
    # fetched pages and crops keep the full band (look, then look closer).
    search_page_max_pixels: Optional[int] = None
    # Visual tokens one episode may be shown in all (0: no limit). As it is spent, later pages
    # get a lower band (an observation's pages share what is left); a page that would fall below
    # the trainer's smallest image is left out, and the policy is told so.
    visual_token_budget: int = 0
    # --- context edits (each edit starts a new training row, a segment: core/context_edit.py) ---
    # Before each turn, images older than the last `context_keep_turns` turns (0: no limit), or
    # beyond the last `context_keep_pages` images (0: no limit), are replaced by a text stub
    # naming the page ("stub") or by a thumbnail of it ("thumbnail", at search_page_max_pixels,
    # else a quarter of the page band). Both 0: no edit, one row per episode as always.
    context_keep_turns: int = 0
    context_keep_pages: int = 0
    context_edit_form: str = "stub"
    # Edit only once a limit is passed by more than this many turns (or images), then back down to
    # it: an episode of T turns makes about (T - keep) / (slack + 1) rows instead of T - keep.
    context_edit_slack: int = 0
    # The region action (tags format): `<crop>page, [x1, y1, x2, y2]</crop>` (or VRAG-RL's
    # `<bbox>[...]</bbox>`, the last page shown) zooms into a region of a page the episode saw,
    # the box in the model family's grounding frame (core/regions.py); the retriever renders it.
    region_action: bool = False
    # Longest page text a `<fetch>text, N</fetch>` injects, in tokens (longer text is cut).
    max_fetch_text_tokens: int = 512
    # The non-tensor batch column holding each sample's document id.
    doc_id_key: str = "doc_id"
    # The column holding each document's page count as the data recorded it (`convert-dataset
    # --index` writes it); where a batch has it, the preflight checks the retriever's counts agree.
    page_count_key: str = "page_count"
    # Images one sample may hold (prompt + retrieved); 0 = limit_images, or derived from turns.
    max_images_per_sample: int = 0
    # "auto" follows the input's position_ids; "4" or "3" forces the (bs, 4|3, L) layout.
    position_ids_layout: str = "auto"
    # "sync": one generate call per turn for all samples; "continuous": each sample advances on
    # its own through vLLM's continuous batching, with tool calls overlapping generation.
    rollout_mode: str = "continuous"
    # "tags": <search>/<fetch>/<answer> inside one assistant turn, results in <result></result>;
    # "tool_call": the model's own chat-template tool calls, results as tool turns (README).
    action_format: str = "tags"
    # A chat template file to render tool turns with instead of the tokenizer's own (tool_call).
    chat_template: Optional[str] = None
    # Optional regex that constrains each turn (vLLM structured outputs), e.g. for tiny policies.
    # It also changes the rollout logprobs: vLLM masks the logits before computing them.
    action_regex: Optional[str] = None
    # The grammar of an episode's first turn instead of action_regex (e.g. "search or fetch first").
    first_turn_action_regex: Optional[str] = None
    # The live guard (verify/guard.py) on every batch handed to the trainer: "drop" takes a bad
    # sample out of the loss, "fail" stops the step with the report, "warn" only reports, "off"
    # skips it. The mrope comparison runs on this fraction of each batch's samples (at least one).
    guard: str = "drop"
    guard_positions_fraction: float = 0.125
    # Where the run's first `guard_samples_limit` bad samples are saved (`vrag-rollout view`
    # opens each file): "auto" puts `guard_bad_samples/` under the run's own output (EasyR1's
    # trainer.save_checkpoint_path, verl's trainer.default_local_dir, learn's --out), never in
    # whatever directory the trainer was started from; a path; None saves none.
    guard_samples_dir: Optional[str] = GUARD_SAMPLES_AUTO
    guard_samples_limit: int = 16

    def __post_init__(self) -> None:
        self.fetch_modes = tuple(self.fetch_modes)
        problems = []
        if self.n < 1:
            problems.append(f"n must be >= 1, got {self.n}")
        if self.top_n < 1:
            problems.append(f"top_n must be >= 1, got {self.top_n}")
        if self.max_turns < 1:
            problems.append(f"max_turns must be >= 1, got {self.max_turns}")
        low, high = self.page_min_pixels, self.page_max_pixels
        if (low is not None and low <= 0) or (high is not None and high <= 0) or (
            low is not None and high is not None and low > high
        ):
            problems.append(
                f"need 0 < page_min_pixels <= page_max_pixels, got "
                f"{self.page_min_pixels}..{self.page_max_pixels}"
            )
        if self.search_page_max_pixels is not None and self.search_page_max_pixels <= 0:
            problems.append(f"search_page_max_pixels must be > 0, got {self.search_page_max_pixels}")
        for name in ("visual_token_budget", "context_keep_turns", "context_keep_pages", "context_edit_slack"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        if self.context_edit_form not in CONTEXT_EDIT_FORMS:
            problems.append(f"context_edit_form must be one of {CONTEXT_EDIT_FORMS}, got {self.context_edit_form!r}")
        unknown_modes = set(self.fetch_modes) - {"image", "text"}
        if unknown_modes:
            problems.append(f"fetch_modes may hold 'image' and 'text' only, got {sorted(unknown_modes)}")
        if self.action_format not in ACTION_FORMATS:
            problems.append(f"action_format must be one of {ACTION_FORMATS}, got {self.action_format!r}")
        if self.rollout_mode not in ROLLOUT_MODES:
            problems.append(f"rollout_mode must be one of {ROLLOUT_MODES}, got {self.rollout_mode!r}")
        if str(self.position_ids_layout) not in POSITION_LAYOUTS:
            problems.append(f"position_ids_layout must be one of {POSITION_LAYOUTS}")
        budget = self.prompt_length + self.response_length
        if self.max_model_len is not None and self.prompt_length > 0 and self.response_length > 0 and self.max_model_len < budget:
            problems.append(
                f"max_model_len {self.max_model_len} < prompt_length + response_length = {budget}: vLLM would "
                "reject a long episode mid-batch"
            )
        if self.retriever_preflight not in PREFLIGHT_MODES:
            problems.append(f"retriever_preflight must be one of {PREFLIGHT_MODES}, got {self.retriever_preflight!r}")
        if not 0 <= self.retriever_failure_warn_rate <= 1:
            problems.append(f"retriever_failure_warn_rate must be within 0..1, got {self.retriever_failure_warn_rate}")
        if self.retriever_retries < 0 or self.retriever_timeout <= 0:
            problems.append("retriever_retries must be >= 0 and retriever_timeout > 0")
        if self.guard not in GUARD_MODES:
            problems.append(f"guard must be one of {GUARD_MODES}, got {self.guard!r}")
        if not 0 <= self.guard_positions_fraction <= 1:
            problems.append(f"guard_positions_fraction must be within 0..1, got {self.guard_positions_fraction}")
        if self.guard_samples_limit < 0:
            problems.append(f"guard_samples_limit must be >= 0, got {self.guard_samples_limit}")
        if problems:
            raise ValueError("invalid rollout config: " + "; ".join(problems))
        self.position_ids_layout = str(self.position_ids_layout)

    @classmethod
    def from_any(cls, config: Any) -> "AgentRolloutConfig":
        """Accept this class, a mapping, an OmegaConf node or any object with these attributes.

        Keys this class does not know are rejected, as EasyR1's structured config does, so a typo
        in a trainer config fails loudly instead of silently using a default.
        """
        if isinstance(config, cls):
            return config
        values = _as_mapping(config)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown rollout config keys: {unknown}")
        return cls(**values)

    def updated(self, **overrides: Any) -> "AgentRolloutConfig":
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **overrides)

    @property
    def edits_context(self) -> bool:
        """Whether a context policy may edit the past (episodes may then have several rows)."""
        return self.context_keep_turns > 0 or self.context_keep_pages > 0

    def images_per_sample(self, prompt_images: int = 1) -> int:
        if self.max_images_per_sample > 0:
            return self.max_images_per_sample
        if self.limit_images > 0:
            return self.limit_images
        return prompt_images + (self.max_turns - 1) * self.top_n


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    try:  # OmegaConf nodes (DictConfig) convert to plain containers
        from omegaconf import OmegaConf

        if OmegaConf.is_config(config):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:
        pass
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return {k: v for k, v in vars(config).items() if not k.startswith("_")}
