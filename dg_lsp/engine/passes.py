"""Which canvas positions a denoising pass recomputes: the block schedule and the tail window.

A pass recomputes either the whole canvas (a full pass: every position's prediction is fresh) or a
window of it against cached keys and values. Two plans narrow it: semi-autoregressive blocks (LLaDA,
Fast-dLLM), and tail trimming (a natural stop uses a fraction of its canvas, so passes after a full one
recompute only up to a little past where the model means the span to end). The single-request loop keeps
one of each per request and the team batch one tail window per row, so a request's passes are planned the
same way wherever it runs. The forward itself and the keys and values it reuses stay with the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dg_lsp.engine import sampler
from dg_lsp.engine.step import StepPlan, fill_after_stop


def first_masked(masked: torch.Tensor) -> int:
    """The first canvas position still masked in any row (the canvas length once none is)."""
    length = masked.shape[-1]
    pos = torch.arange(length, device=masked.device)
    return int(torch.where(masked, pos, length).min()) if length else 0


@dataclass
class TailWindow:
    """Tail trimming for one request (all its candidate rows share the window)."""

    margin: int
    end: int | None = None
    """Canvas positions a canvas pass recomputes; None: all of them (no window drawn, or it was outgrown)."""
    ahead: int = 0
    """When > 0, the window also ends at most this many positions past the frontier (the leftmost mask)
    as the full pass left it: the masks further on stay in the context as it saw them until the frontier
    reaches the window's end, and the next pass is a full one (`window_ahead`)."""
    reach: int = 0
    """Where the span ends as the last full pass saw it (`sampler.live_end`): past a window that `ahead`
    cut short, the masks before it still count in the step's quota (`pending`)."""

    def window(self) -> tuple[int, int] | None:
        return None if self.end is None else (0, self.end)

    def pending(self, masked: torch.Tensor) -> torch.Tensor | None:
        """Per row, the masks past the window that the span still needs (None: the window reaches it)."""
        if self.end is None or self.reach <= self.end:
            return None
        return masked[:, self.end : self.reach].sum(dim=-1)

    def after_full_pass(
        self, canvas: torch.Tensor, masked: torch.Tensor, pred: torch.Tensor, stops: torch.Tensor
    ) -> int | None:
        """Every prediction is fresh after a full pass: the only moment a window can be drawn."""
        self.end = sampler.tail_window(canvas, masked, pred, stops, self.margin)
        self.reach = sampler.live_end(canvas, masked, pred, stops)
        if self.ahead > 0:
            cap = first_masked(masked) + self.ahead
            if cap < (masked.shape[-1] if self.end is None else self.end):
                self.end = cap
        return self.end

    def outgrew(self, masked: torch.Tensor) -> bool:
        """The span used its window up without stopping: the window is dropped and the next pass must be
        a full one, because the masks past it were never recomputed."""
        if self.end is not None and sampler.outgrown(masked, self.end):
            self.end = None
            return True
        return False


@dataclass
class FrozenFront:
    """The front of the canvas whose keys and values are final: they move into the cached context and
    later passes stop recomputing them (`freeze_front`).

    Rows are counted from the canvas's first row: the token before the canvas when logits are shifted
    (its row predicts position 0), else position 0. Row r predicts canvas position r, and its input is
    final once position r - shift is committed. A row can leave the pass when it predicts nothing still
    masked (r < the frontier) and its keys and values were computed from its final input. Decoding runs
    mostly left to right, so a canvas pass otherwise keeps recomputing every committed token in front of
    the frontier, and where a pass costs about the rows it computes (fp32 on AVX2 CPUs: ~12 ms a row for
    the embedded model) those rows are a good share of it. Approximate, like the dual cache itself: a frozen
    token's keys no longer see the positions after it change; the context's order does not matter,
    since a canvas pass attends to all of it without a mask."""

    shift: int
    rows: int = 0

    def after_pass(self, before: torch.Tensor, after: torch.Tensor, computed: tuple[int, int]) -> int:
        """Rows final after a pass that computed rows computed = (lo, hi) from `before`'s canvas (the
        masks as the pass saw them), given the masks `after` its commits; at least the rows already
        frozen. Only rows the pass computed can join, and only in order."""
        lo, hi = computed
        final_inputs = first_masked(before) + self.shift  # rows whose input was committed when computed
        if lo <= self.rows:
            self.rows = max(self.rows, min(final_inputs, first_masked(after), hi))
        return self.rows


