"""The team server under load: simulated typists against one engine replica on Ray Serve.

Each typist is a thread with its own document (a real source file of this repository) and its own HTTP
client (`RemoteEngine`, the remote backend an editor would use): it types 7 more characters of a stretch
of the file back in (the window start and the code after the stretch stay put, as in an editor), asks
for a completion (`POST /v1/fim/completions`, 32 tokens at most), waits for the answer, pauses for
`--think` seconds and types on. 1, 4 and 16 typists share one replica (one CPU), with the replica's
batching on (requests that queued while the model worked decode as one batch of canvases, or with
`--continuous` join the running decode at its next step and leave it the step they end,
`dg_lsp/engine/batching.py`)
and off (one request after another through the engine's own single-request path). The embedded
diffusion model and its AR twin are served the same way.

Reported per point, over the answers that arrive in the measured window: latency p50/p95 (request sent →
answer read, queueing included) and throughput in generated tokens per second of wall time. Writes
`benchmarks/results/team_serve/team_serve.md/.png/.json`.

    python benchmarks/team_serve.py                 # the committed run (the 5M models)
    python benchmarks/team_serve.py --models embedded,ar-twin-smollm2 --duration 60 --warm 15   # shipped
    python benchmarks/team_serve.py --smoke         # seconds per point, 1 and 2 typists
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common

from dg_lsp.engine.remote import RemoteEngine
from dg_lsp.engine.types import InfillRequest
from dg_lsp.settings import Settings

SOURCES = [
    "dg_lsp/engine/sampler.py",
    "dg_lsp/engine/cache.py",
    "dg_lsp/context/windows.py",
    "dg_lsp/pipeline.py",
    "dg_lsp/settings.py",
    "dg_lsp/engine/commit.py",
]
MODELS = {
    "diffusion": "dg_lsp/models/embedded_tiny",
    "ar-twin": "dg_lsp/models/ar_twin",
    "embedded": "dg_lsp/models/embedded_smollm2",  # the shipped SmolLM2-based model (`--models embedded,…`)
    "ar-twin-smollm2": "dg_lsp/models/ar_twin_smollm2",
}
TWINS = {"diffusion": "ar-twin", "embedded": "ar-twin-smollm2"}
"""Each diffusion model and the AR twin trained beside it on the same data and budget."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def typing(text: str, n: int, k: int) -> InfillRequest:
    """Typist n's k-th request: the user types a 2,000-character stretch of the file back in, 7 characters
    per request, as in an editor: the prefix grows from a window start that stays put (the editor's
    window snaps to a statement boundary) and the suffix, the code after the stretch, does not change."""
    start = min(len(text) - 600, 400 + 997 * n % max(1, len(text) - 1000))
    gap_end = min(len(text) - 100, start + 2000)
    cursor = start + 7 * (1 + k % max(1, (gap_end - start) // 7))
    lo = max(0, start - 1500)
    return InfillRequest(text[lo:cursor], text[gap_end : gap_end + 500], max_tokens=32, doc_key=f"t{n}")


def typist(n: int, url: str, stop_at: float, start_at: float, think: float, out: list) -> None:
    """Type through one file from a different place per typist, asking for a completion every few keys."""
    text = (common.ROOT / SOURCES[n % len(SOURCES)]).read_text()
    client = RemoteEngine(url, timeout_s=120)
    k = 0
    while time.monotonic() < stop_at:
        request = typing(text, n, k)
        k += 1
        sent = time.monotonic()
        try:
            result = client.infill(request)
            ok = True
        except Exception as exc:  # counted, shown in the report
            result, ok = exc, False
        done = time.monotonic()
        # counted by when it ends: a window that kept only requests sent inside it left out every request
        # still running at its end, which is most of the work when an answer takes a third of the window
        if start_at <= done <= stop_at:
            tokens = result.stats.generated_tokens if ok else 0
            out.append({"latency_ms": (done - sent) * 1000, "tokens": tokens, "ok": ok})
        time.sleep(think)


def measure(url: str, typists: int, duration: float, warm: float, think: float) -> dict:
    samples: list[dict] = []
    start_at = time.monotonic() + warm
    stop_at = start_at + duration
    threads = [
        threading.Thread(target=typist, args=(i, url, stop_at, start_at, think, samples))
        for i in range(typists)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = [s["latency_ms"] for s in samples if s["ok"]]
    return {
        "typists": typists,
        "requests": len(lat),
        "errors": sum(not s["ok"] for s in samples),
        "p50_ms": common.percentile(lat, 50),
        "p95_ms": common.percentile(lat, 95),
        "tokens_per_s": sum(s["tokens"] for s in samples) / duration,
        "requests_per_s": len(lat) / duration,
    }


def engine_alone(model: str, n: int = 16, rounds: int = 3) -> list[dict]:
    """The replica's ceiling without HTTP or Ray: the same 16 typists' requests run in this process,
    as one batch (`EngineRunner` with batching) and one after another (the engine's own path, its
    per-document prompt cache warm), each typist 7 characters further every round."""
    from dg_lsp.engine.loader import load_engine
    from dg_lsp.team.local import EngineRunner

    engine = load_engine(Settings(model=str(common.ROOT / MODELS[model])))
    engine.warmup()
    texts = [(common.ROOT / SOURCES[i % len(SOURCES)]).read_text() for i in range(n)]

    def requests(k: int) -> list[InfillRequest]:
        return [typing(t, i, k) for i, t in enumerate(texts)]

    rows = []
    for batching in (False, True):
        runner = EngineRunner(engine, batching)
        runner.run(requests(0), [lambda: False] * n)
        started, tokens = time.perf_counter(), 0
        for k in range(1, rounds + 1):
            tokens += sum(o.stats.generated_tokens for o in runner.run(requests(k), [lambda: False] * n))
        took = time.perf_counter() - started
        rows.append(
            {
                "model": model,
                "batching": "on" if batching else "off",
                "s_per_16": took / rounds,
                "tokens_per_s": tokens / took,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--typists", default="1,4,16")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per point")
    parser.add_argument("--warm", type=float, default=3.0, help="seconds of load before measuring")
    parser.add_argument("--think", type=float, default=0.05, help="pause between a typist's requests (s)")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument(
        "--continuous", action="store_true", help="also measure continuous batching (rows 'continuous')"
    )
    parser.add_argument("--skip-alone", action="store_true", help="leave out the engine-alone table")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--models", default="diffusion,ar-twin")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "team_serve")
    parser.add_argument("--smoke", action="store_true", help="1 and 2 typists, 3 s per point")
    args = parser.parse_args()
    if args.smoke:
        args.typists, args.duration, args.warm = "1,2", 3.0, 0.5
    counts = [int(x) for x in args.typists.split(",")]
    from ray import serve

    from dg_lsp.team import ray_serve

    lines, info = common.header(
        "Team server: simulated typists against one replica",
        threads=1,
        extra=(
            f"One engine replica (1 CPU, 1 torch thread) on a local Ray ({args.num_cpus} CPUs, shared with "
            "the ingress, the HTTP proxy and the typists). Each typist: a request "
            f"{args.think * 1000:g} ms after the previous answer, 32 tokens at most, typing a "
            "2,000-character stretch of its file back in 7 characters per request (the window's start, "
            "1,500 characters before the stretch, and the 500 characters after it stay put, as an editor "
            "sends them); "
            f"{args.duration:g} s measured after {args.warm:g} s of load per point. Batching on: static "
            "batches (what queued while the replica worked is its next batch)"
            + ("; continuous: requests join the running decode between steps." if args.continuous else ".")
        ),
    )
    skip = args.smoke or args.skip_alone
    alone = [] if skip else [r for m in args.models.split(",") for r in engine_alone(m)]
    modes = ["on", "continuous", "off"] if args.continuous else ["on", "off"]
    rows: list[dict] = []
    port = _free_port()
    started = False
    try:
        for model in args.models.split(","):
            for mode in modes:
                cfg = ray_serve.TeamConfig(
                    settings=Settings(model=str(common.ROOT / MODELS[model])),
                    replicas=1,
                    batching=mode != "off",
                    continuous=mode == "continuous",
                    max_batch=args.max_batch,
                    cpus_per_replica=1,
                    port=port,
                    request_timeout_s=120,
                )
                if started:
                    serve.delete(ray_serve.APP_NAME)
                    serve.run(
                        ray_serve.build_app(cfg), name=ray_serve.APP_NAME, route_prefix="/", blocking=False
                    )
                else:
                    ray_serve.start(cfg, num_cpus=args.num_cpus)
                    started = True
                url = f"http://127.0.0.1:{port}"
                RemoteEngine(url).infill(InfillRequest("def f(x):\n    return ", "\n", max_tokens=8))
                for n in counts:
                    point = measure(url, n, args.duration, args.warm, args.think)
                    point.update(model=model, batching=mode)
                    print(json.dumps(point), flush=True)
                    rows.append(point)
    finally:
        if started:
            ray_serve.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, lines, info, rows, counts, alone)
    return 0


def _get(rows: list[dict], model: str, batching: str, n: int) -> dict | None:
    return next((r for r in rows if (r["model"], r["batching"], r["typists"]) == (model, batching, n)), None)


def write_report(
    out: Path, lines: list[str], info: dict, rows: list[dict], counts: list[int], alone: list[dict]
) -> None:
    table = [
        [
            r["model"],
            r["batching"],
            r["typists"],
            r["requests"],
            r["errors"],
            f"{r['p50_ms']:.0f}",
            f"{r['p95_ms']:.0f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['requests_per_s']:.1f}",
        ]
        for r in rows
    ]
    headers = ["model", "batching", "typists", "answers", "errors", "p50 ms", "p95 ms", "generated tokens/s"]
    lines += common.md_table([*headers, "answers/s"], table)
    if alone:
        lines += [
            "",
            "## The replica's engine alone",
            "",
            "The same 16 typists' requests in this process, no HTTP and no Ray: one batch of 16, against",
            "16 requests one after another through the engine's own path (per-document prompt cache warm).",
            "",
        ]
        lines += common.md_table(
            ["model", "batching", "s per 16 requests", "generated tokens/s"],
            [[r["model"], r["batching"], f"{r['s_per_16']:.2f}", f"{r['tokens_per_s']:.1f}"] for r in alone],
        )
    lines += ["", "## Against the targets", ""]
    top, one = max(counts), min(counts)
    for model in dict.fromkeys(r["model"] for r in rows):
        on, off = _get(rows, model, "on", top), _get(rows, model, "off", top)
        single = _get(rows, model, "on", one)
        if on and off and off["tokens_per_s"] > 0:
            ratio = on["tokens_per_s"] / off["tokens_per_s"]
            lines.append(
                f"- {model}: batching gives {ratio:.2f}x the throughput of no batching at {top} typists "
                f"(target at least 2x: {'met' if ratio >= 2 else 'missed'})."
            )
        if on and single and single["p95_ms"] > 0:
            ratio = on["p95_ms"] / single["p95_ms"]
            lines.append(
                f"- {model}: p95 at {top} typists is {ratio:.2f}x the {one}-typist p95 "
                f"(target at most 3x: {'met' if ratio <= 3 else 'missed'})."
            )
    for diffusion, twin in TWINS.items():
        d, a = _get(rows, diffusion, "on", top), _get(rows, twin, "on", top)
        if d and a and a["tokens_per_s"] > 0:
            ratio = d["tokens_per_s"] / a["tokens_per_s"]
            verdict = "the diffusion model keeps an edge" if ratio > 1.1 else "the edge is lost"
            if 0.9 <= ratio <= 1.1:
                verdict = "neither has an edge beyond the noise of one run"
            lines.append(
                f"- {diffusion} vs its AR twin ({twin}), both batched, {top} typists: {ratio:.2f}x the "
                f"twin's tokens/s ({verdict})."
            )
    (out / "team_serve.md").write_text("\n".join(lines) + "\n")
    (out / "team_serve.json").write_text(
        json.dumps({"info": info, "rows": rows, "engine_alone": alone}, indent=2) + "\n"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for model in dict.fromkeys(r["model"] for r in rows):
        for batching, style in (("on", "-o"), ("continuous", "-^"), ("off", "--s")):
            pts = [r for r in rows if r["model"] == model and r["batching"] == batching]
            if not pts:
                continue
            label = f"{model}, batching {batching}"
            left.plot([p["typists"] for p in pts], [p["tokens_per_s"] for p in pts], style, label=label)
            right.plot([p["typists"] for p in pts], [p["p95_ms"] for p in pts], style, label=label)
    for ax, title in ((left, "throughput (generated tokens/s)"), (right, "p95 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("typists")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("dg-lsp team server: one replica on Ray Serve")
    fig.tight_layout()
    fig.savefig(out / "team_serve.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
