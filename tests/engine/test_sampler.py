from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dg_lsp.engine import sampler
from dg_lsp.engine.types import Candidate


@given(st.integers(0, 300), st.integers(1, 64))
def test_transfer_schedule_is_exact_and_balanced(n, steps):
    sched = sampler.transfer_schedule(n, steps)
    assert sum(sched) == n
    if n:
        assert len(sched) == min(n, steps)
        assert max(sched) - min(sched) <= 1
        assert min(sched) >= 1
        assert sched == sorted(sched, reverse=True)


@given(st.integers(0, 300), st.integers(1, 64))
def test_quota_finishes_in_time(n, steps):
    left, used = n, 0
    while left:
        k = sampler.quota(left, steps - used)
        assert k >= 1
        left -= min(k, left)
        used += 1
    assert used <= max(steps, 0) or n == 0


def test_confidence_kinds_order_positions_sensibly():
    sharp = torch.tensor([10.0, 0.0, 0.0, 0.0])
    flat = torch.tensor([1.0, 0.9, 0.8, 0.7])
    logits = torch.stack([sharp, flat])
    for kind in sampler.CONFIDENCE_KINDS:
        c = sampler.confidence(logits, kind)
        assert c[0] > c[1], kind
    p = torch.softmax(sharp, -1)
    assert math.isclose(float(sampler.confidence(sharp[None], "max_prob")[0]), float(p.max()), rel_tol=1e-5)
    with pytest.raises(ValueError):
        sampler.confidence(logits, "nope")


def test_select_commits_threshold_minimum_and_masked_only():
    conf = torch.tensor([[0.95, 0.2, 0.91, 0.99, 0.1]])
    masked = torch.tensor([[True, True, True, False, True]])
    chosen = sampler.select_commits(conf, masked, minimum=1, threshold=0.9)
    assert chosen.tolist() == [[True, False, True, False, False]]  # 0.99 is not masked
    chosen = sampler.select_commits(conf, masked, minimum=3, threshold=0.99)
    assert chosen.sum() == 3 and not chosen[0, 3]
    low = sampler.select_commits(conf, masked, minimum=1, threshold=0.999)
    assert low.tolist() == [[True, False, False, False, False]]  # at least one, the most confident masked
    none_left = sampler.select_commits(conf, torch.zeros_like(masked), minimum=2, threshold=0.0)
    assert not none_left.any()


def test_entropy_bound_always_accepts_lowest_and_respects_bound():
    h = torch.tensor([[0.5, 0.01, 0.02, 2.0]])
    acc = sampler.entropy_bound_accept(h, bound=0.1)
    assert acc.tolist() == [[True, True, True, False]]  # 0.01 + 0.02 <= 0.1, adding 0.5 would not be
    acc = sampler.entropy_bound_accept(torch.tensor([[3.0, 5.0]]), bound=0.1)
    assert acc.tolist() == [[True, False]]


def test_trim_bucket_cap_and_rank():
    assert sampler.trim_at_stop([5, 6, 1, 7], {1, 0}) == [5, 6]
    assert [sampler.bucket(n) for n in (1, 8, 9, 100, 500)] == [8, 8, 16, 128, 128]
    assert sampler.cap_steps(12, 0, 10.0, 55) == 5
    assert sampler.cap_steps(12, 100, 10.0, 55) == 1
    assert sampler.cap_steps(12, 0, 10.0, None) == 12
    cands = [Candidate("a(", -0.1), Candidate("b", -0.5), Candidate("a(", -0.1), Candidate("c", -0.2)]
    ranked = sampler.rank_candidates(cands, syntax_ok=lambda t: "(" not in t)
    assert [c.text for c in ranked] == ["c", "b", "a("]
    assert [c.text for c in sampler.rank_candidates(cands)] == ["a(", "c", "b"]


def test_mean_logprob_matches_manual():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([1, 4, 6])
    manual = sum(float(torch.log_softmax(logits[i], -1)[ids[i]]) for i in range(3)) / 3
    assert math.isclose(sampler.mean_logprob(logits, ids), manual, rel_tol=1e-5)


