"""Infill quality of the embedded diffusion model next to its autoregressive twin (and any other model).

Every model runs through dg-lsp's own engine for its backend (DiffusionGemma, masked diffusion or
autoregressive, read from its config.json) with the same prompt budget and token cap, caches off.
Metrics:

- held-out spans: exact match and edit similarity (normalised Levenshtein) on infills drawn from the
  corpus's held-out files with the training sampler (rest of line, lines, blocks, spans, empty);
- HumanEval-infilling pass@1 (one sample per task, seed 0): single-line, multi-line and
  random-span-light, each program run in a separate `python -I` process with a timeout, in a
  throwaway directory, without network (`unshare -n` when available) and with memory/CPU limits;
- plausibility: non-blank infills that keep the file parsing, brackets left as the reference leaves
  them, and the share of names taken from the surrounding code.

`--through engine` (default) scores the engine's raw first candidate for the task's exact prefix and
suffix; `--through editor` sends the same cursor through `dg_lsp.pipeline` (tree-sitter window, span
kind, post-processing, syntax check), i.e. what an editor is shown, blank when every candidate was
rejected.

`--model NAME=reference` scores a perfect model: it writes each task's reference middle, as much of it as a
request lets a model write (its token cap in the tasks tokenizer's tokens, the first line on a single-line
span). Through the editor it measures what the pipeline leaves of right answers: the ceiling over every
other column of the same run.

    python benchmarks/model_quality.py --single-every 5 --multi-every 40
    python benchmarks/model_quality.py --model masked=runs/masked-cpu/best --model dg=OLD_DIR ...
"""

from __future__ import annotations

import argparse
import builtins
import datetime as dt
import functools
import gzip
import json
import keyword
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

PARSE_ERROR_CAP = 50
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HUMANEVAL = Path(os.environ.get("DG_LSP_HUMANEVAL", ROOT.parent / "shared/benchmarks/humaneval-infilling"))
SUBSETS = {
    "single-line": "HumanEval-SingleLineInfilling.jsonl.gz",
    "multi-line": "HumanEval-MultiLineInfilling.jsonl.gz",
    "random-span-light": "HumanEval-RandomSpanInfillingLight.jsonl.gz",
}


@dataclass
class Task:
    suite: str
    task_id: str
    prefix: str
    suffix: str
    middle: str
    test: str = ""
    entry_point: str = ""
    language: str = ""
    """The grammar, where the task knows its file's (else `task_language` guesses)."""


@dataclass
class Outcome:
    suite: str
    task_id: str
    completion: str
    exact: bool
    edit_sim: float
    passed: bool | None
    ms: float
    forward_passes: int
    parses: bool | None = None
    """Non-blank and no more tree-sitter errors than the reference middle (None: not checked)."""
    context_ids: tuple[int, int] = (0, 0)
    """`context_identifiers` of the completion."""
    balanced: bool | None = None
    """Non-blank and `balanced_brackets`."""
    line_exact: bool = False
    """The line holding the cursor reads as in the reference once the completion is in (the completed
    line: what a user judges an inline completion by)."""
    generated_tokens: int = 0


@dataclass
class Summary:
    model: str
    backend: str
    parameters: str
    forward: str = ""
    suites: dict[str, dict[str, float]] = field(default_factory=dict)


SERVER_PROMPT_TOKENS = 1024
"""The prompt budget the server's engines are built with (their `max_prompt_tokens` default)."""


def engine_budget(args: argparse.Namespace) -> int:
    """The engines get the prompt a user's server gives them: with half of it (the held-out windows'
    192 tokens) every run before stop 43 scored the embedded model 3 points under what users get."""
    return args.engine_prompt_tokens or SERVER_PROMPT_TOKENS


def _budget_words(args: argparse.Namespace) -> str:
    budget = engine_budget(args)
    if budget == args.prompt_tokens:
        return f"{budget} tokens"
    if args.engine_prompt_tokens == 0:
        engines = f"the server's ({SERVER_PROMPT_TOKENS} tokens, cut to the window each model was trained on)"
    else:
        engines = f"{budget} tokens"
    return f"{engines} (held-out windows drawn at {args.prompt_tokens})"


