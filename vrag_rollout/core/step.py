"""One turn of one sample, pure: what the episode does after the engine returns its turn.

Every schedule (turn-synchronized, continuous) calls exactly these two functions, so the episode
logic cannot differ between them; neither touches the engine or the retriever.

- `after_generation(episode, output, ...)`: appends the sampled tokens verbatim, reads the action
  and settles it: the episode ends (answered, eos, length, abort, max_turns), or an invalid call
  is corrected in place with an error observation, or the action is returned because it needs
  the retriever.
- `observe(episode, observation, overflow)`: appends a tool result whole, or ends the episode on
  its budget and records what the result needed (`Episode.budget_overflow`).

Invariant: an episode ends with "length" only when the policy's own sampling hit the budget;
when an observation fills the response to the last token the episode ends with "budget", so the
final token of every "length" episode is a sampled one.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .actions import Answer, Crop, Fetch, Invalid, Search, Stop, parse_action
from .episode import Episode
from .observation import Observation, ObservationBuilder, Overflow
from .tool_turns import ToolCalls, final_answer, has_open_call, parse_tool_calls
from ..turn_output import LENGTH, STOP, TurnOutput


def after_generation(
    episode: Episode,
    output: TurnOutput,
    *,
    last_turn: bool,
    fetch_modes: Sequence[str],
    observations: ObservationBuilder,
    regions: bool = False,
) -> Optional[Search | Fetch | Crop]:
    """Append `output` (a `TurnOutput`) and settle its action; returns it when it needs
    the retriever, else None (the episode ended, or was corrected and may generate again)."""
    episode.append_sampled(output.token_ids, output.logprobs)
    action = parse_action(output.text, output.finish_reason, output.stop_reason, fetch_modes, regions)
    if isinstance(action, Answer):
        episode.answer = action.text
        episode.finish("answered")
        return None
    if isinstance(action, Stop):
        episode.finish(action.reason)
        return None
    if isinstance(action, Invalid):
        episode.count_invalid(action.kind)
    if last_turn:
        episode.finish("max_turns")
        return None
    if isinstance(action, Invalid):
        observe(episode, observations.error(action.message, episode.remaining),
                observations.error_overflow(action.message))
        return None
    return action


def after_tool_call_turn(episode: Episode, output: TurnOutput, *, last_turn: bool, turn_end: int,
                         regions: bool = False) -> Optional[ToolCalls]:
    """The native tool-call format's step: a turn ends at the end-of-turn token `turn_end`
    (`<|im_end|>`); its `<tool_call>` blocks are the actions (invalid ones included, each gets an
    error answer). A turn without a call ends the episode with its content as the answer. A turn
    that ended any other way (the length limit, another EOS, an abort) ends the episode: the
    chat format cannot continue after it. `crop` calls are actions only with `regions`."""
    episode.append_sampled(output.token_ids, output.logprobs)
    if output.finish_reason == LENGTH:
        episode.calls_cut += int(has_open_call(output.text))
        episode.finish("length")
        return None
    if output.finish_reason != STOP or not output.token_ids or output.token_ids[-1] != turn_end:
        episode.finish("eos" if output.finish_reason == STOP else "abort")
        return None
    calls = parse_tool_calls(output.text, regions)
    if not calls:
        episode.answer = final_answer(output.text)
        episode.finish("answered")
        return None
    for call in calls:
        if isinstance(call, Invalid):
            episode.count_invalid(call.kind)
    if last_turn:
        episode.finish("max_turns")
        return None
    return ToolCalls(tuple(calls))


def observe(episode: Episode, observation: Optional[Observation], overflow: Optional[Overflow] = None) -> None:
    """Append an observation whole; end the episode on its budget when it does not fit (recording
    what it needed: `overflow` when the builder could not make one, else the observation's own
    size), or when it leaves no room for the policy to sample again."""
    if observation is None or not episode.append_observation(observation):
        if observation is not None:
            overflow = Overflow(len(observation.trainer_ids), observation.page_ids)
        episode.record_overflow(overflow)
        episode.finish("budget")
    elif episode.remaining <= 0:
        episode.finish("budget")


def ready(episode: Episode) -> bool:
    """Whether the sample generates again; an episode whose own sampling used the last token of
    the budget ends with "length" here."""
    if not episode.done and episode.remaining <= 0:
        episode.finish("length")
    return not episode.done
