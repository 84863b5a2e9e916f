"""The shared denoising step: a trimmed pass's logits are read for its window alone, and decide exactly
what the whole canvas's logits (zeros past the window, as a trimmed pass once returned) decide."""

from __future__ import annotations

import pytest
import torch

from dg_lsp.engine import commit as commit_rules
from dg_lsp.engine.masked import MaskedSamplerConfig
from dg_lsp.engine.step import StepPlan, denoise_step

STOPS = {0, 1}


def specs(cfg) -> list[tuple[str, float]]:
    """The engine's reading of the sampler options (`MaskedDiffusionEngine.rule_specs`)."""
    if cfg.commit is not None:
        return commit_rules.parse_rules(cfg.commit)
    return [] if cfg.threshold is None else [("threshold", float(cfg.threshold))]


def run(cfg, logits, window_end, rows=2, length=16, seed=3):
    canvas = torch.full((rows, length), 7)
    masked = torch.ones(rows, length, dtype=torch.bool)
    masked[:, :2] = False  # two tokens already written
    canvas[:, :2] = torch.tensor([5, 6])
    gen = torch.Generator().manual_seed(seed)
    done = denoise_step(
        cfg,
        commit_rules.build(specs(cfg)),
        logits.clone(),
        canvas,
        masked,
        STOPS,
        torch.tensor(sorted(STOPS)),
        fill_id=0,
        plan=StepPlan(4, 6, 2),  # late in the schedule: even Dream's quota commits
        gen=gen,
        window_end=window_end,
    )
    return canvas, masked, done


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"confidence": "leftmost"},
        {"schedule": "dream", "threshold": None},
        {"schedule": "one"},
        {"commit": ("factor:2.0", "entropy:1.0", "prophet:0.1")},
        {"stops_in_quota": False, "min_tokens": 1},
    ],
    ids=["default", "leftmost", "dream", "one", "rules", "stops-out"],
)
def test_a_window_is_decided_from_its_own_logits_as_from_zero_padded_ones(options):
    torch.manual_seed(0)
    cfg = MaskedSamplerConfig(**options)
    rows, length, vocab, window = 2, 16, 40, 6
    logits = torch.randn(rows, length, vocab) * 3
    padded = logits.clone()
    padded[:, window:] = 0.0
    c_pad, m_pad, d_pad = run(cfg, padded, window)
    c_cut, m_cut, d_cut = run(cfg, logits[:, :window].contiguous(), window)
    assert torch.equal(c_pad, c_cut) and torch.equal(m_pad, m_cut)
    assert torch.equal(d_pad.commit, d_cut.commit)
    assert torch.allclose(d_pad.logp_gain, d_cut.logp_gain)
    assert d_cut.commit.any() and not d_cut.commit[:, window:].any()  # it committed, inside the window
    # without a window the same logits may commit anywhere past the written tokens
    _, _, whole = run(cfg, logits, None)
    assert not whole.commit[:, :2].any()


@pytest.mark.parametrize("healed", [None, torch.tensor([5])])
def test_a_span_that_only_retyped_the_healed_word_may_not_stop_there(healed):
    """Token healing re-types the user's partial word as the span's first token (`LocalEngine.heal`); a
    stop right after it would be an empty answer, which the `min_tokens` rule exists to prevent."""
    cfg = MaskedSamplerConfig(confidence="leftmost")
    canvas = torch.full((1, 8), 7)
    masked = torch.ones(1, 8, dtype=torch.bool)
    canvas[0, 0], masked[0, 0] = 5, False  # position 0 holds the healed fragment's own token
    logits = torch.zeros(1, 8, 40)
    logits[:, :, 0] = 5.0  # a stop is the likeliest token everywhere
    logits[:, :, 9] = 4.0
    denoise_step(
        cfg, [], logits, canvas, masked, STOPS, torch.tensor(sorted(STOPS)), 0, StepPlan(0, 4, 4),
        healed=healed,
    )  # fmt: skip
    assert int(canvas[0, 1]) == (0 if healed is None else 9)


def test_step_observer_sees_every_pass_and_the_commits_that_make_the_completion():
    """`step_observer` is called once per forward pass with the state before the step and what it
    committed: the committed predictions, read in canvas order up to the stop, are the completion."""
    from dg_lsp.engine.loader import EMBEDDED_TINY_DIR
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest

    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    seen = []
    engine.step_observer = seen.append
    result = engine.infill(
        InfillRequest("def add(a, b):\n    return ", "\n", max_tokens=12, single_line=True)
    )
    assert len(seen) == result.stats.forward_passes >= 2
    assert [t.step for t in seen] == list(range(len(seen)))
    committed: dict[int, int] = {}
    for t in seen:
        assert t.masked.shape == t.done.commit.shape == t.done.pred.shape == t.done.eligible.shape
        assert not (t.done.commit & ~t.masked).any()  # only masked positions are committed
        for j in t.done.commit[0].nonzero().flatten().tolist():
            committed[j] = int(t.done.pred[0, j])
    tokens = [committed[j] for j in sorted(committed)]
    n = len(result.candidates[0].token_ids)
    assert tokens[:n] == result.candidates[0].token_ids
    engine.step_observer = None  # and without one, the same completion
    assert (
        engine.infill(InfillRequest("def add(a, b):\n    return ", "\n", max_tokens=12, single_line=True))
        .candidates[0]
        .text
        == result.candidates[0].text
    )
