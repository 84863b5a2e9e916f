"""Self-speculative denoising: several sampler steps per forward pass, with the same result.

A masked diffusion model predicts every masked position in each pass, but a small model is rarely sure
of more than the next token, so the commit rules take about one token per pass at natural stops. Its
guesses further right still make a free draft: the next k-1 sampler steps are simulated on the current
pass's logits (the draft states), and one batched pass computes the logits of the current state and of
every draft state at once. Walking the chain, each draft state is kept while the sampler, given the real
logits of the state before it, makes exactly that state; the first mismatch ends the walk at a state the
sampler really reached. Every kept state is one the step-by-step sampler would have produced, so the
completion is the same (up to the rounding of a batched pass); what changes is how many passes it takes.

Measured on the shipped SmolLM2 block model (benchmarks/results/speculative/): k = 2 cuts passes per
token ~20% at natural stops, but a pass over two canvases costs 1.23x one on 1 CPU thread (1.07x on 2),
so wall time barely moves there; hence off by default. It pays where a batched pass is nearly free or
the model agrees with its own drafts more often.

This module is the chain: pure functions of one request's state. The engine's loop owns the passes,
the caches and the tail window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dg_lsp.engine.step import Committed


@dataclass(frozen=True)
class State:
    """One row's canvas (1, L) and its still-masked positions (1, L), after `step` sampler steps."""

    canvas: torch.Tensor
    masked: torch.Tensor
    step: int

    @property
    def finished(self) -> bool:
        return not bool(self.masked.any())

    def same(self, other: State) -> bool:
        return torch.equal(self.canvas, other.canvas) and torch.equal(self.masked, other.masked)


Advance = Callable[[torch.Tensor, State], tuple[State, Committed]]
"""(logits of a pass over `state`, state) -> (the state after one sampler step, what it committed). Must
not modify its arguments."""


def draft(
    advance: Advance,
    logits: torch.Tensor,
    state: State,
    k: int,
    steps: int,
    needs_full_pass: Callable[[State], bool],
) -> list[State]:
    """Up to `k` draft states after `state`: the sampler's steps run on `logits` (stale after the first)
    as if every later pass predicted what this one did. The chain stops at the step cap, after a state
    that finishes the span (it needs no pass of its own), and before a state whose next pass could not
    be a cached one (the tail window outgrown: the step-by-step sampler runs a full pass there)."""
    chain: list[State] = []
    cur = state
    while len(chain) < k and cur.step < steps and not cur.finished:
        nxt, _ = advance(logits, cur)
        if not nxt.finished and needs_full_pass(nxt):
            break
        chain.append(nxt)
        cur = nxt
    return chain


def walk(
    advance: Advance, state: State, logits: list[torch.Tensor], chain: list[State]
) -> tuple[list[tuple[State, Committed]], torch.Tensor]:
    """Verify `chain` (the draft states after `state`) with `logits`: the real logits of `state` and of
    the chain states that still take a step (unfinished, under the step cap), in order. Returns the
    real steps taken, [(state, what it committed)], at least one, and the logits the last of them was
    made from (the next chain's draft source). The steps end at the first draft state the sampler does
    not reproduce, with that step's real outcome."""
    taken: list[tuple[State, Committed]] = []
    cur, cur_logits = state, logits[0]
    for i in range(len(chain) + 1):
        nxt, done = advance(cur_logits, cur)
        taken.append((nxt, done))
        if nxt.finished or i == len(chain) or i + 1 >= len(logits) or not nxt.same(chain[i]):
            return taken, cur_logits
        cur, cur_logits = nxt, logits[i + 1]
    raise AssertionError("unreachable: the loop returns at its last turn")
