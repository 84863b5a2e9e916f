"""Parallel-decoding distillation for the masked model: teach it to be sure of what it would write.

On real cursors the 5M embedded model commits about one token per pass: its confidence on a masked
position rarely reaches the 0.9 threshold while the positions before it are still masked, so only the
schedule's quota commits. dParallel (Chen et al., 2025, "certainty-forcing distillation") makes threshold
decoding parallel by fine-tuning a masked diffusion model on its own decodes: from any partly masked
state of a trace it learns to predict the trace's tokens (cross-entropy on its own output, so what it
writes hardly changes) and to predict them with low entropy where it already gets them right (so the
threshold fires earlier). The sampler is unchanged; the model's confidences move.

Three steps, one command (`python -m dg_lsp.training.distill`):

1. **Traces.** Cursors drawn from the corpus's training files with the training span sampler; each goes
   through `dg_lsp.pipeline.plan` (the editor's window, span kind and length) to the shipped engine with
   its shipped sampler, invoked (no deadline). A trace is the engine's input with the canvas as decoded:
   `[bos] prefix canvas suffix`, content then the EOS fill.
2. **Fine-tuning.** Each batch masks every trace's canvas one of three ways seen while decoding: fully
   masked (the first pass), masked from a point on (left-to-right progress) or at random; the EOS tail
   beyond the first stop stays masked and unscored, as the sampler leaves it until the frontier reaches
   the stop. Loss: CE against the trace on masked positions plus `certainty` x the entropy of the masked
   positions whose argmax already equals the trace.
3. **Export** as a model directory the masked engine loads (fp16 safetensors, the same tokenizer).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dg_lsp.engine.sampler import entropy
from dg_lsp.models import tokens
from dg_lsp.training.batches import _pad


@dataclass(frozen=True)
class Trace:
    ids: list[int]
    """The engine's input with the canvas decoded: `[bos] prefix canvas suffix`."""
    start: int
    """Index of the canvas's first position in `ids`."""
    length: int
    """Canvas length (the engine's bucket)."""
    content: int
    """Canvas tokens before the EOS fill (a single-line span's newline included)."""
    passes: int
    """Forward passes the engine took for it."""


@dataclass(frozen=True)
class TraceJob:
    model_dir: str
    corpus: str
    seed: int
    count: int
    prompt_tokens: int
    max_tokens: int
    steps: int
    span_weights: dict[str, float]


def _language(lang: str) -> str:
    return "python" if lang == "python" else "javascript"


def training_cursors(corpus: Path, seed: int, span_weights: dict[str, float], settings):
    """Endless (snapshot, ctx, request): cursors drawn from the corpus's training files with the training
    span sampler and planned by `dg_lsp.pipeline.plan` as the editor plans them (`ctx.span.enabled` may be
    false: the caller skips those). Shared by the distillation traces and benchmarks/commit_oracle.py."""
    from dg_lsp import context, pipeline
    from dg_lsp.training.corpus import load_docs
    from dg_lsp.training.spans import sample_fim
    from dg_lsp.training.train import DocSampler

    docs = DocSampler(load_docs(Path(corpus) / "train.jsonl"))
    rng = random.Random(seed)
    while True:
        doc = docs.draw(rng)
        fim = sample_fim(doc.text, rng, span_weights)
        snapshot = context.as_snapshot(fim.prefix + fim.suffix, _language(doc.lang))
        ctx, request = pipeline.plan(snapshot, len(fim.prefix), settings)
        yield snapshot, ctx, request


def trace_worker(job: TraceJob) -> list[Trace]:
    """Decode `job.count` training cursors with the shipped engine and sampler; one thread (a process per
    core is faster than two threads on one model here)."""
    torch.set_num_threads(1)
    from dg_lsp.engine import sampler
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.settings import Settings

    engine = MaskedDiffusionEngine(
        job.model_dir, max_prompt_tokens=job.prompt_tokens, use_continuation_cache=False
    )
    engine.use_prompt_cache = False
    settings = Settings(
        max_tokens=job.max_tokens, denoising_steps=job.steps, seed=0, num_candidates=1, latency_budget_ms=0
    )
    cursors = training_cursors(Path(job.corpus), job.seed, job.span_weights, settings)
    out: list[Trace] = []
    tries = 0
    while len(out) < job.count and tries < job.count * 4:
        tries += 1
        _, ctx, request = next(cursors)
        if not ctx.span.enabled:
            continue
        length = sampler.bucket(request.max_tokens, engine.cfg.buckets)
        ids, start = engine.canvas(request, length)
        result = engine.infill(request)
        got = result.candidates[0].token_ids if result.candidates else []
        stopped = len(got) < request.max_tokens
        if not got or not stopped:  # cut at max_tokens: the canvas held more than the candidate says
            continue
        canvas = list(got) + [engine.fill_id] * (length - len(got))
        ids[start : start + length] = canvas
        out.append(Trace(ids, start, length, len(got), result.stats.forward_passes))
    return out


