"""The commit-oracle benchmark's analysis, on hand-built traces and on the 5M model's real decodes."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import commit_oracle as co  # noqa: E402

A, B, C, X, Y, E = 11, 12, 13, 98, 99, 0


def _step(masked, guess, p1, commit, eligible=None) -> co.Step:
    return co.Step(masked, guess, p1, commit, eligible if eligible is not None else list(masked))


def _trace() -> co.Trace:
    """Four positions decoded left to right, one per pass."""
    f, t = False, True
    return co.Trace(
        [
            _step([t, t, t, t], [A, B, X, Y], [0.9, 0.6, 0.7, 0.2], [t, f, f, f]),
            _step([f, t, t, t], [A, B, C, Y], [1.0, 0.9, 0.8, 0.2], [f, t, f, f]),
            _step([f, f, t, t], [A, B, C, E], [1.0, 1.0, 0.9, 0.95], [f, f, t, f]),
            _step([f, f, f, t], [A, B, C, E], [1.0, 1.0, 1.0, 0.99], [f, f, f, t]),
        ],
        tokens=3,
    )


def test_the_oracle_commits_the_frontier_and_the_final_run_after_it():
    trace = _trace()
    assert co.final_tokens(trace) == {0: A, 1: B, 2: C, 3: E}
    # pass 1 (step 0): a, and b already final at +1 (x at +2 is not): the state of step 2 comes next;
    # pass 2 (step 2): c, and e at +1: done in two passes instead of four
    assert co.oracle_passes(trace) == 2
    ready = co.readiness([trace])
    assert ready["1"] == [3, 3] and ready["2"] == [0, 2] and ready["3"] == [0, 1]


def test_the_run_rule_replay_counts_passes_and_changed_completions():
    trace = _trace()
    # >= 0.9: nothing after the frontier at step 0 (b 0.6), step 1: c at 0.8 no; step 2: e at 0.95
    assert co.replay(trace, co.run_rule(trace, 0.9)) == (3, False)
    # >= 0.5: step 0 takes b (0.6) and x (0.7, not final: the completion changes), then stops at y
    assert co.replay(trace, co.run_rule(trace, 0.5)) == (2, True)
    # a position the rules may not choose (a stop away from the frontier) ends the run
    f, t = False, True
    trace.steps[2] = _step([f, f, t, t], [A, B, C, E], [1.0, 1.0, 0.9, 0.95], [f, f, t, f], [f, f, t, f])
    assert co.replay(trace, co.run_rule(trace, 0.9)) == (4, False)


def test_a_trimmed_window_ends_a_run_of_final_guesses():
    """A pass that did not recompute a position says nothing about it: the run stops at the window."""
    f, t = False, True
    trace = co.Trace(
        [
            _step([t, t, t], [A, X], [0.9, 0.9], [t, f, f]),  # window of two, x wrong
            _step([f, t, t], [A, B], [1.0, 0.9], [f, t, f]),  # window of two: position 2 not seen
            _step([f, f, t], [A, B, C], [1.0, 1.0, 0.9], [f, f, t]),
        ],
        tokens=3,
    )
    assert co.oracle_passes(trace) == 3
    assert co.readiness([trace])["1"] == [0, 1]  # x at +1 in step 0; step 1's +1 lay outside its window


@pytest.mark.timeout(300)
def test_real_decodes_of_the_5m_model_bound_their_own_passes(tmp_path):
    """Cursors drawn from a training corpus (here: dg-lsp's own sources) and decoded by the shipped 5M
    model: the oracle never needs more passes than decoding took, and readiness is a share."""
    docs = [
        {"text": p.read_text(), "package": "dg-lsp", "path": str(p), "lang": "python"}
        for p in sorted((ROOT / "dg_lsp/context").glob("*.py"))[:4]
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    args = argparse.Namespace(
        cursors=24, workers=1, seed=3, corpus=tmp_path, max_tokens=16, steps=8, prompt_tokens=128
    )
    traces, confidence = co.run_model(str(ROOT / "dg_lsp/models/embedded_tiny"), args)
    assert len(traces) == 24 and confidence == "max_prob"  # its shipped sampler
    for trace in traces:
        assert 1 <= co.oracle_passes(trace) <= len(trace.steps)
    summary = co.summarise(traces, left_to_right=True)
    assert summary["oracle_passes"] <= summary["passes"]
    assert math.isnan(co.summarise(traces, left_to_right=False)["oracle_passes"])  # n/a: not exact
    learned = summary["learned"]  # fitted on 12 cursors, replayed on the other 12
    assert learned["held-out cursors"] == 12 and len(learned["weights"]) == len(co.FEATURES) + 1
    for c in co.CUTS:  # a replayed pass moves on by a step at least; a higher cut commits no more
        assert learned[f"learned >= {c}"][0] <= learned["as decoded"][0]
    assert learned["learned >= 0.97"][0] >= learned["learned >= 0.8"][0]
    for trace in traces:  # every replayed pass moves the recorded decode on by one step at least
        assert co.replay(trace, co.run_rule(trace, 0.9))[0] <= len(trace.steps)
    for share, n in summary["readiness"].values():
        assert n == 0 or 0.0 <= share <= 1.0
