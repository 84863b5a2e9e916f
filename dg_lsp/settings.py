"""User-facing settings, shared by the server, the CLI and the engine.

One flat dataclass so that `initializationOptions`, `workspace/didChangeConfiguration`, CLI flags and
editor configuration all map onto the same names. Defaults must work with no settings at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Settings whose change requires the resident model to be reloaded.
RELOAD_KEYS = frozenset({"model", "backend", "device", "quantization", "trust_remote_code"})


@dataclass(frozen=True)
class Settings:
    model: str = "embedded"
    """`embedded` (ships with dg-lsp), a local model directory, or `remote:http://host:port`."""
    backend: str = "auto"
    """`auto` (read from the model's config), `diffusion-gemma`, `masked`, `ar` or `remote`."""
    device: str = "auto"
    """`auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`."""
    quantization: str = "auto"
    """`auto`, `none`, `int8` (CPU dynamic), `8bit` or `nf4` (bitsandbytes on CUDA)."""
    max_tokens: int = 48
    """Upper bound on generated tokens per completion; span kinds may choose fewer."""
    denoising_steps: int = 12
    """Upper bound on denoising passes per canvas; early exit may use fewer."""
    latency_budget_ms: int = 1500
    """Soft deadline per request; the engine caps steps to stay within it."""
    debounce_ms: int = 60
    """Wait this long after the last keystroke before running the model for inline completion."""
    num_candidates: int = 1
    enabled_languages: tuple[str, ...] = ("*",)
    """Language ids to serve; `*` means every language."""
    trust_remote_code: bool = False
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, base: Settings | None = None) -> Settings:
        """Merge a (possibly camelCase, possibly nested under `dgLsp`) mapping onto `base`.

        Unknown keys are kept in `extra` rather than rejected, so newer editor configs do not break
        older servers; values of the wrong type raise `ValueError` naming the key.
        """
        base = base or cls()
        if not data:
            return base
        if isinstance(data.get("dgLsp"), dict):
            data = data["dgLsp"]
        elif isinstance(data.get("dg-lsp"), dict):
            data = data["dg-lsp"]
        known = {f.name: f for f in dataclasses.fields(cls)}
        updates: dict[str, Any] = {}
        extra = dict(base.extra)
        for raw_key, value in data.items():
            key = _snake(raw_key)
            if key not in known or key == "extra":
                extra[raw_key] = value
                continue
            updates[key] = _coerce(key, getattr(base, key), value)
        return dataclasses.replace(base, **updates, extra=extra)

    def language_enabled(self, language_id: str) -> bool:
        return "*" in self.enabled_languages or language_id in self.enabled_languages

    def needs_reload(self, other: Settings) -> bool:
        return any(getattr(self, k) != getattr(other, k) for k in RELOAD_KEYS)


def _snake(name: str) -> str:
    out = []
    for ch in name.replace("-", "_"):
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).lstrip("_")


def _coerce(key: str, current: Any, value: Any) -> Any:
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        raise ValueError(f"setting {key!r} must be a boolean, got {value!r}")
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"setting {key!r} must be a non-negative number, got {value!r}")
        return int(value)
    if isinstance(current, tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"setting {key!r} must be a list of strings, got {value!r}")
        return tuple(value)
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ValueError(f"setting {key!r} must be a string, got {value!r}")
        return value
    return value
