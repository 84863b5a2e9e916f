"""`dg-lsp train CONFIG`: train the embedded DiffusionGemma model or its autoregressive twin.

Both kinds see the same FIM examples for the same seed and step (same sampler, same budgets), so
their token budgets match. Runs are resumable: `checkpoint.pt` holds model, optimizer, step,
elapsed time and history, and the data for step n is a pure function of (seed, n).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dg_lsp.training.batches import (
    Example,
    causal_batch,
    diffusion_batch,
    draw_budget,
    draw_canvas_length,
    masked_batch,
    to_device,
    tokenize_fim,
)
from dg_lsp.training.config import TrainConfig, config_from_dict, load_config
from dg_lsp.training.corpus import Doc, load_docs
from dg_lsp.training.models import build_model, count_parameters, export
from dg_lsp.training.objectives import causal_loss, causal_middle_loss, diffusion_loss, masked_loss
from dg_lsp.training.spans import sample_fim


@dataclass
class DocSampler:
    """Files drawn in proportion to their length, so every token is about equally likely."""

    docs: list[Doc]

    def __post_init__(self):
        self.cum = []
        total = 0
        for d in self.docs:
            total += len(d.text)
            self.cum.append(total)

    def draw(self, rng: random.Random) -> Doc:
        return self.docs[bisect.bisect_right(self.cum, rng.random() * self.cum[-1])]


def make_examples(
    cfg: TrainConfig, tokenizer, sampler: DocSampler, rng: random.Random, n: int
) -> list[Example]:
    budget, suffix_budget = draw_budget(rng, cfg.data.context_tokens, cfg.data.max_suffix_fraction)
    max_middle = cfg.model.canvas_length - 1  # at least one EOS: the engine cuts the canvas there
    out = []
    for _ in range(n):
        fim = sample_fim(sampler.draw(rng).text, rng, cfg.data.span_weights)
        out.append(tokenize_fim(tokenizer, fim, budget, suffix_budget, max_middle))
    return out


def phase_kind(cfg: TrainConfig, progress: float) -> str:
    """The kind trained at this point of the schedule: "ar" during a masked run's causal phase."""
    return "ar" if cfg.kind == "masked" and progress < cfg.causal_fraction else cfg.kind


def step_loss(cfg: TrainConfig, kind: str, model, examples: list[Example], gen: torch.Generator):
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.device.startswith("cuda"))
    with autocast:
        if kind == "diffusion":
            batch = to_device(diffusion_batch(examples, cfg.model.canvas_length), cfg.device)
            return diffusion_loss(model, batch, gen, cfg.t_min, cfg.self_cond_prob, cfg.ar_loss_weight)
        if kind == "masked":
            batch = to_device(
                _masked_batch(cfg, examples, torch.rand(len(examples), generator=gen)), cfg.device
            )
            return masked_loss(model, batch, gen, cfg.t_min, cfg.context_mask_prob, shift=cfg.logits_shift)
        return causal_loss(model, to_device(causal_batch(examples), cfg.device))


def _masked_batch(cfg: TrainConfig, examples: list[Example], r: torch.Tensor):
    lengths = [
        draw_canvas_length(len(e.middle_ids), cfg.model.canvas_buckets, float(x))
        for e, x in zip(examples, r, strict=True)
    ]
    return masked_batch(examples, lengths)


