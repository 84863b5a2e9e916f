"""End-to-end latency over LSP: a real client replays a typing session against a real `dg-lsp` process.

For each model, a fresh `python -m dg_lsp` over stdio (pygls's client, tests/lsp_harness.py). Cold
start: process spawn → `initialize` answered → model loaded (progress `end`) → first inline
completion answered. Then, on real files (CPython's standard library, jQuery when installed), lines
are blanked and retyped one character at a time at typing speed (seeded log-normal gaps, pauses after
some words, a typo + backspace now and then, a longer pause at the end of each line): every keystroke
is a `didChange` followed by an automatic `textDocument/inlineCompletion`; a request still in flight
when the next key arrives is cancelled with `$/cancelRequest`, as editors do. Latency is request sent
→ response received, over the requests the client did not cancel.

    python benchmarks/lsp_latency.py           # writes benchmarks/results/lsp_latency.{md,png,json}
    python benchmarks/lsp_latency.py --smoke   # tiny random model, one short line (CI)
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
import uuid
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import common
from lsprotocol import types

from dg_lsp.settings import Settings
from tests.lsp_harness import CLIENT_CAPABILITIES, HarnessClient, open_doc, reap, shutdown_and_exit

STDLIB = Path(sysconfig.get_paths()["stdlib"])
REAL_FILES = [
    ("python", STDLIB / "textwrap.py"),
    ("python", STDLIB / "json" / "encoder.py"),
    ("python", STDLIB / "argparse.py"),
    ("javascript", Path("/usr/share/javascript/jquery/jquery.js")),
]


LINE_END_WAIT_S = 30.0


@dataclass(frozen=True)
class Typing:
    """How the simulated user types; defaults are a brisk programmer (~8 characters a second)."""

    median_gap_ms: float = 110.0
    gap_sigma: float = 0.35
    word_pause_prob: float = 0.25
    word_pause_ms: tuple[float, float] = (350.0, 1200.0)
    line_end_pause_ms: float = 2500.0
    typo_prob: float = 0.03


@dataclass
class Request:
    file: str
    keystroke: int
    sent: float
    done: float | None = None
    cancelled: bool = False
    items: int = 0
    error: str = ""
    uri: str = ""
    version: int = 0
    """The document version the request was sent at: with `uri`, the key of the server's log line."""
    source: str = ""
    """How the server answered it, from its log: `model` (a model run), `cache` (the completion cache:
    the user typed into the suggestion shown) or `` (no engine result: stale, superseded, not ready)."""

    @property
    def ms(self) -> float | None:
        return None if self.done is None or self.cancelled else (self.done - self.sent) * 1000


@dataclass
class ColdStart:
    initialize_ms: float = 0.0
    loaded_ms: float = 0.0
    first_completion_ms: float = 0.0
    first_nonempty_ms: float | None = None


@dataclass
class ModelRun:
    label: str
    model: str
    cold: ColdStart
    requests: list[Request] = field(default_factory=list)
    keystrokes: int = 0
    wall_s: float = 0.0


def pick_lines(text: str, n: int, rng: random.Random, min_len: int, max_len: int) -> list[int]:
    """Line numbers worth retyping: ASCII code lines of moderate length, away from the file's edges."""
    lines = text.split("\n")
    ok = [
        i for i, ln in enumerate(lines)
        if 20 <= i < len(lines) - 5 and ln.isascii() and min_len <= len(ln.strip()) <= max_len
        and not ln.strip().startswith(("#", "//", "*", "/*", '"', "'"))
    ]  # fmt: skip
    return sorted(rng.sample(ok, min(n, len(ok))))


def _pos_change(line: int, col: int, text: str, delete: int = 0) -> types.TextDocumentContentChangePartial:
    start = types.Position(line=line, character=col)
    end = types.Position(line=line, character=col + delete)
    return types.TextDocumentContentChangePartial(range=types.Range(start=start, end=end), text=text)


