"""The action grammar replayed over the forward pass: which tokens vLLM's grammar allowed at each
sampled position, so that a grammar turn's rollout log-probs are compared exactly, not bounded.

vLLM constrains a request with a regex through xgrammar: before sampling it masks the logits of
every token the grammar does not allow at that point, then applies the logit bias, temperature
and top-k / top-p. Each turn is a request of its own, so its grammar starts from the beginning at
the turn's first sampled token: `first_turn_action_regex` (else `action_regex`) on turn 1,
`action_regex` on the later turns (none: a free turn).

A finished grammar lets the request end on its stop tokens: vLLM hands the matcher the request's
end-of-sequence ids (the generation config's and the tokenizer's), here `stop_ids`.

Contract: `GrammarReplay.of(saved, tokenizer, width, stop_ids)` is None when the batch does not record its
grammars in its config (a trainer pickle records only that one was active) or xgrammar (vLLM's
own dependency) is not installed; else `mask(logits, turns, tokens)` takes one row's sampled
tokens, their turn ids and the (S, width) logits before each, in order, masks in place the tokens
the grammar did not allow (rows of free turns untouched) and returns the index of the first
sampled token the grammar does not accept (None: every turn is a sample of its grammar).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..saved_batch import SavedBatch


_COMPILERS: dict = {}  # (tokenizer, its length, logits width) -> (xgrammar compiler, {regex: compiled})


class GrammarReplay:
    def __init__(self, compiled: dict[int, Any], later: Any, width: int, stop_ids: list[int]):
        self.compiled, self.later, self.width = compiled, later, width  # turn 1's grammar; every later turn's
        self.stop_ids = stop_ids

    @classmethod
    def of(cls, saved: SavedBatch, tokenizer: Any, width: int, stop_ids: Any) -> Optional["GrammarReplay"]:
        config = saved.config or {}
        every, first = config.get("action_regex"), config.get("first_turn_action_regex")
        if not (every or first) or "turn_ids" not in saved.tensors:
            return None
        try:
            import xgrammar
        except ImportError:
            return None
        key = (getattr(tokenizer, "name_or_path", None), len(tokenizer), width)
        if key not in _COMPILERS:  # a vocabulary's tables take a while to build: once per process
            _COMPILERS[key] = (xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=width)), {})
        compiler, cache = _COMPILERS[key]

        def compile_once(regex: Optional[str]) -> Any:
            if not regex:
                return None
            if regex not in cache:
                cache[regex] = compiler.compile_regex(regex)
            return cache[regex]

        return cls({1: compile_once(first or every)}, compile_once(every), width, sorted(int(i) for i in stop_ids))

    def grammar_of(self, turn: int) -> Any:
        return self.compiled.get(turn, self.later)

    def mask(self, logits: torch.Tensor, turns: torch.Tensor, tokens: torch.Tensor) -> Optional[int]:
        """Set to -inf, in place, the (S, width) `logits` of the tokens each sampled token's grammar did
        not allow before it (rows of free turns untouched); the index of the first sampled token the
        grammar does not accept, or None."""
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(len(tokens), self.width)  # all allowed until filled
        rejected: Optional[int] = None
        matcher, current = None, None
        for k, (turn, token) in enumerate(zip(turns.tolist(), tokens.tolist())):
            if turn != current:  # a turn is a request of its own: its grammar starts again
                current, grammar = turn, self.grammar_of(turn)
                matcher = None if grammar is None else xgrammar.GrammarMatcher(
                    grammar, override_stop_tokens=self.stop_ids or None)
            if matcher is None:
                continue
            matcher.fill_next_token_bitmask(bitmask, k)
            if not matcher.accept_token(int(token)) and rejected is None:
                rejected = k
                matcher = None  # past a rejected token the grammar's state is unknown: the rest of the turn unmasked
        xgrammar.apply_token_bitmask_inplace(logits, bitmask)
        return rejected


__all__ = ["GrammarReplay"]
