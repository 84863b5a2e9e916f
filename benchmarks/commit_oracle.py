"""How far could any commit rule take a masked model's parallel decoding? An oracle bound, measured.

A commit rule (`dg_lsp/engine/commit.py`) may decide a masked position early without changing the
completion only where the model's current guess there is already the token the sampler ends up
committing. This benchmark decodes cursors with a model's shipped sampler at the user's settings,
records every step's guesses (`MaskedDiffusionEngine.step_observer`) and reports:

- forward passes per generated token, as decoded;
- the **oracle**: a decoder that commits, at every pass, the frontier and the run of masks right of it
  whose guesses are already final: the fewest passes a rule that keeps the completions could take while
  committing a prefix per pass (replayed exactly from the recorded steps for a left-to-right sampler);
- **readiness** by distance from the frontier (the leftmost mask): how often the guess one, two, three or
  more positions to its right is already final;
- what a confidence threshold would commit there (per pass) and how often that would be right.

Cursors come from the corpus's *training* files (held-out code and HumanEval-infilling stay unread), drawn
with the training span sampler and planned by `dg_lsp.pipeline.plan` as the editor plans them.

    python benchmarks/commit_oracle.py --out benchmarks/results/embedded_smollm2/commit_oracle
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common

THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)
DISTANCES = ("1", "2", "3", "4+")
CUTS = (0.8, 0.9, 0.95, 0.97)


@dataclass
class Step:
    masked: list[bool]
    """Canvas positions still masked before the step (row 0)."""
    guess: list[int]
    """The step's prediction at each position of the pass's window."""
    p1: list[float]
    """Its probability."""
    commit: list[bool]
    eligible: list[bool]
    """Positions the commit rules could choose from (a stop only at the frontier)."""
    p2: list[float] = field(default_factory=list)
    """The second-best token's probability."""
    entropy: list[float] = field(default_factory=list)
    alt: list[int] = field(default_factory=list)
    """The second-best token."""


@dataclass
class Trace:
    steps: list[Step]
    tokens: int
    """Tokens of the completion (a stop not counted)."""
    prompt: list[int] = field(default_factory=list)
    """The prompt's token ids (for the learned decider's n-gram feature)."""


# -- analysis (pure) ------------------------------------------------------------------------------


def final_tokens(trace: Trace) -> dict[int, int]:
    """Canvas position -> the token the sampler committed there (stops at the frontier included; the tail
    filled after a stop is not committed by any step and left out)."""
    out: dict[int, int] = {}
    for step in trace.steps:
        for j, c in enumerate(step.commit):
            if c and j not in out:
                out[j] = step.guess[j]
    return out


def replay(trace: Trace, take: Callable[[int, int], bool]) -> tuple[int, bool]:
    """(passes, changed) of a decoder that at each pass commits the frontier (the leftmost mask) and then
    the masks right of it, in order, while `take(step index, position)` holds. Its state after a pass (a
    committed prefix) is one the recorded decode reaches later, so its next pass sees that later step's
    guesses: replayed exactly for a sampler that commits left to right, approximately otherwise (that
    later step may hold commits further right). `changed`: some committed guess was not the final token,
    so the completion would differ (the replay then goes on as if it had been right)."""
    final = final_tokens(trace)
    steps, s, passes, changed = trace.steps, 0, 0, False
    while s < len(steps):
        passes += 1
        st = steps[s]
        if True not in st.masked:
            break
        k = st.masked.index(True) + 1
        while k < len(st.guess) and st.masked[k] and k in final and take(s, k):
            changed |= st.guess[k] != final[k]
            k += 1
        s += 1
        while s < len(steps) and True in steps[s].masked[:k]:
            s += 1
    return passes, changed


def oracle_passes(trace: Trace) -> int:
    """The replay that takes exactly the guesses already final: the fewest passes of any rule that keeps
    the completion while committing a prefix per pass."""
    final = final_tokens(trace)
    return replay(trace, lambda s, k: trace.steps[s].guess[k] == final[k])[0]


def run_rule(trace: Trace, threshold: float) -> Callable[[int, int], bool]:
    """The `run` commit rule as the replay applies it: a mask the rules may choose whose guess is at least
    `threshold` sure."""
    return lambda s, k: trace.steps[s].eligible[k] and trace.steps[s].p1[k] >= threshold


FEATURES = ("p1", "p2", "margin", "entropy", "frontier p1", "run's lowest p1", "distance", "stable",
            "echo", "second guess echoes", "prompt 3-gram")  # fmt: skip


