"""Resolve settings to one resident engine: the single place that decides which model runs where."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from dg_lsp.engine.types import InfillEngine
from dg_lsp.files import FileRefused, check_regular_file, read_regular_file
from dg_lsp.settings import Settings

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
EMBEDDED_SMOLLM2_DIR = MODELS_DIR / "embedded_smollm2"
"""`model = embedded`: SmolLM2-135M adapted into a block diffusion infill model. Through the editor
pipeline it passes 14% of HumanEval-infilling's single-line tasks where the 5M model passes 3%, at
several times the 5M model's time per request on a CPU (benchmarks/results/embedded_smollm2/)."""
EMBEDDED_DIR = EMBEDDED_SMOLLM2_DIR
EMBEDDED_TINY_DIR = MODELS_DIR / "embedded_tiny"
"""`model = embedded-tiny`: the 4.97M-parameter model that was `embedded` before SmolLM2: fast tests, and
machines too slow for the larger one."""
BACKENDS = ("diffusion-gemma", "masked", "ar", "remote")
# Masked diffusion LMs that are not `*ForMaskedLM`: LLaDA, Dream, DiffuCoder, DreamOn...
MASKED_ARCH_HINTS = ("llada", "dream", "diffucoder", "mdlm", "masked")


CONFIG_CAP = 8 * 1024 * 1024
"""config.json: real ones are a few KB."""
TEXT_CAP = 64 * 1024 * 1024
"""Tokenizer, vocabulary and code files: Gemma's tokenizer.json is 33 MB."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")
TEXT_SUFFIXES = (".json", ".model", ".txt", ".tiktoken", ".py", ".vocab", ".jinja", ".spm")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is shown to the user as is."""


