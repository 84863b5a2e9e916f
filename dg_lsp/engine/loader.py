"""Resolve settings to one resident engine: the single place that decides which model runs where."""

from __future__ import annotations

import logging
from pathlib import Path

from dg_lsp.engine.types import InfillEngine
from dg_lsp.settings import Settings

log = logging.getLogger(__name__)

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "models" / "embedded"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is shown to the user as is."""


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return device


def resolve_model_dir(model: str) -> Path:
    if model == "embedded":
        if (EMBEDDED_DIR / "config.json").exists():
            return EMBEDDED_DIR
        from dg_lsp.models.tiny import make_tiny_diffusion_gemma

        cache = Path.home() / ".cache" / "dg-lsp" / "tiny-diffusion-gemma"
        if not (cache / "config.json").exists():
            log.warning("embedded checkpoint missing; building a tiny random model in %s", cache)
            make_tiny_diffusion_gemma(cache)
        return cache
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"not a model directory (no config.json): {path}")
    return path


def load_engine(settings: Settings) -> InfillEngine:
    """Load the model named by `settings`; raise `ModelLoadError` with a user-readable reason."""
    model_dir = resolve_model_dir(settings.model)
    device = resolve_device(settings.device)
    try:
        from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine

        return DiffusionGemmaEngine(model_dir, device=device, steps=settings.denoising_steps)
    except ModelLoadError:
        raise
    except Exception as exc:  # corrupt weights, wrong architecture, OOM: all reach the user the same way
        raise ModelLoadError(f"could not load model from {model_dir}: {type(exc).__name__}: {exc}") from exc