def features(trace: Trace, s: int, k: int, grams: frozenset) -> list[float]:
    """What a decider can see about the guess at position k of step s (the frontier's run up to k-1 taken):
    its confidences, the frontier's, its distance, whether the previous pass guessed the same, whether it
    repeats its left neighbour (the echo of a weak parallel guess), and whether it completes a 3-gram of
    the prompt (code re-types the names around the cursor)."""
    st, prev = trace.steps[s], trace.steps[s - 1] if s else None
    front = st.masked.index(True)
    g = st.guess
    stable = prev is not None and k < len(prev.guess) and prev.guess[k] == g[k]
    gram = k >= 2 and (g[k - 2], g[k - 1], g[k]) in grams
    return [
        st.p1[k],
        st.p2[k],
        st.p1[k] - st.p2[k],
        st.entropy[k],
        st.p1[front],
        min(st.p1[front:k]),
        float(k - front),
        float(stable),
        float(g[k] == g[k - 1]),
        float(st.alt[k] == g[k - 1]),
        float(gram),
    ]


def _grams(trace: Trace) -> frozenset:
    p = trace.prompt
    return frozenset(tuple(p[i : i + 3]) for i in range(len(p) - 2))


@dataclass
class Decider:
    """Logistic regression on `features`: P(the guess is already final)."""

    weights: list[float]
    mean: list[float]
    std: list[float]

    def prob(self, x: list[float]) -> float:
        z = self.weights[-1] + sum(
            w * (v - m) / s for w, v, m, s in zip(self.weights[:-1], x, self.mean, self.std, strict=True)
        )
        return 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))


def fit_decider(traces: list[Trace]) -> Decider:
    """Fitted on the candidates the oracle's replay meets (the frontier's run, up to its first guess that
    is not final), labelled by whether the guess is final."""
    import torch

    xs, ys = [], []
    for trace in traces:
        final, grams = final_tokens(trace), _grams(trace)

        def take(s: int, k: int, trace=trace, final=final, grams=grams) -> bool:
            st = trace.steps[s]
            xs.append(features(trace, s, k, grams))
            ys.append(float(st.guess[k] == final[k]))
            return st.eligible[k] and st.guess[k] == final[k]

        replay(trace, take)
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = torch.cat([(x - mean) / std, torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=200)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w, y) + 1e-3 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return Decider(w.detach().tolist(), mean.tolist(), std.tolist())


def learned_rule(decider: Decider, trace: Trace, cut: float) -> Callable[[int, int], bool]:
    grams = _grams(trace)
    return lambda s, k: trace.steps[s].eligible[k] and decider.prob(features(trace, s, k, grams)) >= cut


def _rate(traces: list[Trace], rule) -> tuple[float, float]:
    """(passes per token, share of completions changed) of `rule(trace)` replayed on every trace."""
    replays = [replay(t, rule(t)) for t in traces]
    tokens = max(1, sum(t.tokens for t in traces))
    return sum(p for p, _ in replays) / tokens, sum(c for _, c in replays) / max(1, len(traces))


def _distance(d: int) -> str:
    return str(d) if d < 4 else "4+"


def readiness(traces: list[Trace]) -> dict[str, list[int]]:
    """Over every step and every mask right of the frontier that the pass recomputed and a later step
    committed: {distance: [guesses already final, all]}."""
    ready = {d: [0, 0] for d in DISTANCES}
    for trace in traces:
        final = final_tokens(trace)
        for st in trace.steps:
            if True not in st.masked:
                continue
            front = st.masked.index(True)
            for j in range(front + 1, len(st.guess)):
                if st.masked[j] and not st.commit[j] and j in final:
                    cell = ready[_distance(j - front)]
                    cell[0] += st.guess[j] == final[j]
                    cell[1] += 1
    return ready


def summarise(traces: list[Trace], left_to_right: bool = True) -> dict:
    """`left_to_right`: the sampler filled its quota left to right, so the replays are exact; otherwise
    they are left out (n/a): a replay would skip steps that committed positions further right."""
    tokens = sum(t.tokens for t in traces)
    passes = sum(len(t.steps) for t in traces)
    nan = float("nan")
    oracle = sum(oracle_passes(t) for t in traces) if left_to_right else nan
    runs = {str(t): _rate(traces, lambda tr, t=t: run_rule(tr, t)) for t in THRESHOLDS if left_to_right}
    learned = {}
    if left_to_right and len(traces) >= 20:  # fitted on every other cursor, replayed on the rest
        fit, held = traces[0::2], traces[1::2]
        decider = fit_decider(fit)
        learned = {
            "weights": dict(zip((*FEATURES, "bias"), decider.weights, strict=True)),
            "held-out cursors": len(held),
            "as decoded": (sum(len(t.steps) for t in held) / max(1, sum(t.tokens for t in held)), 0.0),
            "oracle": (sum(oracle_passes(t) for t in held) / max(1, sum(t.tokens for t in held)), 0.0),
            "run >= 0.7": _rate(held, lambda tr: run_rule(tr, 0.7)),
            **{f"learned >= {c}": _rate(held, lambda tr, c=c: learned_rule(decider, tr, c)) for c in CUTS},
        }
    return {
        "cursors": len(traces),
        "tokens": tokens,
        "passes": passes,
        "passes_per_token": passes / max(1, tokens),
        "oracle_passes": oracle,
        "oracle_passes_per_token": oracle / max(1, tokens),
        "readiness": {d: (r / n if n else nan, n) for d, (r, n) in readiness(traces).items()},
        "run": runs or {str(t): (nan, nan) for t in THRESHOLDS},
        "learned": learned,
    }


