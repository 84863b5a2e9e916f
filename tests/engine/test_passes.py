"""The pass plans on hand-built canvases: which positions the next pass recomputes, and when it must be a
full one. The engines' parity tests (test_masked, test_batching) check them end to end."""

from __future__ import annotations

import torch

from dg_lsp.engine.passes import BlockSchedule, FrozenFront, GrowingCanvas, TailWindow, first_masked
from dg_lsp.engine.step import StepPlan

STOP = 0
STOPS = torch.tensor([STOP])


def test_a_window_ends_a_margin_past_the_span_the_model_wants():
    canvas = torch.tensor([[5, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])  # 1 = still masked
    masked = torch.tensor([[False, False] + [True] * 10])
    pred = torch.tensor([[5, 6, 7, 8, STOP, STOP, STOP, STOP, STOP, STOP, STOP, STOP]])
    tail = TailWindow(margin=2)
    assert tail.window() is None
    assert tail.after_full_pass(canvas, masked, pred, STOPS) == 6  # 4 live positions + 2
    assert tail.window() == (0, 6)
    assert not tail.outgrew(masked)


def test_no_window_when_it_would_save_less_than_its_margin():
    canvas = torch.ones(1, 8, dtype=torch.long)
    masked = torch.ones(1, 8, dtype=torch.bool)
    pred = torch.tensor([[5, 6, 7, 8, 9, 10, STOP, STOP]])
    tail = TailWindow(margin=3)
    assert tail.after_full_pass(canvas, masked, pred, STOPS) is None and tail.window() is None


def test_a_span_that_uses_its_window_up_drops_it():
    tail = TailWindow(margin=1, end=3)
    masked = torch.tensor([[False, False, False, True, True]])  # masks left, none inside the window
    assert tail.outgrew(masked) and tail.end is None and tail.window() is None
    assert not tail.outgrew(masked)  # nothing left to drop
    done = TailWindow(margin=1, end=3)
    assert not done.outgrew(torch.zeros(1, 5, dtype=torch.bool)) and done.end == 3  # finished, not outgrown


def test_a_window_may_also_end_a_few_positions_past_the_frontier():
    canvas = torch.tensor([[5, 6] + [1] * 10])
    masked = torch.tensor([[False, False] + [True] * 10])
    pred = torch.tensor([[5, 6] + [7] * 10])  # the model means to write the whole canvas: no tail to trim
    assert TailWindow(margin=2).after_full_pass(canvas, masked, pred, STOPS) is None
    tail = TailWindow(margin=2, ahead=3)
    assert tail.after_full_pass(canvas, masked, pred, STOPS) == 5 and tail.window() == (0, 5)
    masked[:, 2:5] = False  # the frontier reached the window's end: a full pass draws the next one
    assert tail.outgrew(masked) and tail.window() is None
    tail = TailWindow(margin=2, ahead=3)
    masked[:, 2:5] = True
    tail.after_full_pass(canvas, masked, pred, STOPS)
    # the 7 live masks past the window still count in the step's quota
    assert tail.reach == 12 and tail.pending(masked).tolist() == [7]
    pred[0, 6:] = STOP  # a tail nearer than the frontier's reach keeps its own end
    assert TailWindow(margin=2, ahead=9).after_full_pass(canvas, masked, pred, STOPS) == 8


def _masks(*rows: str) -> torch.Tensor:
    return torch.tensor([[c == "m" for c in row] for row in rows])


def test_the_front_freezes_rows_computed_from_committed_inputs_and_behind_the_frontier():
    front = FrozenFront(shift=1)  # row r predicts position r; its input is position r - 1 (row 0: before)
    # a full pass over a fully masked canvas, which commits positions 0 and 1: only row 0 had a final input
    assert front.after_pass(_masks("mmmmmm"), _masks("..mmmm"), (0, 7)) == 1
    # the next pass computed rows 1..6 from positions 0 and 1 committed; it commits position 2: rows 1 and
    # 2 read committed inputs and predict committed positions; row 3 read the mask at 2
    assert front.after_pass(_masks("..mmmm"), _masks("...mmm"), (1, 7)) == 3
    # a pass that commits nothing at the frontier moves nothing, whatever it commits further on
    assert front.after_pass(_masks("...mmm"), _masks("...m.m"), (3, 7)) == 3
    # rows that predict a masked position stay, even when their input is final
    assert front.after_pass(_masks("...m.m"), _masks("....mm"), (3, 7)) == 4
    # only rows the pass computed can join: a window that stopped at row 5
    assert FrozenFront(shift=1, rows=2).after_pass(_masks("......"), _masks("......"), (2, 5)) == 5
    # a pass that did not start at the front (a gap) adds nothing
    assert FrozenFront(shift=1, rows=1).after_pass(_masks("..mmmm"), _masks("...mmm"), (2, 7)) == 1


def test_unshifted_rows_freeze_with_their_own_position():
    front = FrozenFront(shift=0)  # row r reads and predicts position r
    assert front.after_pass(_masks("mmmm"), _masks("..mm"), (0, 4)) == 0  # computed from masks
    assert front.after_pass(_masks("..mm"), _masks("...m"), (0, 4)) == 2
    assert front.after_pass(_masks("...m"), _masks("...."), (2, 4)) == 3
    rows = torch.zeros(2, 3, dtype=torch.bool)
    rows[1, 1] = True  # the frontier is the leftmost mask over every candidate row
    assert first_masked(rows) == 1 and first_masked(torch.zeros(2, 3, dtype=torch.bool)) == 3


def test_blocks_get_their_steps_up_front_and_move_left_to_right():
    blocks = BlockSchedule.make(steps=5, length=8, block=4)
    assert blocks.allot == [3, 2] and blocks.steps == 5
    masked = torch.ones(2, 8, dtype=torch.bool)
    assert not blocks.moved(0, masked) and blocks.window(masked) == (0, 4)
    plan, region = blocks.plan(masked)
    assert plan == StepPlan(0, 3, 3)
    assert region.tolist() == [[True] * 4 + [False] * 4] * 2
    masked[:, :4] = False
    masked[1, 2] = True  # one row still has a mask in the first block: the schedule follows it
    assert not blocks.moved(1, masked) and blocks.plan(masked)[0] == StepPlan(1, 3, 2)
    masked[1, 2] = False
    assert blocks.moved(2, masked) and blocks.window(masked) == (4, 8)
    assert blocks.plan(masked)[0] == StepPlan(0, 2, 2)
    assert not blocks.moved(3, masked)


def test_at_least_one_step_per_block():
    blocks = BlockSchedule.make(steps=1, length=10, block=4)
    assert blocks.allot == [1, 1, 1] and blocks.steps == 3
    done = torch.zeros(1, 10, dtype=torch.bool)
    assert blocks.current(done) == 2 and blocks.window(done) == (8, 10)


def test_a_canvas_grows_only_when_a_row_filled_it_without_stopping():
    grow = GrowingCanvas.make(8, 32)
    assert grow is not None and GrowingCanvas.make(0, 32) is None and GrowingCanvas.make(32, 32) is None
    stops = torch.tensor([0])
    done = torch.zeros(2, 8, dtype=torch.bool)
    full = torch.tensor([[5] * 8, [6, 0, 0, 0, 0, 0, 0, 0]])
    assert grow.needed(full, done, stops)  # row 0 wrote 8 tokens and never stopped
    assert not grow.needed(full[1:], done[1:], stops)  # row 1 stopped: its span is complete
    still = done.clone()
    still[0, 7] = True
    assert not grow.needed(full, still, stops)  # a mask left: not decoded yet
    assert not grow.needed(torch.full((1, 32), 5), torch.zeros(1, 32, dtype=torch.bool), stops)  # full size
    # the appended masks get the share of the steps the whole canvas would have given them
    assert grow.extra_steps(12, 8, 0.0, None, None) == 9
    assert GrowingCanvas(16, 32).extra_steps(12, 16, 0.0, None, None) == 6
    assert GrowingCanvas(16, 32).extra_steps(1, 16, 0.0, None, None) == 1
    # and no more than the latency budget has room for, yet at least one
    assert grow.extra_steps(12, 8, 900.0, 100.0, 1500.0) == 6
    assert grow.extra_steps(12, 8, 1600.0, 100.0, 1500.0) == 1
    # a row that stopped gets its appended positions filled, one that did not gets masks
    canvas, masked = grow.extend(full, done, mask_id=9, stops={STOP}, fill_id=STOP)
    assert canvas.shape == (2, 32) and masked.shape == (2, 32)
    assert masked[0, 8:].all() and (canvas[0, 8:] == 9).all()
    assert not masked[1].any() and (canvas[1, 8:] == STOP).all()