def _first_model_dir(args) -> str:
    return (args.model or ["=dg_lsp/models/embedded_tiny"])[0].rsplit("=", 1)[-1]


def _tokenizer(model_dir: str | Path):
    """A model directory's tokenizer as the engine loads it: a packed model's without its config.json,
    whose added FIM and mask ids past the base vocabulary make transformers warn on every load, and
    without the warning about inputs longer than the model's window."""
    from transformers import AutoTokenizer

    from dg_lsp.engine.base import quiet_long_input_warning
    from dg_lsp.engine.layouts import PACKED_LAYOUTS, layout_of, load_packed_tokenizer

    config = Path(model_dir) / "config.json"
    if config.is_file() and layout_of(json.loads(config.read_text())) in PACKED_LAYOUTS:
        tokenizer = load_packed_tokenizer(Path(model_dir))
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    quiet_long_input_warning(tokenizer)  # whole files are encoded, then cut to the budget, as engines do
    return tokenizer


def held_out_tasks(corpus: Path, tokenizer_dir: Path, n: int, budget: int, canvas: int) -> list[Task]:
    """Infills from held-out files, drawn and truncated exactly like training examples (seed 777)."""
    from dg_lsp.training.batches import draw_budget, tokenize_fim
    from dg_lsp.training.config import DataConfig
    from dg_lsp.training.corpus import load_docs
    from dg_lsp.training.spans import sample_fim
    from dg_lsp.training.train import DocSampler

    tok = _tokenizer(tokenizer_dir)
    sampler = DocSampler(load_docs(corpus / "valid.jsonl"))
    rng = random.Random(777)
    weights = DataConfig().span_weights
    tasks = []
    for i in range(n):
        _, suffix_budget = draw_budget(rng, [budget], 0.25)
        ex = tokenize_fim(
            tok, sample_fim(sampler.draw(rng).text, rng, weights), budget, suffix_budget, canvas - 1
        )
        tasks.append(
            Task(
                "held-out",
                f"held-out/{i}",
                tok.decode(ex.prefix_ids),
                tok.decode(ex.suffix_ids),
                tok.decode(ex.middle_ids),
            )
        )
    return tasks


def mid_word_tasks(corpus: Path, n: int, whole_files: bool = False) -> list[Task]:
    """Cursors inside a word of held-out files, the rest of that line as the reference: where most of the
    requests typing sends land (token healing, `dg_lsp/engine/healing.py`, is for them). Seed 778.

    The document is 3,000 characters before the cursor and 1,000 after the line, or with `whole_files`
    (suite `mid-word-file`, same cursors) the whole file in its own grammar, as an editor has it: a cut
    document can start inside a string or a bracket, which the pipeline's syntax check and bracket rules
    then misread."""
    from dg_lsp.context.languages import language_for
    from dg_lsp.training.corpus import load_docs
    from dg_lsp.training.train import DocSampler

    sampler = DocSampler(load_docs(corpus / "valid.jsonl"))
    rng = random.Random(778)
    tasks: list[Task] = []
    while len(tasks) < n:
        doc = sampler.draw(rng)
        text = doc.text
        words = list(re.finditer(r"[A-Za-z_][A-Za-z0-9_]{3,}", text))
        if not words:
            continue
        word = rng.choice(words)
        cut = rng.randrange(word.start() + 1, word.end())  # at least one character typed, one left
        end = text.find("\n", cut)
        end = len(text) if end < 0 else end
        i = len(tasks)
        if whole_files:
            language = language_for(None, doc.path) or ""
            tasks.append(Task("mid-word-file", f"mid-word-file/{i}", text[:cut], text[end:], text[cut:end],
                              language=language))  # fmt: skip
            continue
        tasks.append(Task("mid-word", f"mid-word/{i}", text[max(0, cut - 3000) : cut], text[end : end + 1000],
                          text[cut:end]))  # fmt: skip
    return tasks


