"""Pure functions over logits: confidence scores, which positions to commit, when to stop.

Kept free of models and caches (llama.cpp's sampler/model split) so that every rule here is tested
on hand-built tensors and shared by the DiffusionGemma and masked backends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

CONFIDENCE_KINDS = ("max_prob", "margin", "entropy", "leftmost")


def confidence(
    logits: torch.Tensor, kind: str = "max_prob", logp: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-position confidence, higher = surer: top-1 probability, top-1 minus top-2, or minus entropy;
    `leftmost` ranks by position alone, so the schedule's quota fills the canvas left to right (the commit
    rules still add confident positions anywhere): a weakly adapted model whose neighbouring masks echo
    each other's guess decodes its quota like the causal model it came from."""
    if kind == "leftmost":
        pos = torch.arange(logits.shape[-2], device=logits.device, dtype=torch.float32)
        return (-pos).expand(logits.shape[:-1])
    if logp is None:  # the sampler passes the step's log-softmax: one pass over the vocabulary, not two
        logp = torch.log_softmax(logits.float(), dim=-1)
    if kind == "max_prob":
        return logp.max(dim=-1).values.exp()
    if kind == "margin":
        top2 = logp.topk(2, dim=-1).values.exp()
        return top2[..., 0] - top2[..., 1]
    if kind == "entropy":
        return (logp.exp() * logp).sum(dim=-1)  # = -entropy
    raise ValueError(f"unknown confidence kind {kind!r}; expected one of {CONFIDENCE_KINDS}")


def entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def transfer_schedule(num_masked: int, steps: int) -> list[int]:
    """How many positions to commit at each step so that exactly `num_masked` are committed in `steps`.

    The remainder goes to the earliest steps (every entry is floor or ceil of the mean, never zero while
    something is left), so the schedule is exact in integers rather than rounded per step.
    """
    if num_masked <= 0:
        return []
    steps = max(1, min(steps, num_masked))
    base, extra = divmod(num_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def quota(num_masked: int, steps_left: int) -> int:
    """Minimum commits this step so the remaining masks fit in the remaining steps."""
    if num_masked <= 0:
        return 0
    return math.ceil(num_masked / max(1, steps_left))


def block_allotment(steps: int, n_blocks: int) -> list[int]:
    """Steps per semi-autoregressive block, as LLaDA allots them: an even share each (remainder to the
    earliest blocks), fixed up front, so the last block is never starved by the earlier ones."""
    base, extra = divmod(max(steps, n_blocks), n_blocks)
    return [base + (1 if i < extra else 0) for i in range(n_blocks)]


def dream_quota(num_masked: int, step: int, steps: int, eps: float = 1e-3) -> int:
    """Dream's `diffusion_generate` schedule: on timesteps linspace(1, eps, steps + 1), step i (t -> s)
    commits int(n * (1 - s / t)) of the n masks left, and the last step all of them."""
    if step >= steps - 1:
        return num_masked
    t = 1 - (1 - eps) * step / steps
    s = 1 - (1 - eps) * (step + 1) / steps
    return int(num_masked * (1 - s / t))


def apply_edits(
    canvas: Sequence[int],
    masked: Sequence[bool],
    mask_id: int,
    expand_id: int,
    delete_id: int,
    max_len: int,
    stop_ids: Sequence[int] | set[int] = (),
) -> tuple[list[int], list[bool]]:
    """DreamOn's variable-length canvas after one step's commits: each committed `expand_id` becomes two
    masks (while the canvas stays within `max_len`; past it, one), each committed `delete_id` is removed,
    and every mask after the first committed delete or stop is removed too (the span ends there, as
    DreamOn pads deletes to the right). Committed tokens after it stay, as in DreamOn's own decoding.

    A fixed canvas costs infill quality whenever its length is wrong (by the DreamOn authors' account 38%
    of Dream-Coder's pass@1); growing and shrinking it lets the model pick the length."""
    ends = {delete_id, *stop_ids}
    cut = next((i for i, (t, m) in enumerate(zip(canvas, masked, strict=True)) if not m and t in ends), None)
    kept: list[tuple[int, bool]] = []
    for i, (t, m) in enumerate(zip(canvas, masked, strict=True)):
        if m and cut is not None and i > cut:
            continue
        if not m and t == delete_id:
            continue
        kept.append((int(t), bool(m)))
    room = max(0, max_len - len(kept))
    out: list[int] = []
    out_masked: list[bool] = []
    for t, m in kept:
        if not m and t == expand_id:
            n = 2 if room > 0 else 1
            room -= n - 1
            out += [mask_id] * n
            out_masked += [True] * n
        else:
            out.append(t)
            out_masked.append(m)
    return out, out_masked


def select_commits(
    conf: torch.Tensor,
    masked: torch.Tensor,
    minimum: int,
    threshold: float | None = None,
    at_least_one: bool = True,
) -> torch.Tensor:
    """Positions to unmask this step, per row: every masked position above `threshold`, at least `minimum`
    (the most confident ones), never a position that is already committed.

    conf, masked: (batch, length). Returns a bool mask of the same shape.
    """
    conf = conf.float().masked_fill(~masked, float("-inf"))
    chosen = torch.zeros_like(masked)
    if threshold is not None:
        chosen = masked & (conf >= threshold)
    n_masked = masked.sum(dim=-1)
    floor = max(minimum, 1) if at_least_one else max(minimum, 0)
    need = torch.clamp(torch.minimum(torch.full_like(n_masked, floor), n_masked), min=0)
    k_max = int(need.max().item()) if need.numel() else 0
    if k_max > 0:
        idx = conf.topk(k_max, dim=-1).indices
        rank_ok = torch.arange(k_max, device=conf.device)[None, :] < need[:, None]
        top = torch.zeros_like(masked).scatter(-1, idx, rank_ok)
        chosen = chosen | (top & masked)
    return chosen


def block_window(masked: torch.Tensor, block: int) -> torch.Tensor:
    """Semi-autoregressive decoding: per row, the `block`-wide slice holding the first masked position.

    Decoding the canvas block by block (LLaDA, Fast-dLLM) keeps commits near what is already decided,
    left to right, instead of scattered over a long canvas. (batch, length) bool."""
    length = masked.shape[-1]
    pos = torch.arange(length, device=masked.device)[None, :]
    first = torch.where(masked, pos, length).min(dim=-1, keepdim=True).values
    start = (first // block) * block
    return (pos >= start) & (pos < start + block)


def frontier(masked: torch.Tensor) -> torch.Tensor:
    """Per row, the leftmost still-masked position (all False in a row with none). (batch, length) bool."""
    before = masked.long().cumsum(dim=-1)
    return masked & (before == 1)


def live_end(canvas: torch.Tensor, masked: torch.Tensor, pred: torch.Tensor, stops: torch.Tensor) -> int:
    """One past the last canvas position, over the rows, that the span still uses: a committed token that
    is not a stop, or a mask whose prediction is not a stop. Everything after it is the span's EOS tail as
    the model now sees it. 0 when nothing is."""
    committed = ~masked & ~torch.isin(canvas, stops)
    wanted = masked & ~torch.isin(pred, stops)
    live = committed | wanted
    pos = torch.arange(1, live.shape[-1] + 1, device=live.device)
    return int(torch.where(live, pos, 0).max())


def tail_window(
    canvas: torch.Tensor, masked: torch.Tensor, pred: torch.Tensor, stops: torch.Tensor, margin: int
) -> int | None:
    """How many leading canvas positions later passes need to recompute: `margin` past `live_end`, or
    None when that saves less than `margin` positions (recompute the whole canvas)."""
    length = masked.shape[-1]
    end = live_end(canvas, masked, pred, stops) + margin
    return end if end <= length - margin else None


def outgrown(masked: torch.Tensor, end: int) -> bool:
    """A row still has masks but none among its first `end` positions: the span has used its window up
    without stopping, and the masks past it need a pass that sees them."""
    return bool((masked.any(dim=-1) & ~masked[:, :end].any(dim=-1)).any())


def blocks_left(masked: torch.Tensor, block: int) -> int:
    """Blocks that still hold a masked position, in the row that has most."""
    length = masked.shape[-1]
    n = -(-length // block)
    pad = torch.nn.functional.pad(masked, (0, n * block - length))
    return int(pad.view(masked.shape[0], n, block).any(dim=-1).sum(dim=-1).max())


def entropy_bound_accept(token_entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """DiffusionGemma's rule: accept the k lowest-entropy positions while sum(H) - max(H) <= bound.

    The left side bounds the mutual information among the accepted tokens, so they can be decided
    together (arXiv 2505.24857). The lowest-entropy position is always accepted.
    """
    sorted_h, order = torch.sort(token_entropy, dim=-1)
    keep_sorted = (torch.cumsum(sorted_h, dim=-1) - sorted_h) <= bound
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def stable_and_confident(
    history: Sequence[torch.Tensor],
    argmax: torch.Tensor,
    token_entropy: torch.Tensor,
    stability: int,
    bound: float,
) -> torch.Tensor:
    """DiffusionGemma's early exit, per row: the argmax canvas equals each of the last `stability` ones
    (history excludes the current one) and the mean token entropy is below `bound`.
    """
    rows = argmax.shape[0]
    if stability == 0:
        stable = torch.ones(rows, dtype=torch.bool, device=argmax.device)
    elif len(history) >= stability:
        stable = torch.stack([(h == argmax).all(dim=-1) for h in history[-stability:]]).all(dim=0)
    else:
        stable = torch.zeros(rows, dtype=torch.bool, device=argmax.device)
    return stable & (token_entropy.mean(dim=-1) < bound)


def linear_temperature(step_remaining: int, total_steps: int, t_min: float, t_max: float) -> float:
    """DiffusionGemma's schedule: t_max at the first step, approaching t_min at the last."""
    return t_min + (t_max - t_min) * (step_remaining / max(1, total_steps))


def trim_at_stop(ids: Sequence[int], stop_ids: Sequence[int] | set[int]) -> list[int]:
    """Cut a generated span at its first EOS/pad: variable-length infill inside a fixed canvas."""
    stops = set(stop_ids)
    out: list[int] = []
    for t in ids:
        if t in stops:
            break
        out.append(int(t))
    return out


def stopped_at(ids: Sequence[int], kept: int, stop_ids: Sequence[int] | set[int]) -> bool:
    """Whether the `kept` first tokens of a canvas end where the model put a stop token, rather than at a
    mask left when decoding was cut short or at the canvas's end (`ended_by_model`)."""
    return kept < len(ids) and int(ids[kept]) in set(stop_ids)


def mean_logprob(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean log-probability of `ids` (length n) under `logits` (n, vocab); the ranking score."""
    if ids.numel() == 0:
        return 0.0
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(logp.gather(-1, ids[:, None]).mean().item())


def bucket(n: int, buckets: Sequence[int] = (8, 16, 32, 64, 128)) -> int:
    """Smallest bucket >= n so canvas shapes stay few (and compiled/cached kernels get reused)."""
    for b in buckets:
        if n <= b:
            return b
    return buckets[-1]


def cap_steps(steps: int, elapsed_ms: float, ms_per_step: float, deadline_ms: float | None) -> int:
    """How many more steps fit in the latency budget (at least one, so a request always produces text)."""
    if deadline_ms is None or ms_per_step <= 0:
        return steps
    fit = int((deadline_ms - elapsed_ms) // ms_per_step)
    return max(1, min(steps, fit))


def rank_candidates(cands: list, syntax_ok=None) -> list:
    """Syntax-passing candidates first, then by mean log-probability; duplicates dropped."""
    seen: set[str] = set()
    unique = []
    for c in cands:
        if c.text in seen:
            continue
        seen.add(c.text)
        unique.append(c)
    if syntax_ok is None:
        return sorted(unique, key=lambda c: -c.mean_logprob)
    return sorted(unique, key=lambda c: (not syntax_ok(c.text), -c.mean_logprob))