def error_text(exc: BaseException) -> str:
    """A message for the user that is never empty (a bare MemoryError or KeyError has no text)."""
    text = str(exc).strip()
    if isinstance(exc, ModelLoadError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_model_files(model_dir: Path) -> None:
    """Refuse a directory holding anything transformers could block on or read without end.

    Every entry must be a regular file or a directory (a FIFO would block `open` for ever, a device
    such as /dev/zero never ends), and text files have a size cap, checked before anything reads them.
    Weights are exempt from caps: they are memory-mapped, and their size is the model's.
    """
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError as exc:
        raise ModelLoadError(f"cannot list model directory {model_dir}: {exc.strerror or exc}") from None
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.is_dir():
                continue
            cap = CONFIG_CAP if entry.name == "config.json" else TEXT_CAP
            check_regular_file(path, None if entry.name.endswith(WEIGHT_SUFFIXES) else cap)
        except FileRefused as exc:
            raise ModelLoadError(f"refusing model file: {exc}") from None
        except OSError as exc:  # a dangling symlink, no permission
            raise ModelLoadError(f"cannot read model file {path}: {exc.strerror or exc}") from None


def read_config(model_dir: Path) -> dict:
    """config.json as a dict, read within its cap; any problem is a `ModelLoadError` with text."""
    path = model_dir / "config.json"
    try:
        data = json.loads(read_regular_file(path, CONFIG_CAP))
    except FileRefused as exc:
        raise ModelLoadError(f"refusing model file: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return device


def resolve_model_dir(model: str) -> Path:
    if model in ("embedded", "embedded-smollm2"):  # the second: the name it had while opt-in
        if (EMBEDDED_DIR / "config.json").exists():
            return EMBEDDED_DIR
        log.warning("embedded model missing from %s; using embedded-tiny", EMBEDDED_DIR)
        model = "embedded-tiny"
    if model == "embedded-tiny":
        if (EMBEDDED_TINY_DIR / "config.json").exists():
            return EMBEDDED_TINY_DIR
        from dg_lsp.models.tiny import make_tiny_diffusion_gemma

        cache = Path.home() / ".cache" / "dg-lsp" / "tiny-diffusion-gemma"
        if not (cache / "config.json").exists():
            log.warning("embedded checkpoints missing; building a tiny random model in %s", cache)
            make_tiny_diffusion_gemma(cache)
        return cache
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model directory not found: {path}")
    if not os.path.lexists(path / "config.json"):
        raise ModelLoadError(f"not a model directory (no config.json): {path}")
    return path


def detect_backend(config: dict, model_dir: Path | None = None) -> str:
    """Backend from a checkpoint's config.json: its `architectures` (then `model_type`) decide; the
    tokenizer's mask token too, for a masked model behind a plain decoder config (Open-dCoder)."""
    layout = config.get("dg_lsp_layout")
    if layout in ("block", "spm", "prefix"):  # dg-lsp's packed models (see dg_lsp/engine/layouts.py)
        return "masked" if layout == "block" else "ar"
    archs = [str(a) for a in config.get("architectures") or []]
    model_type = str(config.get("model_type", "")).lower()
    names = [a.lower() for a in archs] + [model_type]
    if any("diffusiongemma" in n or n == "diffusion_gemma" for n in names):
        return "diffusion-gemma"
    from dg_lsp.models.native import family_from_config, tokenizer_config

    tok_config = tokenizer_config(model_dir) if model_dir is not None else None
    if family_from_config(config, tok_config):  # Dream family, LLaDA: native (dg_lsp/models/native.py)
        return "masked"
    if any(n.endswith("formaskedlm") for n in names) or any(h in n for n in names for h in MASKED_ARCH_HINTS):
        return "masked"
    if config.get("use_bidirectional_attention") is True and config.get("mask_token_id") is not None:
        return "masked"  # a decoder class run bidirectionally with a mask token: a masked-diffusion LM
    if any(n.endswith("forcausallm") for n in names):
        return "ar"
    raise ModelLoadError(
        f"cannot tell which backend runs architectures={archs} model_type={model_type!r}; "
        f"set `backend` to one of {BACKENDS}"
    )


def masked_options(settings: Settings) -> dict:
    """Only the checked `masked` setting reaches the sampler: given a mapping without a `masked` key,
    `MaskedSamplerConfig.from_options` reads the mapping itself, and unknown top-level keys (kept in
    `extra` unchecked) would pass as sampler options (`{"buckets": [10**9]}`)."""
    masked = settings.extra.get("masked")
    return {"masked": masked if isinstance(masked, dict) else {}}


def load_engine(settings: Settings) -> InfillEngine:
    """Load the model named by `settings`; raise `ModelLoadError` with a user-readable reason."""
    if settings.model.startswith("remote:") or settings.backend == "remote":
        from dg_lsp.engine.remote import RemoteEngine

        return RemoteEngine(settings.model.removeprefix("remote:"))
    model_dir = resolve_model_dir(settings.model)  # refused directories never pay for importing torch
    check_model_files(model_dir)
    config = read_config(model_dir)
    import torch

    torch.set_num_threads(settings.threads)  # process-wide; the worker thread is its only torch user
    device = resolve_device(settings.device)
    backend = settings.backend
    from dg_lsp.engine import quantization as quant

    try:
        quant.resolve_dtype(settings.dtype, device)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    try:
        if backend == "auto":
            backend = detect_backend(config, model_dir)
        if backend not in BACKENDS:
            raise ModelLoadError(f"unknown backend {backend!r}; expected auto or one of {BACKENDS}")
        opts = masked_options(settings)
        if backend == "diffusion-gemma":
            from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine

            return DiffusionGemmaEngine(
                model_dir,
                device=device,
                steps=settings.denoising_steps,
                quantization=settings.quantization,
                dtype=quant.resolve_dtype(settings.dtype, device, model_dir),
            )
        if backend == "ar":
            from dg_lsp.engine.ar import AutoregressiveEngine

            return AutoregressiveEngine(
                model_dir,
                device=device,
                quantization=settings.quantization,
                trust_remote_code=settings.trust_remote_code,
                dtype=settings.dtype,
            )
        if backend == "masked":
            from dg_lsp.engine.masked import (
                MaskedDiffusionEngine,
                MaskedSamplerConfig,
                model_sampler_defaults,
            )

            return MaskedDiffusionEngine(
                model_dir,
                device=device,
                quantization=settings.quantization,
                trust_remote_code=settings.trust_remote_code,
                sampler=MaskedSamplerConfig.from_options(
                    opts, steps=settings.denoising_steps, model_defaults=model_sampler_defaults(config)
                ),
                dtype=settings.dtype,
            )
        raise ModelLoadError(f"backend {backend!r} needs model = 'remote:http://host:port'")
    except ModelLoadError:
        raise
    except Exception as exc:  # corrupt weights, wrong architecture, OOM: all reach the user the same way
        raise ModelLoadError(f"could not load model from {model_dir}: {error_text(exc)}") from exc