# -- decoding -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    model_dir: str
    corpus: str
    seed: int
    count: int
    max_tokens: int
    steps: int
    prompt_tokens: int


def decode(job: Job) -> tuple[str, list[dict]]:
    """`job.count` training-split cursors decoded by the model's shipped sampler, one thread."""
    import json

    import torch

    torch.set_num_threads(1)
    from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig, model_sampler_defaults
    from dg_lsp.settings import Settings
    from dg_lsp.training.config import DataConfig
    from dg_lsp.training.distill import training_cursors

    raw = json.loads((Path(job.model_dir) / "config.json").read_text())
    engine = MaskedDiffusionEngine(
        job.model_dir,
        max_prompt_tokens=job.prompt_tokens,
        sampler=MaskedSamplerConfig.from_options(
            {}, steps=job.steps, model_defaults=model_sampler_defaults(raw)
        ),
        use_continuation_cache=False,
    )
    engine.use_prompt_cache = False
    steps: list[Step] = []

    def observe(t) -> None:
        w = t.logits.shape[1]
        logp = torch.log_softmax(t.logits[0, :w], dim=-1)
        top = logp.topk(2, dim=-1)
        p = top.values.exp()
        steps.append(
            Step(
                t.masked[0].tolist(),
                t.done.pred[0, :w].tolist(),
                p[:, 0].tolist(),
                t.done.commit[0].tolist(),
                t.done.eligible[0].tolist(),
                p[:, 1].tolist(),
                (-(logp.exp() * logp).sum(dim=-1)).tolist(),
                top.indices[:, 1].tolist(),
            )
        )

    engine.step_observer = observe
    settings = Settings(
        max_tokens=job.max_tokens, denoising_steps=job.steps, seed=0, num_candidates=1, latency_budget_ms=0
    )
    cursors = training_cursors(Path(job.corpus), job.seed, DataConfig().span_weights, settings)
    out: list[dict] = []
    while len(out) < job.count:
        _, ctx, request = next(cursors)
        if not ctx.span.enabled:
            continue
        steps.clear()
        result = engine.infill(request)
        tokens = len(result.candidates[0].token_ids) if result.candidates else 0
        ids, start = engine.canvas(engine.heal(request), 1)
        out.append(asdict(Trace(list(steps), tokens, ids[:start])))
    return engine.cfg.confidence, out