class Session:
    """One client + one server process; sends keystrokes and cancellable inline-completion requests."""

    def __init__(self, client: HarnessClient, uri: str):
        self.client = client
        self.uri = uri
        self.version = 1
        self.inflight: tuple[str, Request] | None = None
        self.requests: list[Request] = []

    def change(self, changes: list) -> None:
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
                content_changes=changes,
            )
        )

    def cancel_inflight(self) -> None:
        if self.inflight is None:
            return
        msg_id, req = self.inflight
        if req.done is None:
            req.cancelled = True
            req.done = time.perf_counter()
            self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
        self.inflight = None

    def request(self, line: int, col: int, label: str, keystroke: int, automatic: bool = True) -> Future:
        kind = (
            types.InlineCompletionTriggerKind.Automatic
            if automatic
            else types.InlineCompletionTriggerKind.Invoked
        )
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri),
            position=types.Position(line=line, character=col),
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
        msg_id = uuid.uuid4().hex
        req = Request(label, keystroke, time.perf_counter(), uri=self.uri, version=self.version)
        self.requests.append(req)

        def finished(fut) -> None:
            if req.done is not None:  # cancelled by us first; the late answer does not count
                return
            req.done = time.perf_counter()
            try:
                result = fut.result()
                req.items = len(result.items) if result is not None else 0
            except BaseException as exc:  # RequestCancelled from the server, or a real error
                req.error = type(exc).__name__

        fut = self.client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
        fut.add_done_callback(finished)
        self.inflight = (msg_id, req)
        return fut


async def type_line(
    s: Session, label: str, line_no: int, indent: str, content: str, typing: Typing, rng: random.Random,
    counter: list[int],
) -> None:  # fmt: skip
    col = len(indent)
    i = 0
    while i < len(content):
        gap = rng.lognormvariate(0, typing.gap_sigma) * typing.median_gap_ms
        if i > 0 and content[i - 1] in " ,(." and rng.random() < typing.word_pause_prob:
            gap += rng.uniform(*typing.word_pause_ms)
        await asyncio.sleep(gap / 1000)
        s.cancel_inflight()
        if rng.random() < typing.typo_prob:
            s.change([_pos_change(line_no, col, "q")])  # a typo...
            counter[0] += 1
            s.request(line_no, col + 1, label, counter[0])
            await asyncio.sleep(rng.lognormvariate(0, typing.gap_sigma) * typing.median_gap_ms * 2 / 1000)
            s.cancel_inflight()
            s.change([_pos_change(line_no, col, "", delete=1)])  # ...and its backspace
            counter[0] += 1
            s.request(line_no, col, label, counter[0])
            await asyncio.sleep(rng.lognormvariate(0, typing.gap_sigma) * typing.median_gap_ms / 1000)
            s.cancel_inflight()
        s.change([_pos_change(line_no, col, content[i])])
        col += 1
        i += 1
        counter[0] += 1
        s.request(line_no, col, label, counter[0])
    await asyncio.sleep(typing.line_end_pause_ms / 1000)  # the user reads the ghost text...
    waited = 0.0
    while s.inflight is not None and s.inflight[1].done is None and waited < LINE_END_WAIT_S:
        await asyncio.sleep(0.05)  # ...and waits for it: slow answers are measured, not censored
        waited += 0.05
    s.cancel_inflight()


async def run_model(
    label: str, model: Path, files: list[tuple[str, str, str]], lines_per_file: int, settings: dict,
    typing: Typing, seed: int, log_dir: Path, line_len: tuple[int, int],
) -> ModelRun:  # fmt: skip
    rng = random.Random(seed)
    client = HarnessClient()
    init = {"dgLsp": {"model": str(model), **settings}}
    run = ModelRun(label, str(model), ColdStart())
    first_lang, first_name, first_text = files[0]
    uri0 = f"file:///bench/{first_name}"
    t0 = time.perf_counter()
    await client.start_logged([], log_dir / f"server-{label.split()[0]}.log")
    try:
        caps = CLIENT_CAPABILITIES
        await asyncio.wait_for(
            client.initialize_async(
                types.InitializeParams(capabilities=caps, initialization_options=init, process_id=None)
            ), 60,
        )  # fmt: skip
        run.cold.initialize_ms = (time.perf_counter() - t0) * 1000
        client.initialized(types.InitializedParams())
        open_doc(client, uri0, first_text, first_lang)
        await asyncio.wait_for(client.loaded.wait(), 300)
        run.cold.loaded_ms = (time.perf_counter() - t0) * 1000
        s = Session(client, uri0)
        lines = first_text.split("\n")
        target = pick_lines(first_text, 1, random.Random(seed + 99), *line_len)[0]
        col = len(lines[target])
        for attempt in range(3):  # the first answer (cold); then the first non-empty one
            pending = s.request(target, col, "cold", 0, automatic=False)
            result = await asyncio.wait_for(asyncio.wrap_future(pending), 120)
            now = (time.perf_counter() - t0) * 1000
            if attempt == 0:
                run.cold.first_completion_ms = now
            if result is not None and result.items:
                run.cold.first_nonempty_ms = now
                break
        s.requests.clear()
        s.inflight = None
        client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri0))
        )
        start = time.perf_counter()
        counter = [0]
        for lang, name, text in files:
            uri = f"file:///bench/typed-{name}"
            s.uri, s.version = uri, 1
            open_doc(client, uri, text, lang)
            current = text
            for line_no in pick_lines(text, lines_per_file, rng, *line_len):
                original = text.split("\n")
                indent = original[line_no][: len(original[line_no]) - len(original[line_no].lstrip())]
                content = original[line_no].strip()
                blanked = original.copy()
                blanked[line_no] = indent
                current = "\n".join(blanked)
                s.change([types.TextDocumentContentChangeWholeDocument(text=current)])
                await asyncio.sleep(0.3)  # the user moved there and deleted the line
                await type_line(s, name, line_no, indent, content, typing, rng, counter)
            client.text_document_did_close(
                types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
            )
        await asyncio.sleep(0.2)
        run.wall_s = time.perf_counter() - start
        run.keystrokes = counter[0]
        run.requests = s.requests
        await shutdown_and_exit(client)
    finally:
        await reap(client)
    return run