def make_traces(job: TraceJob, workers: int) -> list[Trace]:
    per = math.ceil(job.count / workers)
    jobs = [TraceJob(**{**asdict(job), "seed": job.seed * 1000 + w, "count": per}) for w in range(workers)]
    if workers == 1:
        return trace_worker(jobs[0])
    with ProcessPoolExecutor(workers) as pool:
        return [t for part in pool.map(trace_worker, jobs) for t in part]


def save_traces(traces: list[Trace], path: Path) -> None:
    path.write_text("".join(json.dumps(asdict(t)) + "\n" for t in traces))


def load_traces(path: Path) -> list[Trace]:
    return [Trace(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class DistillBatch:
    input_ids: torch.Tensor  # (B, L) the traces with their masks applied, right-padded
    targets: torch.Tensor  # (B, L) the trace's tokens
    attention_mask: torch.Tensor  # (B, L)
    scored: torch.Tensor  # (B, L) bool: masked positions that carry loss


def hide_pattern(trace: Trace, rng: random.Random) -> list[bool]:
    """Which canvas positions are masked in this training view of `trace`: all (the first pass), all from a
    point on (left-to-right progress) or each with probability t (scattered commits). Content positions
    only ever unmask; the tail after the stop stays masked."""
    n, c = trace.length, trace.content
    r = rng.random()
    if r < 0.25:
        hide = [True] * c
    elif r < 0.6:
        k = rng.randrange(0, c)
        hide = [i >= k for i in range(c)]
    else:
        t = rng.random()
        hide = [rng.random() < t for _ in range(c)]
        if not any(hide):
            hide[rng.randrange(c)] = True
    return hide + [True] * (n - c)


def distill_batch(traces: list[Trace], rng: random.Random) -> DistillBatch:
    rows, targets, scored = [], [], []
    for tr in traces:
        hide = hide_pattern(tr, rng)
        ids = list(tr.ids)
        score = [False] * len(ids)
        for i, h in enumerate(hide):
            if h:
                ids[tr.start + i] = tokens.MASK_ID
                # scored: masked content, and the first fill position (where the span stops)
                score[tr.start + i] = i <= tr.content
        rows.append(ids)
        targets.append(list(tr.ids))
        scored.append(score)
    return DistillBatch(
        _pad(rows, tokens.PAD_ID),
        _pad(targets, tokens.PAD_ID),
        _pad([[1] * len(r) for r in rows], 0),
        _pad(scored, False).bool(),
    )


def certainty_loss(model, batch: DistillBatch, certainty: float) -> tuple[torch.Tensor, float, float]:
    """CE against the trace on the scored positions, plus `certainty` x the entropy of those the model
    already gets right (shifted logits: position i is read from the logits at i - 1). Returns (loss, CE,
    mean entropy on the right ones)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logits, targets, scored = logits[:, :-1], batch.targets[:, 1:], batch.scored[:, 1:]
    sel = logits[scored]
    tgt = targets[scored]
    ce = F.cross_entropy(sel, tgt)
    right = sel.argmax(dim=-1) == tgt
    ent = entropy(sel)
    ent_right = ent[right].mean() if right.any() else ent.sum() * 0
    return ce + certainty * ent_right, ce.item(), ent_right.item()


def train(
    model_dir: Path,
    traces: list[Trace],
    out: Path,
    minutes: float,
    batch_size: int = 16,
    lr: float = 3e-4,
    certainty: float = 0.5,
    seed: int = 0,
    threads: int = 2,
    log_every: int = 20,
    max_steps: int | None = None,
) -> dict:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dg_lsp.training.models import export

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # hold out 5% of the traces: the loss the certainty pushes on must not be the training batches'
    order = list(range(len(traces)))
    rng.shuffle(order)
    n_valid = max(8, len(traces) // 20)
    valid = [traces[i] for i in order[:n_valid]]
    train_set = [traces[i] for i in order[n_valid:]]
    history: list[dict] = []
    start = time.perf_counter()
    budget = minutes * 60
    step = 0
    bar = tqdm(total=int(budget), unit="s", desc="distill", mininterval=5)

    def evaluate() -> dict:
        model.eval()
        vr = random.Random(1)
        ce = ent = 0.0
        with torch.no_grad():
            for i in range(0, len(valid), batch_size):
                b = distill_batch(valid[i : i + batch_size], vr)
                _, c, e = certainty_loss(model, b, certainty)
                ce, ent = ce + c, ent + e
        model.train()
        k = math.ceil(len(valid) / batch_size)
        return {"valid_ce": ce / k, "valid_entropy_right": ent / k}

    history.append({"step": 0, "time": 0.0, **evaluate()})
    while time.perf_counter() - start < budget and (max_steps is None or step < max_steps):
        progress = (time.perf_counter() - start) / budget
        for g in opt.param_groups:  # short warm-up, cosine to 10%
            g["lr"] = lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        batch = distill_batch(rng.sample(train_set, min(batch_size, len(train_set))), rng)
        loss, ce, ent = certainty_loss(model, batch, certainty)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.n = min(int(time.perf_counter() - start), int(budget))
        bar.set_postfix(step=step, ce=f"{ce:.3f}", ent=f"{ent:.3f}", refresh=False)
        bar.update(0)
        if step % log_every == 0:
            now = time.perf_counter() - start
            history.append({"step": step, "time": now, "ce": ce, "entropy_right": ent})
    bar.close()
    history.append({"step": step, "time": time.perf_counter() - start, **evaluate()})
    model.eval()
    export(model, tokenizer, out)
    for name in ("generation_config.json",):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out / name)
    summary = {
        "base": str(model_dir),
        "traces": len(traces),
        "steps": step,
        "batch_size": batch_size,
        "lr": lr,
        "certainty": certainty,
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "first": history[0],
        "last": history[-1],
    }
    (out / "distill.json").write_text(json.dumps({**summary, "history": history}, indent=1) + "\n")
    plot(history, out / "loss.png")
    return summary


def plot(history: list[dict], path: Path) -> None:
    """Training CE and the entropy on right tokens per logged step, held-out values as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    logged = [h for h in history if "ce" in h]
    held = [h for h in history if "valid_ce" in h]
    steps, held_steps = [h["step"] for h in logged], [h["step"] for h in held]
    ax.plot(steps, [h["ce"] for h in logged], lw=1, label="CE on own trace (train batch)")
    ax.plot(steps, [h["entropy_right"] for h in logged], lw=1, label="entropy where right")
    ax.plot(held_steps, [h["valid_ce"] for h in held], "o", label="CE, held-out traces")
    ax.plot(held_steps, [h["valid_entropy_right"] for h in held], "s", label="entropy, held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("nats")
    ax.set_title("parallel-decoding distillation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dg_lsp.training.distill", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=Path("dg_lsp/models/embedded_tiny"))
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--out", type=Path, required=True, help="run directory: traces.jsonl, model/")
    ap.add_argument("--traces", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="the engine's prompt budget")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--minutes", type=float, default=20.0, help="fine-tuning wall-clock budget")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--certainty", type=float, default=0.5, help="weight of the entropy on right tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from dg_lsp.training.config import DataConfig

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "traces.jsonl"
    if path.exists():
        traces = load_traces(path)
        print(f"{len(traces)} traces from {path}")
    else:
        t0 = time.perf_counter()
        job = TraceJob(
            str(args.model), str(args.corpus), args.seed, args.traces, args.prompt_tokens,
            args.max_tokens, args.steps, DataConfig().span_weights,
        )  # fmt: skip
        traces = make_traces(job, args.workers)
        save_traces(traces, path)
        tokens_out = sum(t.content for t in traces)
        passes = sum(t.passes for t in traces)
        print(
            f"{len(traces)} traces in {time.perf_counter() - t0:.0f} s: {tokens_out} tokens, "
            f"{passes / max(1, tokens_out):.2f} passes per token"
        )
    summary = train(
        args.model, traces, args.out / "model", args.minutes, args.batch_size, args.lr, args.certainty,
        args.seed, args.threads,
    )  # fmt: skip
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
