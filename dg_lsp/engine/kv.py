"""Full-length KV snapshots that survive sliding-window layers.

transformers' `DynamicSlidingWindowLayer` forgets everything older than its window, so a cache cannot
be cropped back to an arbitrary common prefix once it has grown past it. We record full history
(`activate_past_recording`) while a prompt is encoded, keep plain per-layer tensors, and rebuild a
cache from them for each request: exact reuse for any prefix length, whatever the layer types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVSnapshot:
    """Per-layer keys/values (batch 1, all positions) for the token ids `ids`."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def new_cache(config, record: bool = True):
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    if record:
        for layer in cache.layers:
            if getattr(layer, "is_sliding", False):
                layer.activate_past_recording()
    return cache


def restore(config, snap: KVSnapshot | None, keep: int, batch: int = 1, record: bool = True):
    """A cache holding the first `keep` positions of `snap`; sliding layers trim to their window when
    `record` is False (what a read-only consumer such as DiffusionGemma's decoder expects)."""
    cache = new_cache(config, record=record)
    if snap is not None and keep > 0:
        for i, layer in enumerate(cache.layers):
            k = snap.keys[i][:, :, :keep]
            v = snap.values[i][:, :, :keep]
            layer.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
    return cache


def snapshot(cache, ids: list[int]) -> KVSnapshot:
    """Full keys/values of a recording cache, cut to `len(ids)` positions."""
    n = len(ids)
    return KVSnapshot(
        ids=list(ids),
        keys=[layer.keys[:, :, :n] for layer in cache.layers],
        values=[layer.values[:, :, :n] for layer in cache.layers],
    )


def context_outside(cache, lo: int, hi: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys and values of every position but lo..hi-1: the dual cache's context for passes
    that recompute only those positions."""
    return [
        (
            torch.cat([la.keys[:, :, :lo], la.keys[:, :, hi:]], 2),
            torch.cat([la.values[:, :, :lo], la.values[:, :, hi:]], 2),
        )
        for la in cache.layers
    ]


def context_joined(cache, context: list, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per layer, `context` followed by the first `rows` rows a canvas-only pass computed against it, read
    from that pass's `cache` (which holds the context, then the pass's rows): views, nothing is copied.
    None when a layer does not hold exactly that (a sliding-window layer dropped some), so the caller
    keeps its context as it was."""
    n = context[0][0].shape[2] if context else 0
    out = []
    for layer, (k, _) in zip(cache.layers, context, strict=True):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if getattr(layer, "is_sliding", False) or keys is None or values is None:
            return None
        if keys.shape[2] < n + rows or keys.shape[:2] != k.shape[:2]:
            return None
        out.append((keys[:, :, : n + rows], values[:, :, : n + rows]))
    return out


def cache_kwarg(forward) -> str | None:
    """The name under which `forward` takes a KV cache: transformers renamed `past_key_values` to
    `cache` in 5.24 (keeping a deprecated alias); None when the model takes no cache at all."""
    import inspect

    params = inspect.signature(forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None