def summarise(run: ModelRun, budget_ms: float) -> dict:
    answered = [r for r in run.requests if r.ms is not None]
    ms = [r.ms for r in answered]
    by_source = {src: [r.ms for r in answered if r.source == src] for src in ("model", "cache")}
    waited = [r for r in run.requests if r.ms is not None or (r.done - r.sent) * 1000 >= budget_ms]
    return {
        "requests": len(run.requests),
        "cancelled_by_client": sum(r.cancelled for r in run.requests),
        "answered": len(answered),
        "server_cancelled": sum(bool(r.error) for r in answered),
        "nonempty": sum(r.items > 0 for r in answered),
        "p50": common.percentile(ms, 50),
        "p95": common.percentile(ms, 95),
        "p99": common.percentile(ms, 99),
        "max": max(ms) if ms else float("nan"),
        # a completion-cache hit answers in a few ms without the model: a p50 over both says little about
        # the model, so each gets its own
        "answered_model": len(by_source["model"]),
        "model_p50": common.percentile(by_source["model"], 50),
        "model_p95": common.percentile(by_source["model"], 95),
        "answered_cache": len(by_source["cache"]),
        "cache_p50": common.percentile(by_source["cache"], 50),
        "within_budget": sum(m <= budget_ms for m in ms) / len(ms) if ms else float("nan"),
        "nonempty_within_budget": (
            sum(r.ms <= budget_ms and r.items > 0 for r in answered) / len(answered)
            if answered
            else float("nan")
        ),
        # Requests the user gave at least the budget (answered, or cancelled only after the budget):
        # the pauses in which a suggestion could have been shown in time.
        "waited": len(waited),
        "waited_within_budget": (
            sum(r.ms is not None and r.ms <= budget_ms for r in waited) / len(waited)
            if waited
            else float("nan")
        ),
    }


ENGINE_COLUMNS = ("completions", "cache_hits", "model_runs", "engine_p50", "engine_p95", "passes_per_token",
                  "tokens_per_completion")  # fmt: skip

_LOG_LINE = re.compile(r" (\S+) v(\d+) (?:ok|empty \(.*\)) span=\S+ (\{.*\})$")


def completion_log(log_path: Path) -> dict[tuple[str, int], dict]:
    """The completions the server ran to the end, from its log (`app.py` logs each one's engine stats,
    keyed by document and version), so each can be matched to the request that asked for it."""
    runs: dict[tuple[str, int], dict] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        m = _LOG_LINE.search(line)
        if m:
            try:
                runs[(m.group(1), int(m.group(2)))] = ast.literal_eval(m.group(3))
            except (ValueError, SyntaxError):
                continue
    return runs


def label_sources(requests: list[Request], runs: dict[tuple[str, int], dict]) -> None:
    """Mark each answered request as a model run or a completion-cache hit, from the server's log."""
    for r in requests:
        run = runs.get((r.uri, r.version))
        if r.ms is not None and run is not None:
            r.source = "cache" if run.get("cache_hit") else "model"


