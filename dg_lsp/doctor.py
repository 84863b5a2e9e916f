"""`dg-lsp doctor`: what dg-lsp found on this machine, and what is wrong with it."""

from __future__ import annotations

import platform
import sys
import time

from dg_lsp import __version__
from dg_lsp.settings import HOW_TO_TRUST, LocalPolicy, Settings, config_path


def _line(ok: bool | None, name: str, detail: str) -> None:
    mark = {True: "ok  ", False: "FAIL", None: "warn"}[ok]
    print(f"[{mark}] {name:<14} {detail}")


def _policy_lines(policy: LocalPolicy) -> int:
    """What the user allowed locally, and what is wrong with the config file (counted as problems)."""
    where = config_path()
    _line(True, "config", f"{where}" if where.exists() else f"{where} (none)")
    for problem in policy.problems:
        _line(False, "config", problem)
    if policy.trust_remote_code:
        _line(None, "remote code", "allowed: a model directory's own Python code may run")
    else:
        _line(True, "remote code", f"off. {HOW_TO_TRUST}")
    engines = ", ".join(sorted(policy.remote_engines)) or "none"
    _line(True, "remote engines", f"allowed: {engines}")
    return len(policy.problems)


def run_doctor(settings: Settings, policy: LocalPolicy | None = None) -> int:
    problems = 0
    _line(True, "dg-lsp", f"{__version__} on Python {platform.python_version()} ({sys.executable})")
    policy = policy if policy is not None else LocalPolicy.load(settings.trust_remote_code, settings.model)
    problems += _policy_lines(policy)
    try:
        import torch

        cuda = torch.cuda.is_available()
        _line(True, "torch", f"{torch.__version__}, {torch.get_num_threads()} threads")
        gpu = torch.cuda.get_device_name(0) if cuda else "no CUDA device: running on CPU"
        _line(True if cuda else None, "device", gpu)
    except Exception as exc:
        _line(False, "torch", f"not importable: {exc}")
        problems += 1
    for mod in ("transformers", "pygls", "tree_sitter"):
        try:
            m = __import__(mod)
            _line(True, mod, getattr(m, "__version__", "installed"))
        except Exception as exc:
            _line(False, mod, f"not importable: {exc}")
            problems += 1
    if settings.quantization in ("8bit", "nf4"):
        try:
            import bitsandbytes  # noqa: F401

            _line(True, "bitsandbytes", "installed")
        except Exception:
            _line(
                False,
                "bitsandbytes",
                f"quantization={settings.quantization} needs bitsandbytes: `pip install -e '.[cuda]'`",
            )
            problems += 1

    from dg_lsp import context

    for lang in sorted(context.SUPPORTED):
        try:
            context.DocumentTrees().open("file:///doctor", lang, "x\n")
            _line(True, f"grammar {lang}", "parses")
        except Exception as exc:
            _line(False, f"grammar {lang}", str(exc))
            problems += 1

    from dg_lsp.engine.loader import ModelLoadError, load_engine, resolve_model_dir

    try:
        _line(True, "model dir", str(resolve_model_dir(settings.model)))
        t0 = time.perf_counter()
        engine = load_engine(settings)
        load_ms = (time.perf_counter() - t0) * 1000
        described = engine.describe()
        facts = ", ".join(f"{k}={v}" for k, v in described.items())
        _line(True, "model", f"loaded in {load_ms:.0f} ms: {facts}")
        if described.get("dual_cache_off"):  # slower per step, not broken: a warning with its reason
            _line(None, "dual cache", f"off: {described['dual_cache_off']}")
        from dg_lsp.engine.types import InfillRequest

        result = engine.infill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=8))
        _line(True, "infill", f"{result.best!r} ({result.stats.as_dict()})")
    except ModelLoadError as exc:
        _line(False, "model", str(exc))
        problems += 1
    except Exception as exc:
        _line(False, "infill", f"{type(exc).__name__}: {exc}")
        problems += 1
    print("no problems found" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0
