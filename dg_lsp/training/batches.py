"""Turn FIM triples into model inputs: encoder prompt + EOS-padded canvas, or one causal PSM sequence."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace

import torch

from dg_lsp.models import tokens
from dg_lsp.training.spans import Fim

IGNORE = -100


@dataclass
class Example:
    prefix_ids: list[int]
    suffix_ids: list[int]
    middle_ids: list[int]

    @property
    def prompt(self) -> list[int]:
        return tokens.fim_prompt_ids(self.prefix_ids, self.suffix_ids)


def tokenize_fim(tokenizer, fim: Fim, budget: int, suffix_budget: int, max_middle: int) -> Example:
    """Tokenize like the engine: suffix keeps its head, prefix its tail; long middles spill over."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    middle = enc(fim.middle)
    suffix_text = fim.suffix
    if len(middle) > max_middle:
        suffix_text = tokenizer.decode(middle[max_middle:]) + suffix_text
        middle = middle[:max_middle]
    suffix = enc(suffix_text[: suffix_budget * 8])[:suffix_budget]
    prefix = enc(fim.prefix[-(budget * 8) :])
    keep = budget - len(suffix)
    prefix = prefix[len(prefix) - keep :] if keep > 0 else []
    return Example(prefix, suffix, middle)


def draw_budget(rng: random.Random, choices: list[int], max_suffix_fraction: float) -> tuple[int, int]:
    budget = rng.choice(choices)
    r = rng.random()
    suffix = 0 if r < 0.1 else int(budget * max_suffix_fraction) if r < 0.7 else rng.randint(0, budget // 4)
    return budget, suffix


@dataclass
class DiffusionBatch:
    input_ids: torch.Tensor  # (B, L) right-padded prompts
    attention_mask: torch.Tensor  # (B, L)
    ar_labels: torch.Tensor  # (B, L) next-token targets over the prompt, IGNORE on pads
    canvas: torch.Tensor  # (B, C) clean canvas: middle then EOS
    decoder_position_ids: torch.Tensor  # (B, C) positions right after each prompt


def to_device(batch, device: str | torch.device):
    """Move every tensor field of a batch dataclass to `device`."""
    return replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in fields(batch)})


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def diffusion_batch(examples: list[Example], canvas_length: int) -> DiffusionBatch:
    prompts = [e.prompt for e in examples]
    ids = _pad(prompts, tokens.PAD_ID)
    mask = _pad([[1] * len(p) for p in prompts], 0)
    labels = _pad([[*p[1:], IGNORE] for p in prompts], IGNORE)
    canvas = torch.tensor(
        [e.middle_ids + [tokens.EOS_ID] * (canvas_length - len(e.middle_ids)) for e in examples],
        dtype=torch.long,
    )
    lengths = torch.tensor([len(p) for p in prompts])
    positions = lengths[:, None] + torch.arange(canvas_length)[None, :]
    return DiffusionBatch(ids, mask, labels, canvas, positions)


@dataclass
class CausalBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor  # HF convention: same as input_ids (shifted inside the model), IGNORE on pads
    middle_mask: torch.Tensor  # True where the label is a middle/EOS token (for held-out middle loss)


def causal_batch(examples: list[Example]) -> CausalBatch:
    seqs = [e.prompt + e.middle_ids + [tokens.EOS_ID] for e in examples]
    ids = _pad(seqs, tokens.PAD_ID)
    mask = _pad([[1] * len(s) for s in seqs], 0)
    labels = _pad(seqs, IGNORE)
    middle = _pad([[0] * len(e.prompt) + [1] * (len(e.middle_ids) + 1) for e in examples], 0).bool()
    return CausalBatch(ids, mask, labels, middle)


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor  # (B, L) clean `[bos] prefix middle+EOS… suffix`, right-padded
    attention_mask: torch.Tensor  # (B, L)
    canvas_mask: torch.Tensor  # (B, L) True on the canvas (middle + EOS tail)
    context_mask: torch.Tensor  # (B, L) True on prefix/suffix tokens (not bos, not padding)


def masked_batch(examples: list[Example], lengths: list[int]) -> MaskedBatch:
    """In-place canvases as the masked backend lays them out: the middle, EOS up to the drawn length
    (the engine's bucket), then the suffix right after, so the model learns where a span ends."""
    seqs, canvas, context = [], [], []
    for e, n in zip(examples, lengths, strict=True):
        middle = e.middle_ids[: n - 1]
        fill = middle + [tokens.EOS_ID] * (n - len(middle))
        seqs.append([tokens.BOS_ID, *e.prefix_ids, *fill, *e.suffix_ids])
        canvas.append([0] * (1 + len(e.prefix_ids)) + [1] * n + [0] * len(e.suffix_ids))
        context.append([0] + [1] * len(e.prefix_ids) + [0] * n + [1] * len(e.suffix_ids))
    return MaskedBatch(
        _pad(seqs, tokens.PAD_ID),
        _pad([[1] * len(s) for s in seqs], 0),
        _pad(canvas, 0).bool(),
        _pad(context, 0).bool(),
    )


def draw_canvas_length(middle_len: int, buckets: list[int], r: float) -> int:
    """A bucket that holds the middle plus one EOS, uniformly among those that do (`r` in [0, 1)): the
    engine sizes its canvas from the span kind, not from the unknown middle, so it is often too long."""
    fits = [b for b in sorted(buckets) if b > middle_len] or [max(buckets)]
    return fits[min(len(fits) - 1, int(r * len(fits)))]
