"""verl's partial rollouts on the real engine, for the tests: a server that aborts turns where it
is told to, behind verl's own resume loop (`FullyAsyncLLMServerClient.generate`).

verl 0.9.1 interrupts a rollout for a weight sync by aborting the requests in flight; its
`FullyAsyncLLMServerClient.generate` resubmits each with the tokens so far and hands the loop one
merged answer, with the weight versions it was sampled under. `PolicyServer` is the server that
loop calls (its base class's `generate`): the engine (`LocalTokenServer`), a test policy that
scripts turns, and an abort plan.

- The policy: the tiny model is random and never writes an action on its own, so `scripts[t]`
  is the text turn t must write, enforced on the server as a grammar (`literal_regex`); None is
  a free turn. A resubmitted request is constrained by the rest of the script after the text the
  turn already has: the exact remainder of a literal, so at temperature 0 a resumed turn samples
  what the uninterrupted one does. A script may run on past the action's stop string (`TAIL`):
  an uninterrupted request stops there, a resubmission that began inside the stop string does
  not see it and writes on, to the end-of-sequence token the script's end leaves.
- The plan: `cuts(first prompt, turn)` gives the token counts at which a turn is aborted
  (`inside_markers` places them inside each turn's stop string or closing tag, from an
  uninterrupted run's tokens). An abort answers "aborted" with the tokens so far, as vLLM's abort
  does, and moves the weight version on (`sync_every_abort`: one version per abort; else to 2).
- Records: `turn_tokens[(first prompt, turn)]`, the tokens of each completed turn;
  `trajectories[request id].turns`, each turn's plan and the aborts it got;
  `answered[request id]`, the versions that sampled each trajectory; `aborts`;
  `resumed_past_stop`, the stop strings a resubmission wrote past (what the loop must cut).

This is the loop's real path: verl's resume loop is verl's code, the loop is `vrag_agent` as
verl's worker instantiates it; only the server is this test's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

from verl.workers.rollout import llm_server
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

TAIL = " more"  # what a script writes after its action's stop string
CLOSING_TAGS = ("</tool_call>", "</answer>")  # where the native format's turns end (before the EOS)
_REGEX_SPECIALS = set(".^$*+?{}[]\\|()")


def literal_regex(text: str) -> str:
    """A regex matching exactly `text`."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in _REGEX_SPECIALS else c for c in text)


@dataclass
class _Turn:
    index: int
    prompt_len: int  # the prompt of the turn's first request
    cuts: list[int]
    tokens: list[int] = field(default_factory=list)
    interrupted: bool = False
    aborts: int = 0


@dataclass
class _Trajectory:
    first_prompt: tuple
    turns: list[_Turn] = field(default_factory=list)


