"""Loss functions. The diffusion forward mirrors `generate`: the encoder fills a DynamicCache from the
prompt at positions 0..L-1, the decoder denoises the canvas at positions L..L+C-1 reading that cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dg_lsp.models import tokens
from dg_lsp.training.batches import IGNORE, CausalBatch, DiffusionBatch, MaskedBatch


@dataclass
class Losses:
    total: torch.Tensor
    canvas: float
    ar: float


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.lm_head(hidden).float()
    cap = model.final_logit_softcapping
    return torch.tanh(logits / cap) * cap if cap else logits


def corrupt(
    canvas: torch.Tensor, t: torch.Tensor, vocab_size: int, gen: torch.Generator | None
) -> torch.Tensor:
    """Uniform-noise forward process: each token is replaced by a uniformly random one with probability t."""
    flip = (torch.rand(canvas.shape, generator=gen) < t.cpu()[:, None]).to(canvas.device)
    noise = torch.randint(0, vocab_size, canvas.shape, generator=gen).to(canvas.device)
    return torch.where(flip, noise, canvas)


def encode(model, batch: DiffusionBatch):
    positions = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)
    positions = positions[None, :].expand_as(batch.input_ids)
    return model.model.encoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask.bool(), position_ids=positions
    )


def denoise(model, batch: DiffusionBatch, cache, noisy: torch.Tensor, sc_logits=None, sc_mask=None):
    dec_mask = F.pad(batch.attention_mask.bool(), (0, noisy.shape[1]), value=True)
    out = model.model.decoder(
        decoder_input_ids=noisy,
        past_key_values=cache,
        self_conditioning_logits=sc_logits,
        self_conditioning_mask=sc_mask,
        decoder_attention_mask=dec_mask,
        decoder_position_ids=batch.decoder_position_ids,
    )
    return _logits(model, out.last_hidden_state)


def diffusion_loss(
    model,
    batch: DiffusionBatch,
    gen: torch.Generator | None,
    t_min: float = 1e-3,
    self_cond_prob: float = 0.5,
    ar_weight: float = 0.5,
    t: torch.Tensor | None = None,
) -> Losses:
    vocab = model.config.text_config.vocab_size
    bsz = batch.canvas.shape[0]
    if t is None:
        t = t_min + (1 - t_min) * torch.rand(bsz, generator=gen)
    noisy = corrupt(batch.canvas, t, vocab, gen)
    enc = encode(model, batch)
    cache = enc.past_key_values
    sc_logits = sc_mask = None
    if self_cond_prob > 0:
        sc_mask = (torch.rand(bsz, generator=gen) < self_cond_prob).to(noisy.device)
        if sc_mask.any():
            with torch.no_grad():
                first = denoise(model, batch, cache, noisy)
            # generate feeds temperature-scaled logits (t_min..t_max = 0.4..0.8) back in; match that range
            temp = (0.4 + 0.4 * torch.rand(bsz, 1, 1, generator=gen)).to(first.device)
            sc_logits = (first / temp).detach()
    logits = denoise(model, batch, cache, noisy, sc_logits, sc_mask)
    canvas_loss = F.cross_entropy(logits.reshape(-1, vocab), batch.canvas.reshape(-1))
    total = canvas_loss
    ar = torch.zeros(())
    if ar_weight > 0:
        enc_logits = _logits(model, enc.last_hidden_state)
        ar = F.cross_entropy(enc_logits.reshape(-1, vocab), batch.ar_labels.reshape(-1), ignore_index=IGNORE)
        total = total + ar_weight * ar
    return Losses(total, canvas_loss.item(), ar.item())


def causal_loss(model, batch: CausalBatch) -> Losses:
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels)
    return Losses(out.loss, float("nan"), out.loss.item())


@torch.no_grad()
def causal_middle_loss(model, batch: CausalBatch) -> float:
    """Mean CE on the middle + EOS tokens only: the part an infill request is scored on."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    labels = batch.labels.masked_fill(~batch.middle_mask, IGNORE)
    return float(
        F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
        )
    )


def masked_loss(
    model,
    batch: MaskedBatch,
    gen: torch.Generator | None,
    t_min: float = 1e-3,
    context_mask_prob: float = 0.5,
    t: torch.Tensor | None = None,
    shift: bool = False,
) -> Losses:
    """Absorbing-state diffusion: each canvas token becomes `<mask>` with probability t ~ U(t_min, 1); for
    `context_mask_prob` of the rows the prefix/suffix are masked at the same rate (whole-sequence masked
    diffusion, many more loss positions per pass). Mean CE over masked positions, i.e. the ELBO's 1/t
    weighting normalised per row. `canvas` reports the canvas part, `ar` the context part. `shift`: the
    token at i is predicted by the logits at i-1 (Dream-style; position 0 is BOS, never masked)."""
    ids = batch.input_ids
    bsz = ids.shape[0]
    if t is None:
        t = t_min + (1 - t_min) * torch.rand(bsz, generator=gen)
    noise = torch.rand(ids.shape, generator=gen) < t[:, None].cpu()
    whole = torch.rand(bsz, generator=gen) < context_mask_prob
    region = batch.canvas_mask.cpu() | (batch.context_mask.cpu() & whole[:, None])
    hide = (noise & region).to(ids.device)
    hide |= batch.canvas_mask & ~hide.any(dim=1, keepdim=True)  # at least one masked position per row
    noisy = torch.where(hide, torch.full_like(ids, tokens.MASK_ID), ids)
    logits = model(input_ids=noisy, attention_mask=batch.attention_mask).logits.float()
    canvas_mask, context_mask = batch.canvas_mask, batch.context_mask
    if shift:
        logits, ids, hide = logits[:, :-1], ids[:, 1:], hide[:, 1:]
        canvas_mask, context_mask = canvas_mask[:, 1:], context_mask[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="none")
    ce = ce.view_as(ids) * hide
    total = (ce.sum(dim=1) / hide.sum(dim=1).clamp(min=1)).mean()
    ce = ce.detach()
    on_canvas = hide & canvas_mask
    on_context = hide & context_mask
    canvas = float(ce[on_canvas].sum() / on_canvas.sum().clamp(min=1))
    context = float(ce[on_context].sum() / on_context.sum()) if on_context.any() else float("nan")
    return Losses(total, canvas, context)
