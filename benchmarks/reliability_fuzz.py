"""A long run of the protocol fuzzer (tests/reliability/test_protocol_fuzz.py) against one real server.

Every generated request must get exactly one answer that is a result or a JSON-RPC error other than
internal error; the server must survive and shut down cleanly. CI runs the same test with fewer
examples.

    python benchmarks/reliability_fuzz.py --examples 1000   # writes benchmarks/results/reliability_fuzz.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# What the fuzzer and hand probes found in the stock pygls transport and document handling, and how
# each is fixed; every one is a regression test in tests/reliability/test_bad_input.py.
FOUND = [
    ("malformed JSON body", "no answer (client waits forever), 'internal error' popup", "-32700, id null"),
    ("body not UTF-8", "no answer, popup", "-32700, id null"),
    ("JSON nested 100,000 deep", "RecursionError, no answer, popup", "-32700, id null"),
    ("JSON that is not an object ([], 5, {})", "AttributeError, no answer, popup", "-32600, id null"),
    ('no "jsonrpc": "2.0"', "AttributeError, no answer", "-32600"),
    ("unknown method without params", "TypeError in pygls, no answer", "-32601"),
    ("invalid params / negative positions", "no answer, popup", "-32602 naming the field"),
    ("notification method sent with an id", "id dropped, never answered", "-32600"),
    ("Content-Length shorter than the body", "next valid frame lost", "parse error, resync on next header"),
    ("Content-Length of 10^12", "allocation sized by the header / reads swallowed", "-32600, resync"),
    (
        "lone surrogate (\\ud83d) in a document",
        "UnicodeEncodeError in tree-sitter, doc half-stored",
        "U+FFFD",
    ),
    ("didChange for a never-opened document", "KeyError, 'internal error' popup", "ignored, logged"),
    ("edit past the end of the last line", "pygls inserted before the last character", "appended"),
    (
        "lone \\r line ends; utf-8/utf-32 negotiated",
        "positions off (pygls splitlines, UTF-16 only)",
        "LSP rules",
    ),
    (
        "HTTP request (a browser's no-cors POST) before the first frame",
        "request line skipped, HTTP body run as initialize",
        "connection closed unanswered, logged once",
    ),
    ("connect-and-close before the editor (TCP)", "server exited with code 0", "keeps listening"),
    (
        "1e400 in initializationOptions",
        "initialize failed, -32603 with a traceback",
        "invalid setting, named",
    ),
    ("seed 2^70, debounceMs 1e9 in settings", "accepted; every completion failed / never answered", "named"),
    ("10**400 for a real-valued masked option", "OverflowError, internal-error popup", "invalid setting"),
    ("1e400 in echoed code-action data", "OverflowError, -32603", "no edit, applied: false"),
    ("a request after shutdown", "never answered", "-32600"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        stats_path = Path(tmp) / "stats.json"
        env = dict(os.environ, DG_LSP_FUZZ_EXAMPLES=str(args.examples), DG_LSP_FUZZ_STATS=str(stats_path))
        started = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "timeout=0",
                "-m",
                "slow or not slow",  # the main fuzz test is marked slow for the default suite
                "tests/reliability/test_protocol_fuzz.py",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
        print(out.stdout[-2000:], out.stderr[-2000:])
        if out.returncode != 0:
            return out.returncode
        stats = json.loads(stats_path.read_text())
    stats.update(
        examples=args.examples, wall_s=round(wall, 1), messages_per_s=round(stats["messages"] / wall, 1)
    )
    for key, value in stats.items():
        print(f"{key}: {value}")
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared; load average "
        f"{' / '.join(f'{x:.2f}' for x in load)} at start), Python {platform.python_version()}"
    )
    rows = "\n".join(f"| {k} | {v} |" for k, v in stats.items())
    found = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in FOUND)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability_fuzz.md").write_text(
        f"""# Protocol fuzzing: real dg-lsp processes, {stats["messages"]} generated messages

Command: `{command}`
Date: {dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}
Machine: {machine}

Hypothesis batches of 10-40 messages (well-shaped LSP with hostile values: huge/negative positions,
numbers of 10^400 and infinities written as 1e400, lone surrogates, NULs, emoji, reversed ranges,
unknown URIs and methods; params replaced by arbitrary JSON; notifications sent as requests) plus up to
3 raw frames (arbitrary bytes, wrong or huge Content-Length, no header, other header names), then a
sync request. Passed: every request answered once, no internal error, no user-visible error, valid
frames only, clean shutdown. Settings changes with hostile numbers must each be named as an invalid
setting. A TCP server that waits for its editor gets HTTP-shaped requests, HTTP headers before a frame,
garbage and early disconnects, one fresh connection each: every one closed unanswered, then the editor
is served. Wall time includes building the tiny model and starting the servers.

| figure | value |
|---|---|
{rows}

## Crashes and hangs found and fixed

| input | before | now |
|---|---|---|
{found}
"""
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