class PolicyServer(LLMServerClient):
    sync_every_abort = False  # True: each abort is a weight sync of its own (version + 1), else 1 -> 2 once
    sync_between_turns = False  # True: a sync (version + 1) also while each tool call is out

    def __init__(self, config, load_balancer_handle=None, *, engine, tokenizer, scripts: Sequence[Optional[str]] = (),
                 cuts: Callable[[tuple, int], Sequence[int]] = lambda prompt, turn: (), **kwargs):
        self.config, self.engine, self.tokenizer = config, engine, tokenizer
        self.scripts, self.cuts = list(scripts), cuts
        self.eos_ids = {tokenizer.convert_tokens_to_ids(name) for name in ("<|im_end|>", "<|endoftext|>")}
        self.version, self.aborts = 1, 0
        self.trajectories: dict[str, _Trajectory] = {}
        self.turn_tokens: dict[tuple, list[int]] = {}
        self.answered: dict[str, set] = collections.defaultdict(set)
        self.resumed_past_stop: collections.Counter = collections.Counter()

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _turn(self, request_id: str, prompt_ids: Sequence[int]) -> _Turn:
        """This request's turn: the last one resubmitted (prompt = its prompt + its tokens), or a new one."""
        trajectory = self.trajectories.setdefault(request_id, _Trajectory(tuple(prompt_ids)))
        last = trajectory.turns[-1] if trajectory.turns else None
        if last is not None and last.interrupted and len(prompt_ids) == last.prompt_len + len(last.tokens):
            return last
        if last is not None and self.sync_between_turns:
            self.version += 1  # the weights changed while this trajectory's tool call was out
        index = len(trajectory.turns)
        trajectory.turns.append(_Turn(index, len(prompt_ids), sorted(self.cuts(trajectory.first_prompt, index))))
        return trajectory.turns[-1]

    def _constrain(self, params: dict, turn: _Turn) -> None:
        script = self.scripts[turn.index] if turn.index < len(self.scripts) else None
        if script is None:
            return
        from vllm.sampling_params import StructuredOutputsParams

        done = self.decode(turn.tokens)
        assert script.startswith(done) and len(done) < len(script), (script, done)
        params["structured_outputs"] = StructuredOutputsParams(regex=literal_regex(script[len(done):]))

    def _stopped(self, ids: Sequence[int], params: dict) -> bool:
        """Whether the request ended by itself (an EOS, or a stop string in its own output)."""
        if not ids:
            return False
        return ids[-1] in self.eos_ids or any(stop in self.decode(ids) for stop in params.get("stop") or ())

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
        params = dict(sampling_params)
        turn = self._turn(request_id, prompt_ids)
        resubmitted = bool(turn.tokens)
        self._constrain(params, turn)
        cut = next((c for c in turn.cuts if c > len(turn.tokens)), None)
        if cut is not None and cut - len(turn.tokens) < params["max_tokens"]:
            params["max_tokens"] = cut - len(turn.tokens)
        else:
            cut = None
        answer = await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=params,
                                            image_data=image_data)
        ids = list(answer.token_ids)
        turn.tokens += ids
        extra = {"global_steps": self.version}
        self.answered[request_id].add(self.version)
        if resubmitted:
            self._note_past_stop(turn, ids, params)
        turn.interrupted = cut is not None and len(turn.tokens) == cut and not self._stopped(ids, params)
        if turn.interrupted:
            self.aborts += 1
            turn.aborts += 1
            self.version = self.version + 1 if self.sync_every_abort else 2  # weights synced while it was out
            return TokenOutput(token_ids=ids, log_probs=answer.log_probs, stop_reason="aborted", extra_fields=extra)
        self.turn_tokens[(self.trajectories[request_id].first_prompt, turn.index)] = list(turn.tokens)
        return TokenOutput(token_ids=ids, log_probs=answer.log_probs, stop_reason="completed", extra_fields=extra)

    def _note_past_stop(self, turn: _Turn, ids: list[int], params: dict) -> None:
        """Count a resubmission that began inside a stop string and wrote on past its end."""
        text = self.decode(turn.tokens)
        before = len(self.decode(turn.tokens[:len(turn.tokens) - len(ids)]))
        for stop in params.get("stop") or ():
            start = text.find(stop)
            if start != -1 and start < before < start + len(stop) < len(text):
                self.resumed_past_stop[stop] += 1


class ResumingClient(FullyAsyncLLMServerClient, PolicyServer):
    """verl's fully async client (its `generate`: resubmit until not aborted, merge, record the
    weight versions) over the policy server instead of Ray's load balancer."""


class SyncingClient(ResumingClient):
    """The resume loop over the policy server, each abort a weight sync of its own, and a sync
    while each trajectory's tool call is out (so a trajectory's first version is not its cut turn's)."""

    sync_every_abort = True
    sync_between_turns = True


def inside_markers(turn_tokens: dict, decode: Callable[[list[int]], str], markers: Sequence[str],
                   early: int = 2) -> Callable[[tuple, int], list[int]]:
    """An abort plan from an uninterrupted run's turns: each turn is cut after `early` tokens and
    at every token boundary inside the first marker (stop string or closing tag) its text holds,
    never at its last token (a resumed script then has text left to write)."""

    def cuts(prompt: tuple, turn: int) -> list[int]:
        tokens = turn_tokens[(prompt, turn)]
        text = decode(tokens)
        found = [(text.find(m), m) for m in markers if m in text]
        plan = {early} if early < len(tokens) - 1 else set()
        if found:
            start, marker = min(found)
            plan |= {k for k in range(1, len(tokens) - 1) if start < len(decode(tokens[:k])) < start + len(marker)}
        return sorted(plan)

    return cuts


@contextlib.contextmanager
def without_resume_backoff() -> Iterator[None]:
    """verl's resume loop sleeps a second before each resubmission (a real abort waits for the
    weight sync): a pause, not a behaviour; the tests resubmit at once."""

    class _Asyncio:
        def __getattr__(self, name):
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(delay, result=None):
            return await asyncio.sleep(0, result)

    saved = llm_server.asyncio
    llm_server.asyncio = _Asyncio()
    try:
        yield
    finally:
        llm_server.asyncio = saved