def test_stable_and_confident():
    a = torch.tensor([[1, 2, 3], [4, 5, 6]])
    b = torch.tensor([[1, 2, 3], [4, 5, 7]])
    sure = torch.full((2, 3), 0.001)
    unsure = torch.full((2, 3), 1.0)
    assert sampler.stable_and_confident([], a, sure, 1, 0.01).tolist() == [False, False]
    assert sampler.stable_and_confident([b], a, sure, 1, 0.01).tolist() == [True, False]
    assert sampler.stable_and_confident([a, b], a, sure, 2, 0.01).tolist() == [True, False]
    assert sampler.stable_and_confident([b, a], a, sure, 1, 0.01).tolist() == [True, True]
    assert sampler.stable_and_confident([b, a], a, unsure, 1, 0.01).tolist() == [False, False]
    assert sampler.stable_and_confident([], a, sure, 0, 0.01).tolist() == [True, True]


def test_frontier_block_window_and_blocks_left():
    masked = torch.tensor([[False, True, True, False, True, True, True, True], [False] * 8])
    assert sampler.frontier(masked).tolist() == [[False, True] + [False] * 6, [False] * 8]
    assert sampler.block_window(masked, 4).tolist()[0] == [True] * 4 + [False] * 4
    late = torch.tensor([[False, False, False, True, True]])  # first mask in the second block
    assert sampler.block_window(late, 3).tolist() == [[False, False, False, True, True]]
    assert sampler.blocks_left(masked, 4) == 2 and sampler.blocks_left(masked, 3) == 3
    assert sampler.blocks_left(masked[1:], 4) == 0


def test_masked_sampler_options_accept_camel_case():
    from dg_lsp.engine.masked import MaskedSamplerConfig

    cfg = MaskedSamplerConfig.from_options({"masked": {"blockLength": 8, "stopAtFrontier": False, "x": 1}})
    assert cfg.block_length == 8 and cfg.stop_at_frontier is False


def test_leftmost_confidence_ranks_by_position_only():
    logits = torch.randn(2, 5, 11)
    conf = sampler.confidence(logits, "leftmost")
    masked = torch.tensor([[False, True, True, True, True], [True, True, False, True, True]])
    chosen = sampler.select_commits(conf, masked, 2)
    assert chosen.tolist() == [[False, True, True, False, False], [True, True, False, False, False]]


def test_a_canvas_stopped_where_a_stop_token_follows_what_is_kept():
    eos, mask = 0, 99
    assert sampler.stopped_at([5, 6, eos, eos], kept=2, stop_ids={eos})
    assert not sampler.stopped_at([5, 6, mask, mask], kept=2, stop_ids={eos})  # decoding was cut short
    assert not sampler.stopped_at([5, 6, 7], kept=3, stop_ids={eos})  # ran to the canvas's end
    assert not sampler.stopped_at([5, 6, 7, eos], kept=2, stop_ids={eos})  # cut at max_tokens, not stopped


def test_masked_candidates_say_whether_their_model_stopped(tiny_masked_dir):
    """The tiny model as it is never writes a stop token; with its stop token's logit raised it stops after
    the one token it must write."""
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest, ended_by_model

    runs = MaskedDiffusionEngine(tiny_masked_dir), MaskedDiffusionEngine(tiny_masked_dir)
    with torch.no_grad():
        runs[1].model.get_output_embeddings().bias[min(runs[1].stop_ids)] += 50.0
    for stops, engine in enumerate(runs):
        for seed, max_tokens in itertools.product(range(2), (4, 16)):
            prompt = "def add(a, b):\n    return "
            request = InfillRequest(prompt, "\n", max_tokens=max_tokens, seed=seed, steps=4)
            for c in engine.infill(request).candidates:
                assert c.stopped == bool(stops) and ended_by_model(c, max_tokens) == c.stopped
                # no deadline, so every mask was committed: only a stop token ends a canvas early
                assert len(c.token_ids) < max_tokens if c.stopped else len(c.token_ids) == max_tokens
