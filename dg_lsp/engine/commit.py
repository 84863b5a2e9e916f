"""Parallel commit rules for masked diffusion: which still-masked positions to decide at this step.

Each rule is a small pure function of one step's beliefs (`StepView`) returning the positions it would
commit; the sampler commits the union of the configured rules and the schedule's quota (the minimum that
still finishes the canvas in the remaining steps). Rules from the literature:

- `threshold`: every position whose top-1 probability is at least `threshold` (Fast-dLLM, threshold rule);
- `factor`: the n most confident positions, for the largest n with (n + 1)(1 - c_n) < f, c_n the n-th
  highest top-1 probability (Fast-dLLM's factor rule: the more tokens at once, the surer each must be);
- `entropy`: the lowest-entropy positions while sum(H) - max(H) <= bound (EB-sampler; DiffusionGemma's
  own sampler bounds entropy the same way): the accepted tokens' joint error stays bounded;
- `prophet`: once every eligible position's top-1 leads its top-2 by at least `gap` in probability,
  commit them all (Prophet, "diffusion LMs know the answer before decoding": early commit);
- `run`: the masks right after the frontier (the leftmost mask), in order, while each guess is at least
  `threshold` sure: a left-to-right sampler commits the frontier anyway, and a guess one or two places
  past it is final far more often than one further right at the same confidence, which is where a plain
  threshold loses (measured: `benchmarks/commit_oracle.py`);
- `copy`: the run of guesses from the frontier on in which every token completes an n-gram that occurs
  in the prompt (prompt-lookup decoding, with the model's own guesses as the draft): code re-types the
  names and phrases around the cursor, and where the model's guess for a still-masked position and the
  text around the cursor agree on a continuation, the guess is committed without waiting for its turn.

Rules only choose among `eligible` positions (the sampler decides those: masked, inside the block, stops
only at the frontier), so stop handling and block decoding stay in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass(frozen=True)
class Surroundings:
    """The prompt's tokens, for rules that copy from the text around the cursor."""

    source: tuple[int, ...]
    """Every prompt token that is text (special tokens left out), both sides of the cursor."""
    lead: tuple[int, ...]
    """The text tokens right before the canvas, in reading order (what the canvas continues)."""

    def ngrams(self, n: int) -> frozenset[tuple[int, ...]]:
        return _ngrams(self.source, n)


_NGRAM_CACHE: dict[tuple[int, tuple[int, ...]], frozenset[tuple[int, ...]]] = {}


def _ngrams(source: tuple[int, ...], n: int) -> frozenset[tuple[int, ...]]:
    """One request's n-grams, built once for all its steps and batch rows: a small cache (emptied past 16
    prompts) keyed by the prompt itself, so no request can read another's."""
    key = (n, source)
    hit = _NGRAM_CACHE.get(key)
    if hit is None:
        hit = frozenset(source[i : i + n] for i in range(len(source) - n + 1))
        if len(_NGRAM_CACHE) > 16:
            _NGRAM_CACHE.clear()
        _NGRAM_CACHE[key] = hit
    return hit


@dataclass(frozen=True)
class StepView:
    probs_top2: torch.Tensor  # (B, L, 2) the two largest probabilities per position
    known_entropy: torch.Tensor | None  # (B, L) token entropy (nats), or None: computed from `logp` if read
    eligible: torch.Tensor  # (B, L) bool: positions a rule may commit now
    logp: torch.Tensor | None = None  # (B, L, V) log-probabilities
    pred: torch.Tensor | None = None  # (B, L) this step's guess per position
    canvas: torch.Tensor | None = None  # (B, L) the canvas before this step's commits
    masked: torch.Tensor | None = None  # (B, L) bool: still masked before this step
    around: Sequence[Surroundings] | None = field(default=None, compare=False)
    """Per row: the prompt's tokens (`copy` reads them); None where the engine does not say."""

    @property
    def top1(self) -> torch.Tensor:
        return self.probs_top2[..., 0]

    @cached_property
    def entropy(self) -> torch.Tensor:
        """Lazily: a full-vocabulary pass per step that only the entropy rule reads."""
        if self.known_entropy is not None:
            return self.known_entropy
        assert self.logp is not None
        return -(self.logp.exp() * self.logp).sum(dim=-1)


Rule = Callable[[StepView], torch.Tensor]


def threshold_rule(threshold: float) -> Rule:
    def rule(v: StepView) -> torch.Tensor:
        return v.eligible & (v.top1 >= threshold)

    return rule


def factor_rule(factor: float) -> Rule:
    def rule(v: StepView) -> torch.Tensor:
        conf = v.top1.masked_fill(~v.eligible, -1.0)
        sorted_c, order = conf.sort(dim=-1, descending=True)
        n = torch.arange(1, conf.shape[-1] + 1, device=conf.device)[None, :]
        ok = ((n + 1) * (1 - sorted_c) < factor) & (sorted_c >= 0)
        # the largest n whose condition holds: accept the n most confident (a prefix of the sorted order)
        count = torch.where(ok, n, 0).amax(dim=-1, keepdim=True)
        take = n <= count
        return torch.zeros_like(v.eligible).scatter(-1, order, take) & v.eligible

    return rule