@dataclass(frozen=True)
class GrowingCanvas:
    """A canvas that starts at `first` masks and is given the rest of its `full` length only when the span
    fills it without stopping. A span kind's canvas is sized for its longest spans (32 tokens for the rest
    of a line) while most stop within a few: a full pass pays for every mask, and a model trained on
    canvases that just hold their middle reads a long canvas as a long answer (`grow_from`). Only for
    layouts whose canvas comes last and whose prompt does not attend to it (`block`): masks can then be
    appended, and the pass after recomputes the canvas alone, exactly."""

    first: int
    full: int

    @classmethod
    def make(cls, first: int, full: int) -> GrowingCanvas | None:
        return cls(first, full) if 0 < first < full else None

    def needed(self, canvas: torch.Tensor, masked: torch.Tensor, stops: torch.Tensor) -> bool:
        """Every position is decided and some row has not stopped: its span may go on past the canvas."""
        if masked.any() or canvas.shape[1] >= self.full:
            return False
        return not bool(torch.isin(canvas, stops).any(dim=-1).all())

    def extra_steps(
        self, steps: int, length: int, elapsed_ms: float, ms_per_step: float | None, deadline_ms: float | None
    ) -> int:
        """Steps for the appended masks: the share of `steps` the full canvas would have given them, capped
        by what is left of the latency budget."""
        share = max(1, -(-steps * (self.full - length) // self.full))
        return sampler.cap_steps(share, elapsed_ms, ms_per_step or 0.0, deadline_ms)

    def extend(
        self, canvas: torch.Tensor, masked: torch.Tensor, mask_id: int, stops: set[int], fill_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(canvas, masked) given masks up to `full`; rows that already stopped get their new positions
        filled at once."""
        add = self.full - canvas.shape[1]
        canvas = torch.cat([canvas, canvas.new_full((canvas.shape[0], add), mask_id)], dim=1)
        masked = torch.cat([masked, masked.new_ones(masked.shape[0], add)], dim=1)
        fill_after_stop(canvas, masked, stops, fill_id)
        return canvas, masked


@dataclass
class BlockSchedule:
    """The canvas decoded `block` positions at a time, left to right, each block allotted an even share of
    the steps up front (`sampler.block_allotment`), so the last block is never starved."""

    block: int
    length: int
    allot: list[int]
    used: list[int] = field(default_factory=list)
    last: int = 0
    """The block the previous step decoded."""

    @classmethod
    def make(cls, steps: int, length: int, block: int) -> BlockSchedule:
        n = -(-length // block)
        return cls(block, length, sampler.block_allotment(steps, n), [0] * n)

    @property
    def steps(self) -> int:
        """Steps in all: at least one per block."""
        return sum(self.allot)

    def current(self, masked: torch.Tensor) -> int:
        """The block holding the leftmost masked position over all rows (the last block once none is)."""
        return min(first_masked(masked) // self.block, len(self.allot) - 1)

    def moved(self, step: int, masked: torch.Tensor) -> bool:
        """Decoding crossed into a new block since the last step: the cached context saw the old one's
        masks, so the next pass should be a full one."""
        return step > 0 and self.current(masked) != self.last

    def window(self, masked: torch.Tensor) -> tuple[int, int]:
        """The current block's canvas positions, as a pass window."""
        b = self.current(masked)
        return b * self.block, min(self.length, (b + 1) * self.block)

    def plan(self, masked: torch.Tensor) -> tuple[StepPlan, torch.Tensor]:
        """This step's place in its block's allotment, and the (rows, length) region it may commit in."""
        b = self.last = self.current(masked)
        plan = StepPlan(self.used[b], self.allot[b], max(1, self.allot[b] - self.used[b]))
        self.used[b] += 1
        return plan, sampler.block_window(masked, self.block)