def humaneval_tasks(suite: str, every: int) -> list[Task]:
    rows = [json.loads(line) for line in gzip.open(HUMANEVAL / SUBSETS[suite], "rt")]
    return [
        Task(
            suite,
            r["task_id"],
            r["prompt"],
            r["suffix"],
            r["canonical_solution"],
            r["test"],
            r["entry_point"],
        )
        for r in rows[::every]
    ]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))


@functools.cache
def _can_unshare_network() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


def run_program(source: str, timeout: float = 10.0) -> bool:
    """True when `source` exits 0 within `timeout` in an isolated, network-less, throwaway process."""
    with tempfile.TemporaryDirectory(prefix="dg-he-") as tmp:
        path = Path(tmp) / "prog.py"
        path.write_text(source)
        cmd = [sys.executable, "-I", str(path)]
        if _can_unshare_network():
            cmd = ["unshare", "-n", *cmd]
        try:
            proc = subprocess.run(
                cmd,
                cwd=tmp,
                env={"PATH": "/usr/bin:/bin"},
                capture_output=True,
                timeout=timeout,
                preexec_fn=_limits,
            )
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0


def _errors(text: str, language: str) -> int:
    from dg_lsp.context.languages import parser
    from dg_lsp.context.syntax import error_nodes

    tree = parser(language).parse(text.encode("utf-8"))
    return sum(1 for _ in error_nodes(tree, limit=PARSE_ERROR_CAP))


def task_language(task: Task) -> str:
    """HumanEval is Python; a held-out window is whichever grammar parses its reference with fewer errors."""
    if task.language:
        return task.language
    if task.suite not in ("held-out", "mid-word"):
        return "python"
    reference = task.prefix + task.middle + task.suffix
    return min(("python", "javascript"), key=lambda lang: _errors(reference, lang))


def keeps_parsing(task: Task, completion: str, language: str) -> bool:
    """No more tree-sitter errors with the completion than with the reference middle.

    Held-out windows are cut out of files, so their reference may not parse on its own; comparing
    against the reference keeps the criterion the same for whole files and windows.
    """
    reference = _errors(task.prefix + task.middle + task.suffix, language)
    return _errors(task.prefix + completion + task.suffix, language) <= reference


def balanced_brackets(task: Task, completion: str, language: str) -> bool:
    """Prefix + completion + suffix leaves the same brackets open, unopened and mismatched as the reference.

    The issue's "balanced brackets", judged by dg-lsp's own string- and comment-aware scanner; like
    `keeps_parsing` it compares against the reference, since a held-out window need not balance.
    """
    from dg_lsp.context.brackets import OPENERS, PAIR, bracket_events

    def shape(text: str) -> tuple[str, str, int]:
        stack, unopened, mismatched = [], [], 0
        for _, ch in bracket_events(text, language):
            if ch in OPENERS:
                stack.append(ch)
            elif stack and stack[-1] == PAIR[ch]:
                stack.pop()
            elif stack:
                mismatched += 1
            else:
                unopened.append(ch)
        return "".join(stack), "".join(unopened), mismatched

    return shape(task.prefix + completion + task.suffix) == shape(task.prefix + task.middle + task.suffix)


PYTHON_WORDS = frozenset(keyword.kwlist) | frozenset(dir(builtins))
JS_WORDS = frozenset(
    "await break case catch class const continue default delete do else export extends false finally for "
    "function if import in instanceof let new null of return static super switch this throw true try "
    "typeof undefined var void while yield console Object Array String Number Math JSON Promise".split()
)
IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def context_identifiers(completion: str, prefix: str, suffix: str) -> tuple[int, int]:
    """(identifiers in the completion that the surrounding code already uses, all identifiers in it).

    Keywords and builtins are left out of both counts, so the share measures what the issue asks
    of an infill: names taken from the surrounding code, not invented ones or junk subwords.
    """
    words = [w for w in IDENTIFIER.findall(completion) if w not in PYTHON_WORDS and w not in JS_WORDS]
    known = set(IDENTIFIER.findall(prefix)) | set(IDENTIFIER.findall(suffix))
    return sum(w in known for w in words), len(words)