def entropy_rule(bound: float) -> Rule:
    def rule(v: StepView) -> torch.Tensor:
        h = v.entropy.masked_fill(~v.eligible, float("inf"))
        sorted_h, order = h.sort(dim=-1)
        finite = torch.isfinite(sorted_h)
        csum = torch.where(finite, sorted_h, 0.0).cumsum(dim=-1)
        keep = finite & (csum - torch.where(finite, sorted_h, 0.0) <= bound)
        return torch.zeros_like(v.eligible).scatter(-1, order, keep) & v.eligible

    return rule


def prophet_rule(gap: float) -> Rule:
    def rule(v: StepView) -> torch.Tensor:
        lead = v.probs_top2[..., 0] - v.probs_top2[..., 1]
        sure = (lead >= gap) | ~v.eligible
        return v.eligible & sure.all(dim=-1, keepdim=True)

    return rule


def run_rule(threshold: float) -> Rule:
    def rule(v: StepView) -> torch.Tensor:
        if v.masked is None:
            return torch.zeros_like(v.eligible)
        w = v.eligible.shape[-1]
        masked = v.masked[:, :w]
        pos = torch.arange(w, device=masked.device)[None, :]
        front = torch.where(masked, pos, w).amin(dim=-1, keepdim=True)
        after = pos > front
        sure = v.eligible & (v.top1 >= threshold)
        # committed positions carry the run on; the first mask that is not sure (or not allowed) ends it
        breaks = after & masked & ~sure
        end = torch.where(breaks, pos, w).amin(dim=-1, keepdim=True)
        return after & (pos < end) & masked & sure

    return rule


def copy_rule(n: float) -> Rule:
    n = max(1, int(n))

    def rule(v: StepView) -> torch.Tensor:
        out = torch.zeros_like(v.eligible)
        if v.around is None or v.pred is None or v.canvas is None or v.masked is None:
            return out
        w = v.eligible.shape[-1]
        for r, around in enumerate(v.around):
            grams = around.ngrams(n)
            seq = list(around.lead[-(n - 1) :]) if n > 1 else []
            masked, eligible = v.masked[r, :w].tolist(), v.eligible[r].tolist()
            canvas, pred = v.canvas[r, :w].tolist(), v.pred[r, :w].tolist()
            for j in range(w):
                if masked[j]:
                    tok = pred[j]
                    if not eligible[j] or (*seq[len(seq) - n + 1 :], tok) not in grams:
                        break  # the run ends at the first guess the prompt does not continue
                    out[r, j] = True
                else:
                    tok = canvas[j]
                seq.append(tok)
        return out

    return rule


RULES = {
    "threshold": threshold_rule,
    "factor": factor_rule,
    "entropy": entropy_rule,
    "prophet": prophet_rule,
    "copy": copy_rule,
    "run": run_rule,
}
DEFAULT_PARAMS = {"threshold": 0.9, "factor": 1.0, "entropy": 0.5, "prophet": 0.5, "copy": 3.0, "run": 0.7}


def parse_rules(specs: Sequence[str] | str | None) -> list[tuple[str, float]]:
    """`["factor", "threshold:0.8"]` or `"factor:1.5,prophet"` -> [(name, parameter)]; raises ValueError
    naming the bad entry."""
    if specs is None:
        return []
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    out = []
    for spec in specs:
        name, _, raw = str(spec).strip().partition(":")
        if name not in RULES:
            raise ValueError(f"unknown commit rule {name!r}; expected one of {sorted(RULES)}")
        value = float(raw) if raw else DEFAULT_PARAMS[name]
        if not (value == value and abs(value) != float("inf")) or value < 0:
            raise ValueError(f"commit rule {name}: parameter must be a finite number >= 0, got {raw!r}")
        out.append((name, value))
    return out


def build(rules: Sequence[tuple[str, float]]) -> list[Rule]:
    return [RULES[name](value) for name, value in rules]


def view(
    logits: torch.Tensor,
    eligible: torch.Tensor,
    logp: torch.Tensor | None = None,
    pred: torch.Tensor | None = None,
    canvas: torch.Tensor | None = None,
    masked: torch.Tensor | None = None,
    around: Sequence[Surroundings] | None = None,
) -> StepView:
    """`logp`: the step's log-softmax when the sampler already has it (saves a pass over the vocabulary)."""
    if logp is None:
        logp = torch.log_softmax(logits.float(), dim=-1)
    return StepView(logp.topk(2, dim=-1).values.exp(), None, eligible, logp, pred, canvas, masked, around)


def select(v: StepView, rules: Sequence[Rule], quota_mask: torch.Tensor) -> torch.Tensor:
    """The union of the quota's positions and every rule's."""
    chosen = quota_mask & v.eligible
    for rule in rules:
        chosen = chosen | rule(v)
    return chosen
