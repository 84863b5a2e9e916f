"""What every benchmark script shares: where results go, the machine line, models to compare, reports.

Each benchmark is one command that writes `benchmarks/results/<name>.md` (+ `.png`, `.json`); the
markdown always starts with the exact command, the date and the machine, so a figure can be traced
back to how and where it was measured.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SPAN_LENGTHS = (8, 16, 32, 64, 128)


def command_line() -> str:
    """The command as a user would retype it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    return "python " + " ".join([shown, *(shlex.quote(a) for a in sys.argv[1:])])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def other_jobs() -> list[str]:
    """Heavy neighbours (training runs, other benchmarks) that share the CPU, for the conditions line."""
    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu,args"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    mine = {os.getpid(), os.getppid()}
    jobs = []
    for line in out.splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) < 3 or int(parts[0]) in mine:
            continue
        pcpu, args = float(parts[1]), parts[2]
        if pcpu >= 20 and "ps -eo" not in args:
            jobs.append(f"{args[:80]} ({pcpu:.0f}% CPU)")
    return jobs


def machine(threads: int | None = None) -> dict[str, str]:
    import torch

    info = {
        "cpu": f"{cpu_model()}, {os.cpu_count()} cores",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "load_average": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if threads is not None:
        info["threads"] = str(threads)
    try:
        import llama_cpp

        info["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        pass
    jobs = other_jobs()
    info["other_jobs"] = "; ".join(jobs) if jobs else "none above 20% CPU"
    return info


def header(title: str, threads: int | None = None, extra: str = "") -> tuple[list[str], dict[str, str]]:
    """Markdown lines: title, exact command, date, machine and load conditions."""
    info = machine(threads)
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# {title}",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Date: {date}",
        "",
        f"Machine: {info['cpu']}, {info['os']}, Python {info['python']}, torch {info['torch']}, "
        f"device {info['device']}"
        + (f", llama-cpp-python {info['llama_cpp_python']}" if "llama_cpp_python" in info else "")
        + (f", {threads} thread(s) per model" if threads else "")
        + ".",
        "",
        f"Conditions at start: load average {info['load_average']}; other busy processes: "
        f"{info['other_jobs']}.",
        "",
    ]
    if extra:
        lines += [extra, ""]
    return lines, {"date": date, "command": command_line(), **info}


def cpu_ms(fn, rounds: int = 5, calls: int = 10) -> float:
    """CPU ms of the calling thread per call of `fn`: best of `rounds` rounds of `calls` calls, after 3
    warm-up calls. Thread CPU time is disturbed far less than wall time by other jobs on the machine."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t) / calls * 1000)
    return best


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def md_table(headers: list[str], rows: list[list[object]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---" if a == "l" else "--:" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return out


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "n/a"
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def write_results(out: Path, name: str, lines: list[str], raw: dict | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    if raw is not None:
        (out / f"{name}.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(path: Path, groups: dict[str, dict[str, float]], ylabel: str, title: str) -> None:
    """One bar per variant in each group (variants in the same order and colour in every group)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    variants = list(next(iter(groups.values())))
    width = len(variants) + 1
    for i, values in enumerate(groups.values()):
        for j, variant in enumerate(variants):
            ax.bar(i * width + j, values[variant], color=f"C{j}", label=variant if i == 0 else None)
    centre = (len(variants) - 1) / 2
    ax.set_xticks([i * width + centre for i in range(len(groups))], list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# -- models ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """One dg-lsp model to benchmark: a label, a checkpoint directory and the backend that runs it."""

    label: str
    path: Path
    backend: str  # "diffusion-gemma", "masked" or "ar"


def _first_model_dir(candidates: list[Path]) -> Path | None:
    for path in candidates:
        if (path / "config.json").exists():
            return path
    return None


def default_models(diffusion: str | None = None, ar: str | None = None) -> list[ModelSpec]:
    """The 5M diffusion model (`embedded-tiny`) and its AR twin: shipped copies first, then the training
    runs' best. A model given by path is labelled with its path, so reports never call another model
    "embedded"."""
    found = []
    d = _first_model_dir(
        [Path(diffusion)]
        if diffusion
        else [ROOT / "dg_lsp/models/embedded_tiny", ROOT / "runs/dream-from-ar/best"]
    )
    if d:
        from dg_lsp.engine.loader import detect_backend

        found.append(
            ModelSpec(
                f"diffusion ({_short(d)})" if diffusion else "diffusion (embedded)",
                d,
                detect_backend(json.loads((d / "config.json").read_text())),
            )
        )
    a = _first_model_dir(
        [Path(ar)] if ar else [ROOT / "dg_lsp/models/ar_twin", ROOT / "runs/ar-gemma3-cpu/best"]
    )
    if a:
        found.append(ModelSpec(f"AR ({_short(a)})" if ar else "AR twin", a, "ar"))
    return found


def _short(path: Path) -> str:
    """The last two parts of a model directory (`smollm2-block/best`): enough to tell runs apart."""
    return "/".join(Path(path).resolve().parts[-2:])


def tiny_models(tmp: Path) -> list[ModelSpec]:
    """Tiny random checkpoints for `--smoke`: real code paths in seconds, meaningless figures."""
    from dg_lsp.models.tiny import make_tiny_diffusion_gemma
    from dg_lsp.models.tiny_extra import make_tiny_causal_lm

    d = tmp / "tiny-diffusion"
    a = tmp / "tiny-ar"
    if not (d / "config.json").exists():
        make_tiny_diffusion_gemma(d)
    if not (a / "config.json").exists():
        make_tiny_causal_lm(a)
    return [ModelSpec("tiny diffusion", d, "diffusion-gemma"), ModelSpec("tiny AR", a, "ar")]


def model_identity(path: Path) -> str:
    """Which checkpoint exactly: its training step (metrics.json) and a hash prefix of its weights."""
    import hashlib

    path = Path(path)
    bits = []
    metrics = path / "metrics.json" if path.is_dir() else None
    if metrics is not None and metrics.exists():
        step = json.loads(metrics.read_text()).get("step")
        if step is not None:
            bits.append(f"step {step}")
    weights = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if weights and weights[0].is_file():
        digest = hashlib.sha256()
        with open(weights[0], "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        bits.append(f"sha256 {digest.hexdigest()[:12]}")
    return ", ".join(bits)


def parameters(path: Path) -> str:
    """Parameter count from the safetensors headers, without loading the model."""
    from safetensors import safe_open

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                total += _numel(st.get_slice(key).get_shape())
    return f"{total / 1e6:.2f}M" if total else "?"


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