def valid_examples(cfg: TrainConfig, tokenizer, docs: list[Doc]) -> list[list[Example]]:
    """A fixed held-out set (same for both kinds), in batches of 8."""
    rng = random.Random(12345)
    sampler = DocSampler(docs)
    batches = []
    for _ in range(max(1, cfg.data.valid_samples // 8)):
        batches.append(make_examples(cfg, tokenizer, sampler, rng, 8))
    return batches


@torch.no_grad()
def evaluate(cfg: TrainConfig, kind: str, model, batches: list[list[Example]]) -> dict[str, float]:
    """Held-out loss on the canvas (diffusion and masked: t on a fixed grid, no self-conditioning) or the
    middle (AR). The second figure is the encoder AR loss, the masked model's context CE, or PSM CE."""
    model.eval()
    total, n = 0.0, 0
    ar_total = 0.0
    for i, examples in enumerate(batches):
        if kind == "diffusion":
            batch = to_device(diffusion_batch(examples, cfg.model.canvas_length), cfg.device)
            gen = torch.Generator().manual_seed(i)
            t = ((torch.arange(len(examples)) + 0.5) / len(examples)).to(cfg.device)
            losses = diffusion_loss(model, batch, gen, self_cond_prob=0.0, ar_weight=1.0, t=t)
            total += losses.canvas
            ar_total += losses.ar
        elif kind == "masked":
            gen = torch.Generator().manual_seed(i)
            batch = to_device(
                _masked_batch(cfg, examples, torch.rand(len(examples), generator=gen)), cfg.device
            )
            t = (torch.arange(len(examples)) + 0.5) / len(examples)
            total += masked_loss(model, batch, gen, context_mask_prob=0.0, t=t, shift=cfg.logits_shift).canvas
            ar_total += masked_loss(model, batch, gen, context_mask_prob=1.0, t=t, shift=cfg.logits_shift).ar
        else:
            batch = to_device(causal_batch(examples), cfg.device)
            total += causal_middle_loss(model, batch)
            ar_total += causal_loss(model, batch).ar
        n += 1
    model.train()
    return {"valid_loss": total / n, "valid_ar_loss": ar_total / n}


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def progress_of(cfg: TrainConfig, step: int, elapsed: float) -> float:
    p = step / cfg.max_steps
    if cfg.max_minutes > 0:
        p = max(p, elapsed / (cfg.max_minutes * 60))
    return p


def make_optimizer(cfg: TrainConfig, model) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _smooth(ys: list[float], k: int) -> list[float]:
    return [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]


def finish_loss_plot(fig, ax, path: Path, title: str) -> None:
    """The axes, legend and file every training loss plot shares."""
    import matplotlib.pyplot as plt

    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_history(history: list[dict], path: Path, title: str) -> None:
    """Train curves per loss term (smoothed) and the held-out losses, on one nats axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    causal = [h for h in history if h.get("phase") == "causal"]  # a masked run's causal phase
    history = [h for h in history if h.get("phase") != "causal"]
    train = [h for h in history if "loss" in h]
    k = max(1, (len(train) + len(causal)) // 60)
    if causal:
        pts = [(h["step"], h["ar"]) for h in causal if "loss" in h]
        ax.plot([p[0] for p in pts], _smooth([p[1] for p in pts], k), label="train PSM CE (causal phase)")
        pts = [(h["step"], h["valid_loss"]) for h in causal if "valid_loss" in h]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "^:", label="held-out middle+EOS CE (causal phase)")
    diffusion = bool(train) and not math.isnan(train[0].get("canvas", math.nan))
    masked = "masked" in title
    series = (
        [("canvas", "train canvas CE"), ("ar", "train context CE (whole-sequence rows)")]
        if masked
        else [("canvas", "train canvas CE"), ("ar", "train encoder AR CE")]
        if diffusion
        else [("ar", "train PSM next-token CE")]
    )
    for key, label in series:
        pts = [(h["step"], h[key]) for h in train if not math.isnan(h[key])]
        if pts:
            ax.plot([p[0] for p in pts], _smooth([p[1] for p in pts], k), label=label)
    valid = [h for h in history if "valid_loss" in h]
    if valid:
        steps = [h["step"] for h in valid]
        label = "held-out canvas CE" if diffusion else "held-out middle+EOS CE"
        ax.plot(steps, [h["valid_loss"] for h in valid], "o-", label=label)
        ar_label = (
            "held-out context CE (all masked at t)"
            if masked
            else "held-out encoder AR CE"
            if diffusion
            else "held-out PSM CE"
        )
        ax.plot(steps, [h["valid_ar_loss"] for h in valid], "s--", label=ar_label)
    finish_loss_plot(fig, ax, path, title)


def _phase_tag(cfg: TrainConfig, kind: str) -> dict:
    return {"phase": "causal"} if kind != cfg.kind else {}


def continue_as(cfg: TrainConfig, kind: str, model, opt, vocab_size: int):
    """A new model of `kind` holding `model`'s weights, and an optimizer holding `opt`'s moments: what
    `--init-from` does between two runs (the layouts match: only the attention mask and the read-out
    position differ)."""
    new = build_model(kind, cfg.model, vocab_size, cfg.logits_shift).to(cfg.device)
    new.load_state_dict(model.state_dict())
    new.train()
    new_opt = make_optimizer(cfg, new)
    new_opt.load_state_dict(opt.state_dict())
    return new, new_opt


def save_checkpoint(
    path: Path, model, opt, step: int, elapsed: float, history: list, best: float, cfg, phase: str
) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "elapsed": elapsed,
            "history": history,
            "best": best,
            "config": cfg.to_dict(),
            "phase": phase,
        },
        tmp,
    )
    tmp.replace(path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="dg-lsp train", description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="JSON config (see dg_lsp/training/configs/)")
    ap.add_argument("--out", type=Path, help="run directory (default runs/<config name>)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--max-minutes", type=float)
    kinds = ["diffusion", "masked", "ar", "block"]
    ap.add_argument("--kind", choices=kinds, help="override the config's model kind")
    ap.add_argument("--corpus", help="override data.corpus")
    ap.add_argument("--tokenizer", help="override data.tokenizer")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--device", help="cpu, cuda, cuda:1 ... (overrides the config)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--init-from",
        type=Path,
        help="start from another run's checkpoint.pt (weights, optimizer, step, clock): e.g. adapt the AR "
        "twin into a Dream-style masked model (logits_shift) that continues its data and LR schedule",
    )
    ap.add_argument("--logits-shift", action="store_true", help="masked kind: Dream-style shifted logits")
    ap.add_argument(
        "--init-adapter",
        help="a config with a base: start the LoRA adapter from this model directory's (e.g. the shipped "
        "dg_lsp/models/embedded_smollm2) instead of zero; overrides the config's init_adapter",
    )
    ap.add_argument(
        "--pretokenize",
        type=Path,
        metavar="DIR",
        help="a config with a base: draw --examples training examples into safetensors shards in DIR and "
        "exit (train from them with data.shards = DIR)",
    )
    ap.add_argument("--examples", type=int, default=100_000, help="with --pretokenize: how many")
    ap.add_argument("--shard-mb", type=float, default=60.0, help="with --pretokenize: largest shard, in MB")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import sys

    from tqdm import tqdm
    from transformers import AutoTokenizer

    args = parse_args(sys.argv[1:] if argv is None else argv)
    overrides = {
        k: v
        for k, v in {
            "max_steps": args.max_steps,
            "max_minutes": args.max_minutes,
            "kind": args.kind,
            "threads": args.threads,
            "device": args.device,
            "logits_shift": True if args.logits_shift else None,
            "init_adapter": args.init_adapter,
        }.items()
        if v is not None
    }
    out = args.out or Path("runs") / args.config.stem
    ckpt_path = out / "checkpoint.pt"
    if args.resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False, map_location="cpu")
        raw = state["config"]
        raw.update(overrides)
        cfg = config_from_dict(raw)
    else:
        state = None
        cfg = load_config(args.config, overrides)
    if args.corpus:
        cfg.data.corpus = args.corpus
    if args.tokenizer:
        cfg.data.tokenizer = args.tokenizer
    if args.pretokenize:
        if not cfg.base:
            raise SystemExit("--pretokenize: only the LoRA adaptation (a config with a base) reads shards")
        from dg_lsp.training import shards
        from dg_lsp.training.adapt import base_tokenizer

        tok = base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
        made = shards.write(cfg, tok, args.pretokenize, args.examples, int(args.shard_mb * 10**6), cfg.seed)
        n_files = len(made["files"])
        print(f"{made['examples']} examples, {made['tokens']} tokens, {n_files} shard(s): {args.pretokenize}")
        return 0
    if cfg.base:  # a pretrained base adapted with LoRA: its own loop (small trainable set, adapter export)
        from dg_lsp.training.adapt import run

        return run(cfg, out, args.resume, progress=not args.no_progress)
    torch.set_num_threads(cfg.threads)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")

    tokenizer = AutoTokenizer.from_pretrained(cfg.data.tokenizer)
    corpus = Path(cfg.data.corpus)
    sampler = DocSampler(load_docs(corpus / "train.jsonl"))
    valid = valid_examples(cfg, tokenizer, load_docs(corpus / "valid.jsonl"))

    init = None
    if state is None and args.init_from:
        init = torch.load(args.init_from / "checkpoint.pt", weights_only=False, map_location="cpu")
    source = state or init or {"step": 0, "elapsed": 0.0}
    kind = (state or {}).get("phase") or phase_kind(cfg, progress_of(cfg, source["step"], source["elapsed"]))
    torch.manual_seed(cfg.seed)
    model = build_model(kind, cfg.model, len(tokenizer), cfg.logits_shift).to(cfg.device)
    opt = make_optimizer(cfg, model)
    step, elapsed, history, best = 0, 0.0, [], float("inf")
    if init is not None:
        model.load_state_dict(init["model"])
        opt.load_state_dict(init["optimizer"])
        step, elapsed = init["step"], init["elapsed"]
        seen = next((h["tokens"] for h in reversed(init["history"]) if "tokens" in h), 0)
        history = [{"step": step, "init_from": str(args.init_from), "init_kind": init["config"]["kind"],
                    "tokens": seen}]  # fmt: skip
        print(f"initialised from {args.init_from} at step {step} ({init['config']['kind']})")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, elapsed, history, best = state["step"], state["elapsed"], state["history"], state["best"]
        print(f"resumed {out} at step {step} ({elapsed / 60:.1f} min)")
    model.train()
    n_params = count_parameters(model)
    print(f"{cfg.kind} model: {n_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}, run dir {out}")
    if kind != cfg.kind:
        print(f"causal phase until {cfg.causal_fraction:.0%} of the schedule, then {cfg.kind}")

    bar = tqdm(total=cfg.max_steps, initial=step, disable=args.no_progress, dynamic_ncols=True)
    tokens_seen = next((h["tokens"] for h in reversed(history) if "tokens" in h), 0)
    start = time.perf_counter() - elapsed
    while progress_of(cfg, step, time.perf_counter() - start) < 1.0:
        rng = random.Random(cfg.seed * 1_000_003 + step)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        examples = make_examples(cfg, tokenizer, sampler, rng, cfg.batch_size)
        tokens_seen += sum(len(e.prompt) + cfg.model.canvas_length for e in examples)
        lr = lr_at(cfg, step, progress_of(cfg, step, time.perf_counter() - start))
        for g in opt.param_groups:
            g["lr"] = lr
        losses = step_loss(cfg, kind, model, examples, gen)
        opt.zero_grad(set_to_none=True)
        losses.total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        record = {
            "step": step,
            "loss": losses.total.item(),
            "canvas": losses.canvas,
            "ar": losses.ar,
            "lr": lr,
            "gnorm": float(gnorm),
            "tokens": tokens_seen,
            "time": time.perf_counter() - start,
            **_phase_tag(cfg, kind),
        }
        history.append(record)
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.1e}")
        done = progress_of(cfg, step, time.perf_counter() - start) >= 1.0
        if step % cfg.eval_every == 0 or done:
            metrics = evaluate(cfg, kind, model, valid)
            history.append(
                {"step": step, **metrics, "time": time.perf_counter() - start, **_phase_tag(cfg, kind)}
            )
            bar.write(
                f"step {step}: held-out {metrics['valid_loss']:.4f} (ar {metrics['valid_ar_loss']:.4f})"
                + (" [causal phase]" if kind != cfg.kind else "")
            )
            if kind == cfg.kind and metrics["valid_loss"] < best:  # the causal phase's loss is not comparable
                best = metrics["valid_loss"]
                export(model, tokenizer, out / "best", dtype=torch.float32)
                (out / "best" / "metrics.json").write_text(json.dumps({"step": step, **metrics}) + "\n")
            plot_history(history, out / "loss.png", f"{cfg.kind} ({n_params / 1e6:.1f}M params)")
        if step in cfg.snapshot_steps:
            export(model, tokenizer, out / f"step-{step}", dtype=torch.float32)
        switch = not done and phase_kind(cfg, progress_of(cfg, step, time.perf_counter() - start)) != kind
        if switch:
            model, opt = continue_as(cfg, cfg.kind, model, opt, len(tokenizer))
            kind = cfg.kind
            history.append({"step": step, "phase_switch": kind, "time": time.perf_counter() - start})
            bar.write(f"step {step}: causal phase over, training goes on as the {kind} model")
        if step % cfg.save_every == 0 or done or switch:
            save_checkpoint(
                ckpt_path, model, opt, step, time.perf_counter() - start, history, best, cfg, kind
            )
    bar.close()
    (out / "history.json").write_text(json.dumps(history) + "\n")
    print(
        f"done: {step} steps, {tokens_seen} tokens, "
        f"{(time.perf_counter() - start) / 60:.1f} min, best {best:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
