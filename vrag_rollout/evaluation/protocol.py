"""The evaluation protocol: every switch that changes a score, pinned and recorded (pure).

Published numbers move with the protocol as much as with the model: whether the agent searches
the whole corpus or the gold document, how many turns it gets, whether an episode that ran out
of turns without answering scores as wrong or is left out, whether unanswerable questions
count, and whether an answer given without a search counts. `Protocol` names each switch; the
report prints it beside the numbers, `results.jsonl` starts with it, and a resumed evaluation
refuses to mix two protocols in one file.

- `scope`: "corpus" (each question searches the whole index; VRAG-RL's setting for ViDoSeek and
  SlideVQA) or "document" (the question's own document; the long-document sets' setting), or
  None: as the data was converted.
- `max_turns`: the agent's turns per question (the last one must answer).
- `capped`: "wrong" (an episode that ended without an answer, on its turn or token budget,
  scores 0 like any wrong answer) or "exclude" (left out of every average, and counted apart).
- `unanswerable`: "score" (questions a set marks unanswerable count; the right answer is the
  set's "Not answerable") or "exclude" (left out, counted apart).
- `n`, `temperature`: samples per question and their temperature. The default, one greedy
  sample (temperature 0), is how the papers score; `n` > 1 needs a temperature above 0 (greedy
  decoding draws the same answer n times) and is reported as pass@1 (the mean over the samples)
  and pass@n (each question's best sample) (`evaluation.report`). `seed` is recorded.
- `judge`: the ViDoSeek judge, when one is used: its checkpoint path and prompt version.
- `search_required`: VRAG-RL's rule that an answer given without any search scores 0
  (`evaluation.search_rule`): True (every set), False (none), or None: as each set's protocol,
  on for the sets VRAG-RL scores (`SEARCH_REQUIRED_SETS`: ViDoSeek), off for the others
  (their papers score the answer alone). `requires_search(set_name)` resolves it.
- `search_page_max_pixels`, `visual_token_budget`, `context_keep_turns`, `context_keep_pages`,
  `context_edit_form`: the visual budget the agent ran under (the rollout config's fields of the
  same names, README "Context budget"): search results as thumbnails of at most that many pixels
  (None: the page band), visual tokens an episode may be shown in all (0: no limit), and the
  context edits between turns (images older than the last `context_keep_turns` turns, or beyond
  the last `context_keep_pages` images, become a text stub or a thumbnail; 0 and 0: no edit). A
  budget changes what the policy sees, so it changes scores; under context edits an episode is
  several rows, and it is scored once, from its last row.
- `name`, `overrides`: the named protocol the switches came from (`evaluation.protocols`: vrag-rl,
  document, own; None: switches given one by one) and, per switch set apart from it, the named
  protocol's own value ({"max_turns": 4}: the run changed max_turns from 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

SCOPES = ("corpus", "document")
CAPPED = ("wrong", "exclude")
UNANSWERABLE = ("score", "exclude")
SEARCH_REQUIRED_SETS = ("vidoseek",)  # scored under VRAG-RL's protocol
CONTEXT_EDIT_FORMS = ("stub", "thumbnail")  # config.CONTEXT_EDIT_FORMS, restated: evaluation/ imports only core/
BUDGET_FIELDS = ("search_page_max_pixels", "visual_token_budget", "context_keep_turns", "context_keep_pages",
                 "context_edit_form", "context_edit_slack")  # the rollout config's fields of these names


@dataclass(frozen=True)
class Protocol:
    scope: Optional[str] = None
    max_turns: int = 4
    capped: str = "wrong"
    unanswerable: str = "score"
    response_length: int = 1024
    top_n: int = 3
    n: int = 1
    temperature: float = 0.0
    seed: int = 0
    judge: Optional[dict] = None  # {"model": path, "prompt_version": ...}
    search_required: Optional[bool] = None
    search_page_max_pixels: Optional[int] = None
    visual_token_budget: int = 0
    context_keep_turns: int = 0
    context_keep_pages: int = 0
    context_edit_form: str = "stub"
    context_edit_slack: int = 0
    name: Optional[str] = None
    overrides: Optional[dict] = field(default=None)

    def __post_init__(self) -> None:
        for name, value, allowed in (("scope", self.scope, SCOPES + (None,)), ("capped", self.capped, CAPPED),
                                     ("unanswerable", self.unanswerable, UNANSWERABLE)):
            if value not in allowed:
                shown = ", ".join(str(a) for a in allowed if a is not None)
                raise ValueError(f"{name} must be one of {shown}, got {value!r}")
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {self.max_turns!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if self.n > 1 and self.temperature == 0:
            raise ValueError(f"n {self.n} at temperature 0 draws the same answer {self.n} times: "
                             "give a temperature above 0 for pass@k")
        if self.search_required is not None and not isinstance(self.search_required, bool):
            raise ValueError(f"search_required must be true, false or none, got {self.search_required!r}")
        pixels = self.search_page_max_pixels
        if pixels is not None and (isinstance(pixels, bool) or not isinstance(pixels, int) or pixels < 1):
            raise ValueError(f"search_page_max_pixels must be an integer >= 1 or none, got {pixels!r}")
        for name in ("visual_token_budget", "context_keep_turns", "context_keep_pages", "context_edit_slack"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0: off), got {value!r}")
        if self.context_edit_form not in CONTEXT_EDIT_FORMS:
            raise ValueError(f"context_edit_form must be one of {', '.join(CONTEXT_EDIT_FORMS)}, "
                             f"got {self.context_edit_form!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def budget(self) -> dict:
        """The rollout config's budget and context-edit fields, as this protocol sets them."""
        return {name: getattr(self, name) for name in BUDGET_FIELDS}

    def requires_search(self, set_name: str) -> bool:
        """Whether an answer to a question of `set_name` needs a search to score (VRAG-RL's rule)."""
        return set_name in SEARCH_REQUIRED_SETS if self.search_required is None else self.search_required

    def counts(self, *, answered: bool, answerable: bool) -> bool:
        """Whether a question with this outcome enters the averages."""
        return self.excluded_by(answered=answered, answerable=answerable) is None

    def excluded_by(self, *, answered: bool, answerable: bool) -> Optional[str]:
        """The switch that leaves a question with this outcome out ("unanswerable" or "capped"),
        or None when it counts."""
        if not answerable and self.unanswerable == "exclude":
            return "unanswerable"
        if not answered and self.capped == "exclude":
            return "capped"
        return None