REFERENCE = "reference"


class ReferenceEngine:
    """A perfect model for `--model NAME=reference`: writes the current task's reference middle."""

    name = REFERENCE

    def __init__(self, tokenizer_dir: str):
        self.tokenizer = _tokenizer(tokenizer_dir)
        self.middle = ""

    def infill(self, request, should_cancel=None):
        from dg_lsp.engine.types import Candidate, InfillResult, InfillStats

        text = self.middle.split("\n", 1)[0] if request.single_line else self.middle
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        stopped = len(ids) <= request.max_tokens  # a perfect model ends where the reference does
        ids = ids[: request.max_tokens]
        text = self.tokenizer.decode(ids)
        return InfillResult([Candidate(text, stopped=stopped)], InfillStats(generated_tokens=len(ids)))

    def warmup(self) -> None:
        pass

    def describe(self) -> dict[str, str]:
        return {"backend": REFERENCE, "parameters": "-"}


def backend_of(model_dir: str) -> str:
    from dg_lsp.engine.loader import detect_backend

    if model_dir == REFERENCE:
        return REFERENCE
    return detect_backend(json.loads((Path(model_dir) / "config.json").read_text()))


def _load_engine(
    kind: str,
    model_dir: str,
    prompt_tokens: int,
    steps: int,
    masked: dict | None = None,
    dtype: str = "auto",
    threads: int = 1,
    quantization: str = "auto",
    tokenizer_dir: str = "",
):
    import torch

    torch.set_num_threads(threads)
    if kind == REFERENCE:
        return ReferenceEngine(tokenizer_dir)
    if kind == "masked":
        from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig, model_sampler_defaults

        defaults = model_sampler_defaults(json.loads((Path(model_dir) / "config.json").read_text()))
        engine = MaskedDiffusionEngine(
            model_dir,
            max_prompt_tokens=prompt_tokens,
            sampler=MaskedSamplerConfig.from_options(masked or {}, steps=steps, model_defaults=defaults),
            use_continuation_cache=False,
            dtype=dtype,
            quantization=quantization,
        )
        engine.use_prompt_cache = False
        return engine
    if kind == "diffusion-gemma":
        from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine
        from dg_lsp.engine.quantization import resolve_dtype

        return DiffusionGemmaEngine(
            model_dir,
            dtype=resolve_dtype(dtype, "cpu", Path(model_dir)),
            max_prompt_tokens=prompt_tokens,
            steps=steps,
            use_prompt_cache=False,
            use_continuation_cache=False,
        )
    from dg_lsp.engine.ar import AutoregressiveEngine

    return AutoregressiveEngine(
        model_dir,
        max_prompt_tokens=prompt_tokens,
        use_prompt_cache=False,
        use_continuation_cache=False,
        dtype=dtype,
        quantization=quantization,
    )


def completed_line(prefix: str, middle: str, suffix: str) -> str:
    """The line the cursor is on, after `middle` goes in at it."""
    return (prefix.rsplit("\n", 1)[-1] + middle + suffix).split("\n", 1)[0]


def _through_editor(engine, task: Task, language: str, args: dict) -> tuple[str, int, int]:
    """The completion an editor would show at the task's cursor (the middle cut out of the file)."""
    from dg_lsp import context, pipeline
    from dg_lsp.settings import Settings

    settings = Settings(
        max_tokens=args["max_tokens"],
        denoising_steps=args["steps"],
        seed=0,
        num_candidates=args.get("candidates", 1),
        latency_budget_ms=0,
        complete_comments=args.get("comments", False),
    )
    snapshot = context.as_snapshot(task.prefix + task.suffix, language)
    done = pipeline.complete(engine, snapshot, len(task.prefix), settings)
    return (done.texts[0] if done.texts else ""), done.stats.forward_passes, done.stats.generated_tokens


