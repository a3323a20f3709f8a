"""The context-budget flags of `demo`, `rollout`, `learn` and `evaluate` (README "Context budget"):
the rollout config's fields of the same names, parsed and checked (argparse only: nothing heavy)."""

from __future__ import annotations

import argparse


def context_budget_flags(command: argparse.ArgumentParser) -> None:
    """The visual budgets and the context policy (README "Context budget"): rollout config fields."""
    group = command.add_argument_group("context budget (README \"Context budget\"; default: off)")
    group.add_argument("--search-page-max-pixels", type=int, default=None,
                       help="search results as thumbnails of at most this many pixels; fetched pages keep the band")
    group.add_argument("--visual-token-budget", type=int, default=None,
                       help="visual tokens an episode may be shown in all; later pages get a lower band as it is spent")
    group.add_argument("--context-keep-turns", type=int, default=None,
                       help="context edits: images older than the last N turns become stubs or thumbnails (each "
                            "edit starts a new training row)")
    group.add_argument("--context-keep-pages", type=int, default=None,
                       help="context edits: images beyond the last N become stubs or thumbnails")
    group.add_argument("--context-edit-form", choices=("stub", "thumbnail"), default=None,
                       help="what an edited image becomes (default: stub)")
    group.add_argument("--context-edit-slack", type=int, default=None,
                       help="edit only once a limit is passed by more than N turns or pages, then back to it: "
                            "fewer rows, longer rows (default: 0, edit every turn)")


CONTEXT_BUDGET = ("search_page_max_pixels", "visual_token_budget", "context_keep_turns", "context_keep_pages",
                  "context_edit_form", "context_edit_slack")


def context_settings(args: argparse.Namespace) -> dict:
    """The context-budget flags given, as rollout config fields; a bad value is one line naming its flag."""
    from .job_checks import JobInputError

    given = {name: getattr(args, name) for name in CONTEXT_BUDGET if getattr(args, name, None) is not None}
    for name, value in given.items():
        least = 1 if name == "search_page_max_pixels" else 0
        if name != "context_edit_form" and value < least:  # the form's choices are argparse's
            raise JobInputError(f"--{name.replace('_', '-')} must be at least {least}"
                                f"{' (0: off)' if least == 0 else ''}, got {value}")
    return given
