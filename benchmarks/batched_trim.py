"""Tail trimming in the team server's batches: the replica's engine alone, trimming on against off.

The requests are `team_serve.py`'s: 16 typists, each typing a stretch of a source file of this
repository back in, 7 characters per request, 32 tokens at most. For each setting the engine runs them
as one batch (`EngineRunner` with batching, as a replica does) and one after another (the engine's own
path); the per-document prompt cache is cleared before each setting's warm-up round, then `--rounds`
rounds are timed. The settings alternate `--repeats` times so that drift of a shared machine falls on
both. Reported: seconds per 16 requests (median over repeats), batched forward passes, and how many
completions were identical with trimming on and off.

    python benchmarks/batched_trim.py                 # the committed run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import team_serve

from dg_lsp.engine.loader import load_engine
from dg_lsp.settings import Settings
from dg_lsp.team.local import EngineRunner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--typists", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=common.RESULTS / "team_serve")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    lines, info = common.header("Tail trimming in the team server's batches", threads=1)
    engine = load_engine(Settings(model=str(common.ROOT / team_serve.MODELS["diffusion"])))
    engine.warmup()
    n = args.typists
    texts = [(common.ROOT / team_serve.SOURCES[i % len(team_serve.SOURCES)]).read_text() for i in range(n)]
    base = engine.cfg
    times: dict[tuple[bool, bool], list[float]] = {}
    forwards: dict[bool, list[int]] = {}
    texts_out: dict[tuple[bool, bool], list[str]] = {}
    for _ in range(args.repeats):
        for batching in (True, False):
            for trim in (False, True):
                engine.cfg = dataclasses.replace(base, trim_tail=trim)
                engine.reset_caches()
                runner = EngineRunner(engine, batching)
                never = [lambda: False] * n
                runner.run([team_serve.typing(t, i, 0) for i, t in enumerate(texts)], never)
                before = runner.batcher.forwards if batching else 0
                started, outs = time.perf_counter(), []
                for k in range(1, args.rounds + 1):
                    outs += runner.run([team_serve.typing(t, i, k) for i, t in enumerate(texts)], never)
                times.setdefault((batching, trim), []).append((time.perf_counter() - started) / args.rounds)
                if batching:
                    forwards.setdefault(trim, []).append((runner.batcher.forwards - before) // args.rounds)
                texts_out[(batching, trim)] = [o.best for o in outs]
                print(json.dumps({"batching": batching, "trim": trim, "s": times[(batching, trim)][-1]}))
    engine.cfg = base
    rows, raw = [], []
    for batching in (True, False):
        off, on = (statistics.median(times[(batching, t)]) for t in (False, True))
        same = sum(
            a == b for a, b in zip(texts_out[(batching, False)], texts_out[(batching, True)], strict=True)
        )
        fw = [statistics.median(forwards[t]) if batching else "" for t in (False, True)]
        rows.append(
            [
                "one batch" if batching else "one after another",
                f"{off:.2f}",
                f"{on:.2f}",
                f"{off / on:.2f}x",
                *fw,
                f"{same} of {len(texts_out[(batching, True)])}",
            ]
        )
        raw.append({"batching": batching, "s_off": times[(batching, False)], "s_on": times[(batching, True)]})
    lines += [
        f"Requests: `team_serve.py`'s, {n} typists x {args.rounds} timed rounds (after one warm-up round per"
        f" setting, prompt cache cleared first), 32 tokens at most; settings alternated {args.repeats}"
        " times, medians shown. Model: the embedded diffusion model, its default sampler.",
        "",
        *common.md_table(
            [
                "run",
                f"s per {n} (trim off)",
                f"s per {n} (trim on)",
                "speed-up",
                "batched forwards per round (off)",
                "(on)",
                "same completion",
            ],
            rows,
        ),
    ]
    lines += ["", "![batched trim](batched_trim.png)"]
    path = common.write_results(args.out, "batched_trim", lines, {"info": info, "runs": raw})
    common.grouped_bars(
        args.out / "batched_trim.png",
        {
            "one batch" if batching else "one after another": {
                f"trim {'on' if trim else 'off'}": statistics.median(times[(batching, trim)])
                for trim in (False, True)
            }
            for batching in (True, False)
        },
        f"s per {n} requests (median)",
        "Tail trimming on the team server's requests",
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