def engine_stats(runs: dict[tuple[str, int], dict]) -> dict:
    """Model time of the server's model runs (completion-cache hits counted apart: they take no pass),
    without the debounce, the connection or the client's cancellations."""
    model = [r for r in runs.values() if not r.get("cache_hit")]
    ms = [r["total_ms"] for r in model]
    tokens = sum(r["generated_tokens"] for r in model)
    return {
        "completions": len(runs),
        "cache_hits": len(runs) - len(model),
        "model_runs": len(model),
        "engine_p50": common.percentile(ms, 50),
        "engine_p95": common.percentile(ms, 95),
        "passes_per_token": sum(r["forward_passes"] for r in model) / tokens if tokens else float("nan"),
        "tokens_per_completion": tokens / len(model) if model else float("nan"),
    }


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def plot(runs: list[ModelRun], budget_ms: float, path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        ms = sorted(r.ms for r in run.requests if r.ms is not None)
        if ms:
            ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=f"{run.label} (n={len(ms)})")
    ax.axvline(budget_ms, color="grey", ls="--", lw=1, label=f"budget {budget_ms:.0f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("request → response (ms), requests not cancelled by the client")
    ax.set_ylabel("cumulative share")
    ax.set_title("inlineCompletion latency over LSP, replayed typing")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def real_files(smoke: bool) -> list[tuple[str, str, str]]:
    found = []
    for lang, path in REAL_FILES:
        if path.is_file():
            found.append((lang, path.name, path.read_text(encoding="utf-8", errors="replace")))
    return found[:1] if smoke else found


def main(argv: list[str] | None = None) -> int:
    defaults = Settings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random model, one short line (CI)")
    ap.add_argument("--diffusion")
    ap.add_argument("--ar")
    ap.add_argument("--lines-per-file", type=int, default=2)
    ap.add_argument("--debounce-ms", type=int, default=defaults.debounce_ms)
    ap.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    ap.add_argument("--steps", type=int, default=defaults.denoising_steps)
    ap.add_argument("--budget-ms", type=int, default=defaults.latency_budget_ms)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="another server setting")
    ap.add_argument("--logs", type=Path, help="keep the servers' logs (per-request engine stats) here")
    ap.add_argument("--out", type=Path, default=common.RESULTS)
    args = ap.parse_args(argv)
    typing = Typing()
    line_len = (20, 60)
    if args.smoke:
        args.lines_per_file = 1
        line_len = (6, 14)
        typing = Typing(line_end_pause_ms=800.0, word_pause_prob=0.0, typo_prob=0.0)
    settings = {"debounceMs": args.debounce_ms, "maxTokens": args.max_tokens,
                "denoisingSteps": args.steps, "latencyBudgetMs": args.budget_ms}  # fmt: skip
    for item in args.set:  # any other server setting, as the editor would send it
        key, _, value = item.partition("=")
        settings[key] = json.loads(value)

    with tempfile.TemporaryDirectory(prefix="dg-lsp-bench-") as tmp:
        tmp_path = Path(tmp)
        models = (
            common.tiny_models(tmp_path)[:1] if args.smoke else common.default_models(args.diffusion, args.ar)
        )
        if not models:
            print("no dg-lsp model found: train one (dg_lsp/training/README.md) or pass --diffusion/--ar")
            return 2
        files = real_files(args.smoke)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
        lines, meta = common.header("End-to-end latency over LSP (replayed typing)")
        runs, engine = [], {}
        for spec in models:
            print(f"typing session against {spec.label} ({spec.path})", flush=True)
            run = asyncio.run(run_model(spec.label, spec.path, files, args.lines_per_file, settings, typing,
                                        args.seed, args.logs or tmp_path, line_len))  # fmt: skip
            runs.append(run)
            log = completion_log((args.logs or tmp_path) / f"server-{run.label.split()[0]}.log")
            label_sources(run.requests, log)
            engine[run.label] = engine_stats(log)

    summaries = {r.label: summarise(r, args.budget_ms) for r in runs}
    rows = []
    for r in runs:
        s = summaries[r.label]
        counts = [s[k] for k in ("requests", "cancelled_by_client", "answered", "nonempty")]
        shares = [_pct(s["within_budget"]), _pct(s["nonempty_within_budget"]), s["waited"],
                  _pct(s["waited_within_budget"])]  # fmt: skip
        rows.append([r.label, r.keystrokes, *counts, s["p50"], s["p95"], s["p99"], *shares])
    split_keys = ("answered", "answered_model", "model_p50", "model_p95", "answered_cache", "cache_p50")
    split_rows = [[r.label, *(summaries[r.label][k] for k in split_keys)] for r in runs]
    cold_rows = [
        [r.label, r.cold.initialize_ms, r.cold.loaded_ms, r.cold.first_completion_ms,
         r.cold.first_nonempty_ms if r.cold.first_nonempty_ms is not None else "none in 3 tries"]
        for r in runs
    ]  # fmt: skip
    file_list = ", ".join(f"{name} ({lang}, {text.count(chr(10)):,} lines)" for lang, name, text in files)
    lines += [
        "Server settings (initializationOptions): "
        + ", ".join(f"`{k}={v}`" for k, v in settings.items())
        + "; everything else at its default. Models: "
        + "; ".join(
            f"{r.label} (`{Path(r.model).name}`, {common.model_identity(Path(r.model))})" for r in runs
        )
        + ".",
        "",
        f"Files: {file_list}; {args.lines_per_file} line(s) per file blanked and retyped. Typing: median "
        f"gap {typing.median_gap_ms:.0f} ms (log-normal, sigma {typing.gap_sigma}), a "
        f"{typing.word_pause_ms[0]:.0f}-{typing.word_pause_ms[1]:.0f} ms pause after "
        f"{100 * typing.word_pause_prob:.0f}% of words, typo + backspace on {100 * typing.typo_prob:.0f}% of "
        f"keys, {typing.line_end_pause_ms:.0f} ms pause at line end, longer while that last request is "
        f"still in flight (up to {LINE_END_WAIT_S:.0f} s, so slow answers are measured rather than cut "
        f"off); seed {args.seed}.",
        "",
        "## Cold start (ms from process spawn)",
        "",
        *common.md_table(
            [
                "model",
                "initialize answered",
                "model loaded",
                "first completion answered",
                "first non-empty completion",
            ],
            cold_rows,
        ),
        "",
        "## Typing session",
        "",
        "Every keystroke sends an automatic inlineCompletion request; the client cancels a request still "
        "in flight when the next key arrives. Percentiles are over the answered (not client-cancelled) "
        "requests, in ms, request sent → response received, debounce included. "
        f"Budget: {args.budget_ms} ms. 'waited ≥ budget' counts the requests the user gave at least the "
        "budget (answered ones, and ones cancelled only after the budget had passed): the pauses in which a "
        "suggestion could have appeared in time; the last column is the share of those answered in time.",
        "",
        *common.md_table(
            [
                "model",
                "keystrokes",
                "requests",
                "cancelled by client",
                "answered",
                "non-empty",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "answered within budget",
                "non-empty within budget",
                "waited ≥ budget",
                "of those answered in budget",
            ],
            rows,
        ),
        "",
        "The same answered requests by how the server answered them (matched to its log by document "
        "version): a model run, or the completion cache (the user typed into the suggestion already "
        "shown: no pass). The rest had no engine result (stale or superseded by the next key).",
        "",
        *common.md_table(
            [
                "model",
                "answered",
                "by a model run",
                "model run p50 ms",
                "model run p95 ms",
                "from the completion cache",
                "cache p50 ms",
            ],
            split_rows,
        ),
        "",
        "Engine time of the model runs the server finished (from its log: the model's own time, without the "
        "debounce, the connection or the requests the client cancelled first; the same typing). "
        "Completion-cache hits are counted apart and left out of the times and passes.",
        "",
        *common.md_table(
            [
                "model",
                "completions run",
                "cache hits",
                "model runs",
                "engine p50 ms",
                "engine p95 ms",
                "passes per token",
                "tokens each",
            ],
            [[label, *(e[k] for k in ENGINE_COLUMNS)] for label, e in engine.items()],
        ),
        "",
        "![latency CDF](lsp_latency.png)",
        "",
    ]
    raw = {"meta": meta, "settings": settings, "typing": asdict(typing), "summaries": summaries,
           "engine": engine, "runs": [asdict(r) for r in runs]}  # fmt: skip
    path = common.write_results(args.out, "lsp_latency", lines, raw)
    plot(runs, args.budget_ms, args.out / "lsp_latency.png")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
