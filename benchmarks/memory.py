"""Resident memory of the `dg-lsp` server with each model and quantization.

Each configuration is a fresh `python -m dg_lsp` over stdio (a real client, tests/lsp_harness.py):
initialize with the model and quantization, wait for the model to load, answer a few inline
completions on a real file, then read the server's RSS and its peak (VmHWM) from the OS. For scale,
a server whose model load is refused (protocol + context layer only), and SmolLM2-135M Q4_1 on
llama.cpp in a plain Python process (the peer a user might run instead; not a language server).

    python benchmarks/memory.py            # writes benchmarks/results/memory.{md,png,json}
    python benchmarks/memory.py --smoke    # tiny random model (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import common
import peers
from lsprotocol import types

from tests.lsp_harness import CLIENT_CAPABILITIES, HarnessClient, open_doc, reap, shutdown_and_exit

QUANTIZATIONS = ("none", "int4", "int8")


@dataclass
class Row:
    label: str
    quantization: str
    rss_mib: float
    peak_mib: float
    weights_mib: float
    load_ms: float
    completions: int
    note: str = ""


def rss_of(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB, from /proc (Linux) or psutil."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    import psutil

    info = psutil.Process(pid).memory_info()
    return info.rss / 2**20, float(getattr(info, "peak_wset", info.rss)) / 2**20


def weights_mib(path: Path | None) -> float:
    if path is None or not path.exists():
        return 0.0
    files = (
        [path] if path.is_file() else [*path.glob("*.safetensors"), *path.glob("*.bin"), *path.glob("*.gguf")]
    )
    return sum(f.stat().st_size for f in files) / 2**20


async def measure_server(
    label: str, model: str, quantization: str, text: str, requests: int, log: Path
) -> Row:  # fmt: skip
    client = HarnessClient()
    await client.start_logged([], log)
    uri = "file:///bench/memory.py"
    try:
        t0 = time.perf_counter()
        init = {"dgLsp": {"model": model, "quantization": quantization, "debounceMs": 0}}
        await asyncio.wait_for(
            client.initialize_async(
                types.InitializeParams(
                    capabilities=CLIENT_CAPABILITIES, initialization_options=init, process_id=None
                )
            ),
            60,
        )
        client.initialized(types.InitializedParams())
        open_doc(client, uri, text)
        await asyncio.wait_for(client.loaded.wait(), 300)
        load_ms = (time.perf_counter() - t0) * 1000
        failed = not (Path(model) / "config.json").exists()  # the deliberate no-model baseline
        lines = text.split("\n")
        done = 0
        for i in range(requests if not failed else 0):
            line = 40 + 17 * i
            params = types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line, character=len(lines[line])),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            )
            await asyncio.wait_for(client.text_document_inline_completion_async(params), 120)
            done += 1
        await asyncio.sleep(0.2)
        rss, peak = rss_of(client.process.pid)
        await shutdown_and_exit(client)
    finally:
        await reap(client)
    note = "model load refused: protocol + context only" if failed else common.model_identity(Path(model))
    path = Path(model) if not failed else None
    return Row(label, quantization, rss, peak, weights_mib(path), load_ms, done, note)


PEER_SCRIPT = """
import json, sys
sys.path.insert(0, {bench!r})
import memory, peers
p = peers.LlamaCppPeer(threads=1)
for _ in range({requests}):
    p.generate({prefix!r}, 32)
rss, peak = memory.rss_of(__import__("os").getpid())
print(json.dumps({{"rss": rss, "peak": peak}}))
"""


def measure_peer(text: str, requests: int) -> Row:
    gguf = peers.smollm2_gguf()
    script = PEER_SCRIPT.format(
        bench=str(Path(__file__).resolve().parent), requests=requests, prefix=text[:2000]
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True
    )
    ms = (time.perf_counter() - t0) * 1000
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return Row(peers.LABEL, "Q4_1 (GGUF)", got["rss"], got["peak"], weights_mib(gguf), ms, requests,
               "plain Python process running llama-cpp-python, not a language server")  # fmt: skip


def plot(rows: list[Row], path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 1.5))
    labels = [f"{r.label} [{r.quantization}]" for r in rows]
    ax.barh(labels, [r.rss_mib for r in rows], label="RSS after completions")
    ax.barh(labels, [r.weights_mib for r in rows], label="weights on disk", alpha=0.7)
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    ax.set_title("Resident memory of the dg-lsp server per model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random model, no peer (CI)")
    ap.add_argument("--diffusion")
    ap.add_argument("--ar")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--out", type=Path, default=common.RESULTS)
    args = ap.parse_args(argv)
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    notes = []
    with tempfile.TemporaryDirectory(prefix="dg-mem-bench-") as tmp:
        tmp_path = Path(tmp)
        lines, meta = common.header("Server memory (RSS) per model and quantization")
        if args.smoke:
            models, quants, args.requests = common.tiny_models(tmp_path)[:1], ("none",), 1
        else:
            models, quants = common.default_models(args.diffusion, args.ar), QUANTIZATIONS
        if not models:
            print("no dg-lsp model found: train one (dg_lsp/training/README.md) or pass --diffusion/--ar")
            return 2
        rows = []
        configs = [("server, no model", str(tmp_path / "missing-model"), "none")]
        configs += [(spec.label, str(spec.path), q) for spec in models for q in quants]
        for i, (label, model, q) in enumerate(configs):
            print(f"server with {label} [{q}]", flush=True)
            rows.append(
                asyncio.run(measure_server(label, model, q, text, args.requests, tmp_path / f"s{i}.log"))
            )
        why = peers.available()
        if not args.smoke and not args.no_peer and why is None:
            print("peer: SmolLM2 on llama.cpp", flush=True)
            rows.append(measure_peer(text, args.requests))
        elif why and not args.smoke:
            notes.append(f"{peers.LABEL} not measured: {why}.")
    table = [
        [
            r.label,
            r.quantization,
            r.rss_mib,
            r.peak_mib,
            r.weights_mib,
            r.load_ms / 1000,
            r.completions,
            r.note,
        ]
        for r in rows
    ]
    lines += [
        f"Each row is a fresh process. Server rows: RSS of `python -m dg_lsp` after loading the model and "
        f"answering {args.requests} inline completions on textwrap.py (CPU, 1 process). 'load s' is "
        "spawn → model loaded (server rows) or the whole script (peer row), on a shared CPU.",
        "",
        *(f"Note: {n}" for n in notes),
        "",
        *common.md_table(
            [
                "model",
                "quantization",
                "RSS MiB",
                "peak RSS MiB",
                "weights MiB",
                "load s",
                "completions",
                "note",
            ],
            table,
            "llrrrrrl",
        ),
        "",
        "![memory](memory.png)",
        "",
    ]
    path = common.write_results(args.out, "memory", lines, {"meta": meta, "rows": [asdict(r) for r in rows]})
    plot(rows, args.out / "memory.png")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