def _option_value(raw: str):
    """A `--masked` value: JSON (`8`, `true`, `["factor"]`), or else the bare string (`leftmost`)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def evaluate_model(kind: str, model_dir: str, tasks: list[Task], args: dict) -> tuple[Summary, list[Outcome]]:
    from rapidfuzz.distance import Levenshtein

    from dg_lsp.engine.types import InfillRequest

    engine = _load_engine(
        kind,
        model_dir,
        args.get("engine_prompt_tokens") or args["prompt_tokens"],
        args["steps"],
        args.get("masked"),
        args.get("dtype", "auto"),
        args.get("threads", 1),
        args.get("quantization", "auto"),
        args.get("tasks_tokenizer", ""),
    )
    if kind != REFERENCE:
        engine.token_healing = engine.token_healing and args.get("heal", True)
    info = engine.describe()
    outcomes = []
    for task in tasks:
        language = task_language(task)
        t0 = time.perf_counter()
        if kind == REFERENCE:
            engine.middle = task.middle
        if args.get("through") == "editor":
            text, forward_passes, generated = _through_editor(engine, task, language, args)
        else:
            result = engine.infill(
                InfillRequest(task.prefix, task.suffix, max_tokens=args["max_tokens"], seed=0)
            )
            text = result.candidates[0].text if result.candidates else ""
            forward_passes = result.stats.forward_passes
            generated = result.stats.generated_tokens
        ms = (time.perf_counter() - t0) * 1000
        passed = None
        if task.test:
            program = f"{task.prefix}{text}{task.suffix}\n\n{task.test}\n\ncheck({task.entry_point})\n"
            passed = run_program(program)
        outcomes.append(
            Outcome(
                task.suite,
                task.task_id,
                text,
                text == task.middle,
                Levenshtein.normalized_similarity(text, task.middle),
                passed,
                ms,
                forward_passes,
                bool(text.strip()) and keeps_parsing(task, text, language),
                context_identifiers(text, task.prefix, task.suffix),
                bool(text.strip()) and balanced_brackets(task, text, language),
                completed_line(task.prefix, text, task.suffix)
                == completed_line(task.prefix, task.middle, task.suffix),
                generated,
            )
        )
    summary = Summary(
        model_dir, info.get("backend", kind), info.get("parameters", "?"), str(info.get("forward", ""))
    )
    for suite in dict.fromkeys(o.suite for o in outcomes):
        rows = [o for o in outcomes if o.suite == suite]
        shown = [o for o in rows if o.completion.strip()]
        s = {
            "tasks": len(rows),
            "exact_match": sum(o.exact for o in rows) / len(rows),
            "edit_similarity": sum(o.edit_sim for o in rows) / len(rows),
            "nonempty_parsing": sum(bool(o.parses) for o in rows) / len(rows),
            "shown": len(shown) / len(rows),
            "parsing_when_shown": sum(bool(o.parses) for o in shown) / max(1, len(shown)),
            "balanced_brackets": sum(bool(o.balanced) for o in rows) / len(rows),
            "context_identifiers": sum(o.context_ids[0] for o in rows)
            / max(1, sum(o.context_ids[1] for o in rows)),
            "mean_ms": sum(o.ms for o in rows) / len(rows),
            "mean_forward_passes": sum(o.forward_passes for o in rows) / len(rows),
            "line_exact": sum(o.line_exact for o in rows) / len(rows),
            # natural stops: passes spent per token the model actually wrote (requests that wrote some)
            "passes_per_token": sum(o.forward_passes for o in rows if o.generated_tokens)
            / max(1, sum(o.generated_tokens for o in rows if o.generated_tokens)),
            "p50_ms": _quantile([o.ms for o in rows], 0.5),
            "p95_ms": _quantile([o.ms for o in rows], 0.95),
        }
        if rows[0].passed is not None:
            s["pass@1"] = sum(bool(o.passed) for o in rows) / len(rows)
        summary.suites[suite] = s
    return summary, outcomes


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def _plot(summaries: dict[str, Summary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = list(next(iter(summaries.values())).suites)
    metrics = [
        ("held-out", "edit_similarity"),
        ("held-out", "nonempty_parsing"),
        ("held-out", "balanced_brackets"),
        ("held-out", "context_identifiers"),
    ]
    per_suite = ("pass@1", "edit_similarity", "nonempty_parsing", "balanced_brackets")
    metrics += [(s, m) for s in suites if s != "held-out" for m in per_suite]
    metrics = [m for m in metrics if m[0] in suites]
    fig, ax = plt.subplots(figsize=(13, 4.8))
    width = 0.8 / len(summaries)
    for i, (name, summ) in enumerate(summaries.items()):
        vals = [summ.suites[s].get(m, 0.0) for s, m in metrics]
        ax.bar([j + i * width for j in range(len(metrics))], vals, width, label=name)
    ax.set_xticks([j + width * (len(summaries) - 1) / 2 for j in range(len(metrics))])
    ax.set_xticklabels([f"{s}: {m}" for s, m in metrics], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("score")
    ax.set_title("Infill quality, same prompts and budgets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_report(summaries: dict[str, Summary], args: argparse.Namespace, wall: float, out: Path) -> str:
    import torch
    import transformers

    lines = [
        "# Model quality"
        + (" through the editor pipeline" if args.through == "editor" else "")
        + ": the embedded diffusion model vs its AR twin",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores ({args.workers} models at a time, {args.threads} thread(s) each), "
        f"torch {torch.__version__}, transformers {transformers.__version__}; wall {wall / 60:.1f} min.",
        "",
        f"Settings: prompt budget {_budget_words(args)}, max {args.max_tokens} new tokens, "
        f"at most {args.steps} denoising steps per canvas (diffusion), greedy (AR), seed 0, caches off, "
        f"dtype setting `{args.dtype}`{', token healing off' if args.no_heal else ''}"
        f"{', completeComments on' if args.comments else ''}. "
        + (
            "Scored through the editor pipeline (`dg_lsp.pipeline`: window, span kind, post-processing, "
            f"syntax check; blank when every candidate was rejected), {args.candidates} candidate(s) "
            "per request. "
            if args.through == "editor"
            else "Scored on the engine's raw first candidate. "
        )
        + (f"Masked sampler options: `{' '.join(args.masked)}`. " if args.masked else "")
        + "".join(f"Per model (NAME:OPTION): `{m}`. " for m in args.model_masked)
        + (f"Quantization setting `{args.quantization}`. " if args.quantization != "auto" else "")
        + "".join(f"Per model quantization: `{m}`. " for m in args.model_quantization)
        + f"Subsets: held-out {args.spans} spans (drawn with the tokenizer of "
        + f"`{args.tasks_tokenizer or _first_model_dir(args)}`); "
        + (f"{args.mid_word} cursors inside a word of held-out files; " if args.mid_word else "")
        + (f"the same {args.mid_word_files} cursors in their whole files; " if args.mid_word_files else "")
        + f"HumanEval single-line every {args.single_every}th task, "
        f"multi-line every {args.multi_every}th, random-span-light every {args.light_every}th.",
        "",
        "| suite | tasks | metric | " + " | ".join(summaries) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in summaries) + " |",
    ]
    first = next(iter(summaries.values()))
    for suite, s in first.suites.items():
        for metric in ("pass@1", "line_exact", "exact_match", "edit_similarity", "nonempty_parsing",
                       "balanced_brackets", "context_identifiers", "shown", "parsing_when_shown", "p50_ms",
                       "p95_ms", "mean_forward_passes", "passes_per_token"):  # fmt: skip
            if metric not in s:
                continue
            vals = []
            for summ in summaries.values():
                v = summ.suites[suite].get(metric, float("nan"))
                plain = metric.startswith(("mean", "p50", "p95")) or metric == "passes_per_token"
                vals.append(
                    (f"{v:.2f}" if metric == "passes_per_token" else f"{v:.1f}")
                    if plain
                    else f"{100 * v:.1f}%"
                )
            lines.append(f"| {suite} | {s['tasks']} | {metric} | " + " | ".join(vals) + " |")
    lines += ["", "Models:", ""]
    for name, summ in summaries.items():
        forward = f", forward: {summ.forward}" if summ.forward else ""
        lines.append(f"- {name}: `{summ.model}` ({summ.backend}, {summ.parameters} parameters{forward})")
    lines += [
        "",
        "nonempty_parsing: share of completions that are non-blank and leave prefix + completion + suffix "
        "with no more tree-sitter errors than the reference middle does. balanced_brackets: share of "
        "completions that are non-blank and leave the file's brackets open and unopened exactly as the "
        "reference middle does (strings and comments skipped). context_identifiers: of the "
        "identifiers the completions use (keywords and builtins left out), the share that the surrounding "
        "prefix or suffix already uses: names taken from the context rather than invented or junk subwords. "
        "shown: share of non-blank completions (through the editor, blank = every candidate was rejected, "
        "so the editor shows nothing); parsing_when_shown: of those, the share that keep the file parsing.",
        "",
        "mean_ms is wall time per request on a CPU shared with other jobs: indicative only; the "
        "engine benchmarks measure speed properly.",
        "",
        "![model quality](model_quality.png)",
        "",
    ]
    text = "\n".join(lines)
    (out / "model_quality.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        action="append",
        metavar="NAME=DIR",
        help="a model to score (repeatable; backend read from DIR/config.json); "
        "default: the embedded model and dg_lsp/models/ar_twin",
    )
    ap.add_argument("--workers", type=int, default=2, help="models scored in parallel, --threads each")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per model (the threads setting)")
    ap.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    ap.add_argument("--spans", type=int, default=200)
    ap.add_argument("--comments", action="store_true", help="the completeComments setting: on")
    ap.add_argument("--single-every", type=int, default=5)
    ap.add_argument("--multi-every", type=int, default=40)
    ap.add_argument("--light-every", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument(
        "--engine-prompt-tokens",
        type=int,
        default=0,
        help=f"the engines' prompt budget; 0 (default) = the server's: {SERVER_PROMPT_TOKENS}, cut to "
        "the window the model's tokenizer says it was trained on (384 for the SmolLM2 models). Before "
        "stop 43 the engines got --prompt-tokens (the held-out windows' size): pass it to repeat those runs",
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--dtype", default="auto", help="the dtype setting: auto, float32, bfloat16, float16")
    ap.add_argument("--quantization", default="auto", help="the quantization setting: auto, none, int8")
    ap.add_argument(
        "--model-quantization",
        action="append",
        default=[],
        metavar="NAME=KIND",
        help="the quantization setting for the model named NAME alone (e.g. 'diffusion, int8=int8')",
    )
    ap.add_argument(
        "--mid-word",
        type=int,
        default=0,
        help="also score this many cursors inside a word of held-out files (the rest of the line)",
    )
    ap.add_argument(
        "--mid-word-files",
        type=int,
        default=0,
        help="the first N of those cursors with their whole file as the document (suite mid-word-file)",
    )
    ap.add_argument(
        "--no-heal",
        action="store_true",
        help="turn token healing off (dg_lsp/engine/healing.py), to measure what it does",
    )
    ap.add_argument(
        "--through",
        choices=["engine", "editor"],
        default="engine",
        help="score the engine's raw candidate, or what dg_lsp.pipeline hands an editor",
    )
    ap.add_argument(
        "--candidates",
        type=int,
        default=1,
        help="with --through editor: candidates per request (the num_candidates setting); "
        "the editor shows the best-ranked one that passes post-processing and the syntax check",
    )
    ap.add_argument(
        "--masked",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="masked sampler option, as the `masked.*` setting (e.g. blockLength=8, threshold=0.8)",
    )
    ap.add_argument(
        "--model-masked",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="a masked sampler option for the model named NAME alone, on top of --masked (e.g. "
        "'diffusion, speculative:speculate=2' next to the same DIR under another name)",
    )
    ap.add_argument(
        "--tasks-tokenizer",
        type=Path,
        help="the tokenizer that draws and truncates the held-out spans (default: the first model's); "
        "runs of models with different tokenizers score the same spans only when they name the same one",
    )
    args = ap.parse_args(argv)

    start = time.perf_counter()
    specs = args.model or [
        f"diffusion={ROOT / 'dg_lsp/models/embedded_tiny'}",
        f"AR twin={ROOT / 'dg_lsp/models/ar_twin'}",
    ]
    models = dict(spec.rsplit("=", 1) for spec in specs)
    tokenized_by = args.tasks_tokenizer or next((Path(d) for d in models.values() if d != REFERENCE), None)
    if tokenized_by is None:
        ap.error("--model NAME=reference needs --tasks-tokenizer or a real model next to it")
    args.tasks_tokenizer = tokenized_by
    tasks: list[Task] = []
    if args.spans > 0 and (args.corpus / "valid.jsonl").exists():
        drawn_by = tokenized_by
        tasks += held_out_tasks(args.corpus, drawn_by, args.spans, args.prompt_tokens, 32)
    elif args.spans > 0:
        print(f"no held-out corpus at {args.corpus}: skipping held-out spans (see dg_lsp/training/README.md)")
    if args.mid_word > 0 and (args.corpus / "valid.jsonl").exists():
        tasks += mid_word_tasks(args.corpus, args.mid_word)
    if args.mid_word_files > 0 and (args.corpus / "valid.jsonl").exists():
        tasks += mid_word_tasks(args.corpus, args.mid_word_files, whole_files=True)
    for suite, every in (
        ("single-line", args.single_every),
        ("multi-line", args.multi_every),
        ("random-span-light", args.light_every),
    ):
        if every > 0:
            tasks += humaneval_tasks(suite, every)
    opts = {
        "prompt_tokens": args.prompt_tokens,
        "engine_prompt_tokens": engine_budget(args),
        "max_tokens": args.max_tokens,
        "steps": args.steps,
        "through": args.through,
        "candidates": args.candidates,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "threads": args.threads,
        "heal": not args.no_heal,
        "comments": args.comments,
        "tasks_tokenizer": str(tokenized_by),
        "masked": {k: _option_value(v) for k, v in (o.split("=", 1) for o in args.masked)},
    }
    per_model = {name: {**opts, "masked": dict(opts["masked"])} for name in models}
    for spec in args.model_masked:
        # the longest model name the spec starts with: values may hold colons (`commit=copy:2`)
        name = max((m for m in models if spec.startswith(m + ":")), key=len, default="")
        option = spec[len(name) + 1 :]
        if not name or "=" not in option:
            ap.error(f"--model-masked {spec!r}: expected NAME:KEY=VALUE with NAME one of {sorted(models)}")
        key, value = option.split("=", 1)
        per_model[name]["masked"][key] = _option_value(value)
    for spec in args.model_quantization:
        name, _, kind = spec.rpartition("=")
        if name not in models:
            ap.error(f"--model-quantization {spec!r}: expected NAME=KIND with NAME one of {sorted(models)}")
        per_model[name]["quantization"] = kind
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = {
            name: pool.submit(evaluate_model, backend_of(d), d, tasks, per_model[name])
            for name, d in models.items()
        }
        results = {name: f.result() for name, f in futures.items()}
    summaries = {name: r[0] for name, r in results.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    raw = {
        name: {"summary": asdict(s), "outcomes": [asdict(o) for o in results[name][1]]}
        for name, s in summaries.items()
    }
    (args.out / "model_quality.json").write_text(json.dumps(raw, indent=1) + "\n")
    _plot(summaries, args.out / "model_quality.png")
    print(_write_report(summaries, args, time.perf_counter() - start, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