def run_model(model_dir: str, args) -> tuple[list[Trace], str]:
    """The traces, and the confidence its sampler ranks the quota by (`leftmost`: left to right)."""
    per = -(-args.cursors // args.workers)
    jobs = [
        Job(
            model_dir,
            str(args.corpus),
            args.seed * 1000 + w,
            per,
            args.max_tokens,
            args.steps,
            args.prompt_tokens,
        )
        for w in range(args.workers)
    ]
    if args.workers == 1:
        parts = [decode(jobs[0])]
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            parts = list(pool.map(decode, jobs))
    traces = [
        Trace([Step(**s) for s in t["steps"]], t["tokens"], t["prompt"]) for _, part in parts for t in part
    ]
    return traces, parts[0][0]


def _run_cell(per_token: float, changed: float) -> str:
    if per_token != per_token:
        return "n/a"
    return f"{per_token:.2f} / token, {changed:.0%} changed"


def _plot(path: Path, summaries: dict[str, dict]) -> None:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(summaries)
    for i, (name, s) in enumerate(summaries.items()):
        xs = [x + i * width for x in range(len(DISTANCES))]
        a.bar(xs, [s["readiness"][d][0] for d in DISTANCES], width=width, label=name)
        bars = {
            "as decoded": s["passes_per_token"],
            "run >= 0.7 (replayed)": s["run"]["0.7"][0],
            "oracle": s["oracle_passes_per_token"],
        }
        for j, (label, value) in enumerate(bars.items()):
            b.bar(i + (j - 1) * 0.27, value, width=0.25, color=f"C{j}", label=label if i == 0 else None)
    a.set_xticks(
        [x + width * (len(summaries) - 1) / 2 for x in range(len(DISTANCES))], [f"+{d}" for d in DISTANCES]
    )
    a.set_xlabel("distance right of the frontier")
    a.set_ylabel("guesses already final")
    a.set_ylim(0, 1)
    a.legend(fontsize=7)
    b.axhline(0.4, color="grey", ls="--", lw=1, label="issue #15 target")
    b.set_xticks(
        range(len(summaries)), [n.replace(", ", ",\n").replace(" (", "\n(") for n in summaries], fontsize=6
    )
    b.set_ylabel("forward passes per token")
    b.set_ylim(0, 1.4)
    b.legend(fontsize=6, ncol=2, loc="upper center")
    fig.suptitle("Parallel-decoding headroom (training-split cursors)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", metavar="NAME=DIR", help="a masked model (repeatable)")
    ap.add_argument("--corpus", type=Path, default=common.ROOT / "data/corpus", help="holds train.jsonl")
    ap.add_argument("--cursors", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2, help="processes per model, one thread each")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--out", type=Path, default=common.RESULTS / "commit_oracle")
    args = ap.parse_args(argv)
    if not (args.corpus / "train.jsonl").exists():
        print(f"no corpus at {args.corpus}: build it first (dg_lsp/training/README.md)", file=sys.stderr)
        return 2
    specs = args.model or [f"embedded={common.ROOT / 'dg_lsp/models/embedded_smollm2'}"]
    models = dict(spec.rsplit("=", 1) for spec in specs)
    start = time.perf_counter()
    summaries = {}
    for name, path in models.items():
        traces, confidence = run_model(path, args)
        summaries[name] = {"confidence": confidence, **summarise(traces, confidence == "leftmost")}
    wall = (time.perf_counter() - start) / 60
    lines, info = common.header(
        "Parallel-decoding headroom: how many passes any commit rule could save",
        threads=1,
        extra=(
            f"{args.cursors} cursors per model from the corpus's training files, planned by "
            f"dg_lsp.pipeline at maxTokens {args.max_tokens}, denoisingSteps {args.steps}, prompt budget "
            f"{args.prompt_tokens}; each model's shipped sampler (its config's defaults), greedy; "
            f"{args.workers} processes per model; wall {wall:.1f} min."
        ),
    )
    lines += common.md_table(
        [
            "model",
            "sampler quota",
            "cursors",
            "tokens",
            "passes / token (as decoded)",
            "oracle passes / token",
        ],
        [
            [
                n,
                s["confidence"],
                s["cursors"],
                s["tokens"],
                s["passes_per_token"],
                s["oracle_passes_per_token"],
            ]
            for n, s in summaries.items()
        ],
    )
    lines += [
        "",
        "The replays (oracle, run rule) are exact for a sampler that fills its quota left to right "
        "(`confidence = leftmost`) and left out (n/a) for others.",
        "",
        "Readiness: the share of guesses already final, by distance right of the frontier (count).",
        "",
    ]
    lines += common.md_table(
        ["model", *[f"+{d}" for d in DISTANCES]],
        [
            [n, *[f"{s['readiness'][d][0]:.1%} ({s['readiness'][d][1]})" for d in DISTANCES]]
            for n, s in summaries.items()
        ],
    )
    lines += [
        "",
        "The `run` rule replayed on the same steps (the frontier, then each mask after it while its guess "
        "is at least the threshold sure and the rules may commit it): passes per token, and the share of "
        "cursors whose completion would change (a committed guess that was not final).",
        "",
    ]
    lines += common.md_table(
        ["model", *[f"run >= {t}" for t in THRESHOLDS]],
        [
            [
                n,
                *[_run_cell(*s["run"][str(t)]) for t in THRESHOLDS],
            ]
            for n, s in summaries.items()
        ],
    )
    learned = {n: s["learned"] for n, s in summaries.items() if s["learned"]}
    if learned:
        cols = ["as decoded", "run >= 0.7", *[f"learned >= {c}" for c in CUTS], "oracle"]
        lines += [
            "",
            "A learned decider (logistic regression on "
            + ", ".join(FEATURES)
            + ") in place of the threshold: fitted on every other cursor, replayed on the rest; passes per "
            "token and the share of those cursors whose completion would change.",
            "",
        ]
        lines += common.md_table(
            ["model", "held-out cursors", *cols],
            [[n, v["held-out cursors"], *[_run_cell(*v[c]) for c in cols]] for n, v in learned.items()],
        )
    lines += ["", "![headroom](commit_oracle.png)"]
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(args.out / "commit_oracle.png", summaries)
    path = common.write_results(args.out, "commit_oracle", lines, {"machine": info, "models": models,
                                                                  "summaries": summaries})  # fmt: skip
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
