"""A one-minute typing storm against a real `dg-lsp` process with a real (tiny) model.

Bursts of 3-15 keystrokes at `--keys-per-s`, each keystroke a `didChange` plus an automatic
`inlineCompletion` (and a `completion` one time in four), 30% of superseded requests cancelled,
then a 0.2-0.8 s pause. Measures messages/s, the latency of the newest request of each burst (what
the user waits for), the share of stale requests answered empty, the client's outstanding requests,
the model worker's peak queue, and the server's RSS (VmRSS from /proc) over the minute. The server's
text is checked against the client's at the end.

    python benchmarks/reliability_storm.py              # writes benchmarks/results/reliability_storm.{md,png}
    python benchmarks/reliability_storm.py --seconds 10 --out /tmp/x   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.reliability.rawlsp import RawServer  # noqa: E402
from tests.reliability.storm import run_storm  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--keys-per-s", type=float, default=40)
    ap.add_argument("--model", help="model directory (default: a fresh tiny random DiffusionGemma)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            import torch

            from dg_lsp.models.tiny import make_tiny_diffusion_gemma

            torch.set_num_threads(1)
            model = str(make_tiny_diffusion_gemma(Path(tmp) / "tiny"))
        server = RawServer([], Path(tmp) / "server.log")
        try:
            server.initialize({"dgLsp": {"model": model}})
            server.wait_loaded()
            result = run_storm(server, args.seconds, args.keys_per_s, seed=args.seed)
            assert server.shutdown() == 0
            log = server.log_text()
        finally:
            server.kill()
    figures = result.summary()
    worker = re.search(r"model worker: (\d+) completed, (\d+) cancelled, (\d+) failed, peak queue (\d+)", log)
    figures.update(
        worker_completed=int(worker.group(1)),
        worker_cancelled=int(worker.group(2)),
        worker_failed=int(worker.group(3)),
        worker_peak_queue=int(worker.group(4)),
    )
    for key, value in figures.items():
        print(f"{key}: {value}")
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(result, args.out / "reliability_storm.png")
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared; load average "
        f"{' / '.join(f'{x:.2f}' for x in load)} at start), Python {platform.python_version()}"
    )
    rows = "\n".join(f"| {k} | {v} |" for k, v in figures.items())
    (args.out / "reliability_storm.md").write_text(
        f"""# Typing storm: a real dg-lsp process for {figures["seconds"]} s

Command: `{command}`
Date: {dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}
Machine: {machine}
Model: {"tiny random DiffusionGemma (tests' fixture), default settings" if args.model is None else model}

Bursts of 3-15 keystrokes at {args.keys_per_s:g} keys/s; each keystroke is a `didChange` plus an
automatic `inlineCompletion` (plus a `completion` one time in four); 30% of superseded requests are
cancelled; 0.2-0.8 s pauses between bursts. "Newest" is the last request of a burst: the one whose
ghost text the user waits for. "Superseded" means the next keystroke had been sent before the answer
arrived; such a request can still be answered non-empty when the server finished it before it
read that keystroke (a race, not staleness). The server's text matched the client's exactly at the
end (every line's offsets and the content of a TODO line, read back through code actions).

| figure | value |
|---|---|
{rows}

![RSS and latency](reliability_storm.png)
"""
    )
    return 0


def _plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    t = [x for x, _ in result.rss_kib]
    a.plot(t, [kib / 1024 for _, kib in result.rss_kib], marker=".")
    a.set_xlabel("seconds into the storm")
    a.set_ylabel("server VmRSS (MiB)")
    a.set_title("Server memory during the storm")
    lat = result.newest_latency_ms
    b.hist(lat, bins=30)
    b.set_xlabel("ms from request to answer")
    b.set_ylabel("bursts")
    b.set_title(f"Newest request latency (n={len(lat)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
