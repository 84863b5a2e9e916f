"""One denoising step of a masked canvas: from a pass's logits to the tokens it commits.

The single-request loop (`MaskedDiffusionEngine._generate`) and the batched one
(`batching.BatchedMasked`) both call this, so a request decodes the same whether it is served alone or in
a team batch. Which positions a pass recomputed (tail window, block: `passes.py` plans them) the caller
says through `window_end` and `region`; everything that decides commits lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dg_lsp.engine import commit as commit_rules
from dg_lsp.engine import sampler


@dataclass(frozen=True)
class StepPlan:
    """Where this step stands in its schedule (the block's, when decoding block by block)."""

    step_in: int
    steps_of: int
    steps_left: int


@dataclass(frozen=True)
class Committed:
    pred: torch.Tensor
    """(rows, L) this step's prediction at every position (0 past a trimmed window)."""
    commit: torch.Tensor
    """(rows, L) bool: the positions decided now."""
    logp_gain: torch.Tensor
    """(rows,) summed log-probability of the committed tokens."""
    eligible: torch.Tensor | None = None
    """(rows, L) bool: the positions this step's rules could choose from (masked, inside the window and
    block, a stop only at the frontier)."""


@dataclass(frozen=True)
class StepTrace:
    """One step as the sampler saw it, for observers (`MaskedDiffusionEngine.step_observer`)."""

    step: int
    logits: torch.Tensor
    """(rows, >= window, V) float: the pass's canvas logits with the step's bars applied."""
    masked: torch.Tensor
    """(rows, L) bool: the positions still masked before this step."""
    done: Committed
    """What the step predicted, committed, and could have committed."""


def denoise_step(
    cfg,
    rules,
    logits: torch.Tensor,
    canvas: torch.Tensor,
    masked: torch.Tensor,
    stops: set[int],
    stop_tensor: torch.Tensor,
    fill_id: int,
    plan: StepPlan,
    gen: torch.Generator | None = None,
    blank_start: torch.Tensor | None = None,
    window_end: int | None = None,
    region: torch.Tensor | None = None,
    healed: torch.Tensor | None = None,
    around: Sequence[commit_rules.Surroundings] | None = None,
    pending: torch.Tensor | None = None,
) -> Committed:
    """Commit this step's tokens into `canvas` and clear them from `masked` (both in place), then fill
    the positions after a committed stop. `logits` (rows, >= window, V) float, edited in place; rows
    after the first draw alternatives (Gumbel-max at `cfg.temperature`). `window_end`: the pass
    recomputed only the first `window_end` positions (tail trimming), so nothing past it may be
    committed and the vocabulary-wide work (softmax, top-2, argmax) is done for those positions alone;
    `logits` may then hold just them. `region`: (rows, L) bool, the current block when decoding block
    by block. `healed`: the healed fragment's own ids (`LocalEngine.fragment_ids`); once one of them is
    committed at position 0, the span must still add `min_tokens` tokens after it. `around`: per row, the
    prompt's tokens, for commit rules that copy from them. `pending`: per row, masks past a window that
    ends short of the span (`window_ahead`) and that the span still needs; the quota counts them, so a
    narrow window does not slow the schedule down."""
    rows, length = masked.shape
    w = length if window_end is None else min(window_end, length)
    lg = logits[:, :w]
    if cfg.min_tokens > 0:  # given a non-empty span; finite, so entropy stays a number
        lg[:, : cfg.min_tokens, stop_tensor[stop_tensor >= 0]] = -1e9
        if healed is not None and w > cfg.min_tokens:
            retyped = ~masked[:, 0] & torch.isin(canvas[:, 0], healed)
            if retyped.any():
                lg[retyped, cfg.min_tokens] = lg[retyped, cfg.min_tokens].index_fill(
                    -1, stop_tensor[stop_tensor >= 0], -1e9
                )
    if blank_start is not None and w > 0:
        lg[:, 0, blank_start] = -1e9
    logp = torch.log_softmax(lg, dim=-1)
    scores = logp
    if rows > 1:  # rows after the first draw alternatives (Gumbel-max sampling)
        # drawn for the whole canvas whatever the window, so a seed draws the same alternatives
        shape = (rows, length, logp.shape[-1])
        u = torch.rand(shape, generator=gen, device=logp.device)[:, :w].clamp_(1e-9, 1 - 1e-9)
        scores = logp.clone()
        scores[1:] = scores[1:] / cfg.temperature + (-torch.log(-torch.log(u)))[1:]
    pred = torch.zeros(rows, length, dtype=torch.long, device=masked.device)
    pred[:, :w] = scores.argmax(dim=-1)
    conf = sampler.confidence(lg, cfg.confidence, logp=logp)
    active = masked
    if cfg.stop_at_frontier:
        active = masked & (sampler.frontier(masked) | ~torch.isin(pred, stop_tensor))
    if w < length:  # a trimmed pass: no logits past the window
        active = active & (torch.arange(length, device=masked.device) < w)
    pool = masked if cfg.stops_in_quota else active
    if region is not None:
        active, pool = active & region, pool & region
    n_pool = int((pool.sum(dim=-1) + (0 if pending is None else pending)).max())
    if cfg.schedule == "dream":
        need = sampler.dream_quota(n_pool, plan.step_in, plan.steps_of)
    elif cfg.schedule == "one":
        need = 1
    else:
        need = sampler.quota(n_pool, plan.steps_left)
    # Dream's schedule may commit nothing at an early step, as its reference does; every position a
    # rule or the quota may pick lies inside the window
    eligible = active[:, :w]
    allowed = torch.zeros_like(masked)
    allowed[:, :w] = eligible  # a copy: `masked` (which `active` may be) is updated in place below
    at_quota = sampler.select_commits(conf, eligible, need, None, at_least_one=cfg.schedule != "dream")
    beliefs = commit_rules.view(lg, eligible, logp, pred[:, :w], canvas, masked, around)
    chosen = commit_rules.select(beliefs, rules, at_quota)
    commit = torch.zeros_like(masked)
    commit[:, :w] = chosen
    canvas[commit] = pred[commit]
    picked = logp.gather(-1, pred[:, :w, None]).squeeze(-1)
    masked &= ~commit
    fill_after_stop(canvas, masked, stops, fill_id)
    return Committed(pred, commit, (picked * chosen).sum(dim=-1), allowed)


def fill_after_stop(canvas: torch.Tensor, masked: torch.Tensor, stop_ids: set[int], fill_id: int) -> None:
    """Variable length: masks after a committed stop token are EOS tail; fill them in place."""
    if not stop_ids:
        return
    stops = torch.isin(canvas, torch.tensor(sorted(stop_ids), device=canvas.device)) & ~masked
    tail = (stops.cumsum(dim=-1) > 0) & masked
    canvas[tail] = fill_id
    masked &= ~tail
