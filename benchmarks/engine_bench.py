"""Engine speed: ms per denoising step, forward passes per token, tokens/s, cache and quantization effects.

Runs every backend on local checkpoints. Masked diffusion and AR: the shipped models
(`dg_lsp/models/embedded_tiny`, a Dream-style masked model, and `dg_lsp/models/ar_twin`) when present, else
random models of the DiffusionGemma's width and depth. DiffusionGemma: a random model of the architecture
embedded before the masked model (dg_lsp/training/configs/cpu-2h.json: same shapes, so the same cost per
step; outputs are noise, so early exit and EOS never trigger). Prompts come from a real file (CPython's
`_pydecimal.py`).

    python benchmarks/engine_bench.py            # writes benchmarks/results/engine_bench.{md,png}
    python benchmarks/engine_bench.py --quick    # fewer repetitions
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from dg_lsp.engine import quantization as quant
from dg_lsp.engine.ar import AutoregressiveEngine
from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine
from dg_lsp.engine.loader import EMBEDDED_TINY_DIR, detect_backend
from dg_lsp.engine.masked import MaskedDiffusionEngine
from dg_lsp.engine.types import InfillRequest

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
AR_TWIN_DIR = ROOT / "dg_lsp/models/ar_twin"
SPANS = (8, 16, 32, 64, 128)


def source_text() -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / "_pydecimal.py"
    return path.read_text()


def embedded_shaped(root: Path, text: str) -> dict[str, Path]:
    """Random models with the shipped model's shapes (dg_lsp/training/configs/cpu-2h.json): the
    DiffusionGemma, its causal twin (Gemma4ForCausalLM, as dg_lsp.training.models builds it) and a
    bidirectional masked LM of the same width/depth (Gemma3, dense MLP). One code BPE for all, trained
    on the benchmark file with the shipped vocabulary target (8,192) so prompt lengths are realistic."""
    from transformers import (
        DiffusionGemmaForBlockDiffusion,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        Gemma4ForCausalLM,
        Gemma4TextConfig,
    )

    from dg_lsp.models import tokens
    from dg_lsp.models.tiny import build_tokenizer, tiny_diffusion_gemma_config

    cfg = json.loads((ROOT / "dg_lsp/training/configs/cpu-2h.json").read_text())["model"]
    tok = build_tokenizer([text], vocab_size=8192)
    vocab = len(tok)
    n = cfg["num_hidden_layers"]
    shape = dict(
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=n,
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
    )
    moe = dict(
        global_head_dim=cfg["head_dim"],
        enable_moe_block=True,
        num_experts=cfg["num_experts"],
        top_k_experts=cfg["top_k_experts"],
        moe_intermediate_size=cfg["moe_intermediate_size"],
        sliding_window=cfg["sliding_window"],
        layer_types=["sliding_attention"] * (n - 1) + ["full_attention"],
    )
    ids = dict(pad_token_id=tokens.PAD_ID, eos_token_id=tokens.EOS_ID, bos_token_id=tokens.BOS_ID)
    models = {
        "dg": DiffusionGemmaForBlockDiffusion(
            tiny_diffusion_gemma_config(vocab, canvas_length=cfg["canvas_length"], **shape, **moe)
        ),
        "ar": Gemma4ForCausalLM(
            Gemma4TextConfig(
                vocab_size=vocab,
                vocab_size_per_layer_input=vocab,
                hidden_size_per_layer_input=0,
                final_logit_softcapping=30.0,
                max_position_embeddings=4096,
                **shape,
                **moe,
                **ids,
            )
        ),
    }
    masked_cfg = Gemma3TextConfig(
        vocab_size=vocab,
        layer_types=["full_attention"] * n,
        use_bidirectional_attention=True,
        max_position_embeddings=4096,
        **shape,
        **ids,
    )
    masked_cfg.mask_token_id = tokens.MASK_ID
    models["masked"] = Gemma3ForCausalLM(masked_cfg)
    out = {}
    torch.manual_seed(0)
    for name, model in models.items():
        out[name] = root / name
        model.eval().save_pretrained(out[name])
        tok.save_pretrained(out[name])
    return out


def with_steps(steps: int):
    return lambda r: dataclasses.replace(r, steps=steps)


def timed(engine, request):
    c0 = time.process_time()
    result = engine.infill(request)
    return result, (time.process_time() - c0) * 1000


def row(label, setting, results):
    """Median figures over repetitions: one table row."""
    if not results:
        return {"backend": label, "setting": setting}
    stats = [r.stats for r, _ in results]
    passes = statistics.median(s.forward_passes for s in stats)
    tokens = statistics.median(s.generated_tokens for s in stats)
    total = statistics.median(s.total_ms for s in stats)
    cpu = statistics.median(c for _, c in results)
    steps = [(s.total_ms - s.encode_ms) / s.forward_passes for s in stats if s.forward_passes]
    step = statistics.median(steps) if steps else float("nan")
    return {
        "backend": label,
        "setting": setting,
        "tokens": tokens,
        "passes": passes,
        "passes_per_token": passes / tokens if tokens else float("nan"),
        "tokens_per_forward": tokens / passes if passes else float("nan"),
        "ms_per_step": step,
        "total_ms": total,
        "cpu_ms": cpu,
        "tokens_per_s": 1000 * tokens / total if total else float("nan"),
        "encode_ms": statistics.median(s.encode_ms for s in stats),
        "reused": statistics.median(s.reused_prompt_tokens for s in stats),
    }


def prompt_at(text: str, offset: int, before: int = 3000, after: int = 600) -> tuple[str, str]:
    return text[max(0, offset - before) : offset], text[offset : offset + after]


def span_sweep(engine, label, text, reps, settings) -> list[dict]:
    """Each span length x sampler setting, no caches: the cold per-request cost."""
    engine.use_prompt_cache = False
    engine.use_continuation_cache = False
    out = []
    offset = text.index("def _round_half_even")
    prefix, suffix = prompt_at(text, offset)
    engine.infill(InfillRequest(prefix, suffix, max_tokens=8, steps=2))  # warm-up
    for name, apply in settings:
        for span in SPANS:
            results = []
            for rep in range(reps):
                request = apply(InfillRequest(prefix, suffix, max_tokens=span, seed=rep))
                results.append(timed(engine, request))
            out.append(row(label, f"{name}, span {span}", results) | {"span": span, "sampler": name})
            print(out[-1], flush=True)
    return out


def typing_session(engine, label, text, chars: int) -> list[dict]:
    """Type `chars` characters of a real line one by one; a request after each, prompt cache on vs off."""
    offset = text.index("def _round_half_even")
    line = text[offset : offset + chars]
    out = []
    for cache in (False, True):
        engine.reset_caches()
        engine.use_prompt_cache = cache
        engine.use_continuation_cache = False
        results = []
        for i in range(chars + 1):
            prefix, suffix = prompt_at(text, offset)
            prefix = prefix + line[:i]
            request = InfillRequest(prefix, suffix, max_tokens=16, steps=4, doc_key="doc", seed=0)
            results.append(timed(engine, request))
        out.append(row(label, f"typing {chars} chars, prompt cache {'on' if cache else 'off'}", results[1:]))
        print(out[-1], flush=True)
    engine.use_prompt_cache = True
    return out


def continuation_session(engine, label, text) -> dict:
    """Type along the shown suggestion: each keystroke is served from the continuation cache."""
    engine.reset_caches()
    engine.use_continuation_cache = True
    offset = text.index("def _round_half_even")
    prefix, suffix = prompt_at(text, offset)
    first = engine.infill(InfillRequest(prefix, suffix, max_tokens=16, steps=4, doc_key="d"))
    shown = first.best
    results = []
    for i in range(1, min(len(shown), 9)):
        results.append(timed(engine, InfillRequest(prefix + shown[:i], suffix, max_tokens=16, doc_key="d")))
    hits = sum(r.stats.cache_hit for r, _ in results)
    r = row(label, f"typing along the suggestion ({hits}/{len(results)} hits)", results)
    print(r, flush=True)
    return r


def dual_cache_agreement(engine, text: str) -> str:
    """Fraction of canvas tokens equal with and without the (approximate) dual cache, span 32, 16 steps."""
    offset = text.index("def _round_half_even")
    same = total = 0
    for k, off in enumerate(range(offset, offset + 4000, 500)):
        prefix, suffix = prompt_at(text, off)
        request = InfillRequest(prefix, suffix, max_tokens=32, steps=16, seed=k)
        outs = []
        for dual in (False, True):
            engine.cfg = dataclasses.replace(engine.cfg, dual_cache=dual, threshold=None)
            outs.append(engine.infill(request).candidates[0].token_ids)
        same += sum(a == b for a, b in zip(*outs, strict=False))
        total += max(len(outs[0]), len(outs[1]))
    result = f"{same}/{total} tokens ({100 * same / total:.1f}%) over 8 cursors"
    print("dual cache agreement:", result, flush=True)
    return result


def quantization_check(model_dir: Path, text: str, reps: int) -> list[dict]:
    """fp32 vs weight-only int8 on CPU: resident bytes, logit agreement, speed."""
    device = torch.device("cpu")
    out = []
    engines = {}
    for kind in ("none", "int8"):
        model, _ = quant.load_diffusion_gemma(model_dir, device, kind)
        engines[kind] = DiffusionGemmaEngine(
            model_dir, model=model, quantization=kind, use_continuation_cache=False
        )
    offset = text.index("def _round_half_even")
    prefix, suffix = prompt_at(text, offset)
    ref = engines["none"]
    ids = ref.prompt_ids(InfillRequest(prefix, suffix))
    canvas = torch.randint(
        0, ref.vocab_size, (1, ref.canvas_length), generator=torch.Generator().manual_seed(0)
    )
    pos = torch.arange(len(ids), len(ids) + ref.canvas_length)[None]
    logits = {}
    with torch.inference_mode():
        for kind, engine in engines.items():
            state, _ = engine.encode(ids, None)
            cache = engine._decoder_cache(state, 1)
            logits[kind] = engine.model(
                decoder_input_ids=canvas, past_key_values=cache, decoder_position_ids=pos
            ).logits
    a, b = logits["none"], logits["int8"]
    cos = float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    for kind, engine in engines.items():
        engine.use_prompt_cache = False
        results = [
            timed(engine, InfillRequest(prefix, suffix, max_tokens=32, steps=8, seed=r)) for r in range(reps)
        ]
        r = row("diffusion-gemma", f"quantization {kind}", results)
        r["bytes"] = quant.module_bytes(engine.model)
        r["cos"] = cos if kind == "int8" else 1.0
        r["top1"] = top1 if kind == "int8" else 1.0
        out.append(r)
        print(r, flush=True)
    return out


def fmt(v, digits=2):
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(rows, cols) -> list[str]:
    lines = [
        "| " + " | ".join(c for c, _ in cols) + " |",
        "|" + "|".join("---" if i < 2 else "--:" for i in range(len(cols))) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(k, "")) for _, k in cols) + " |")
    return lines


COLS = [
    ("backend", "backend"),
    ("setting", "setting"),
    ("tokens", "tokens"),
    ("forward passes", "passes"),
    ("passes/token", "passes_per_token"),
    ("ms/step", "ms_per_step"),
    ("total ms", "total_ms"),
    ("CPU ms", "cpu_ms"),
    ("tokens/s", "tokens_per_s"),
]


def plot(sweeps: list[dict], typing: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in sweeps:
        groups.setdefault((r["backend"], r["sampler"]), []).append(r)
    for (backend, sampler_name), rs in groups.items():
        spans = [r["span"] for r in rs]
        axes[0].plot(spans, [r["ms_per_step"] for r in rs], marker="o", label=f"{backend}: {sampler_name}")
        axes[1].plot(spans, [r["tokens_per_s"] for r in rs], marker="o", label=f"{backend}: {sampler_name}")
    for ax, title in ((axes[0], "ms per forward pass"), (axes[1], "tokens / s (wall)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("span length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    labels = [f"{r['backend']}\n{r['setting'].split(', ')[-1]}" for r in typing]
    axes[2].bar(range(len(typing)), [r["total_ms"] for r in typing], color="tab:blue", label="total")
    axes[2].bar(
        range(len(typing)), [r["encode_ms"] for r in typing], color="tab:orange", label="prompt encode"
    )
    axes[2].set_xticks(range(len(typing)), labels, fontsize=7)
    axes[2].set_title("per keystroke while typing (median ms)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _backend(model_dir: Path) -> str | None:
    config = model_dir / "config.json"
    return detect_backend(json.loads(config.read_text())) if config.exists() else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = 2 if args.quick else 3
    text = source_text()
    start = dt.datetime.now(dt.UTC)
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="dg-engine-bench-"))
    dirs = embedded_shaped(tmp, text)
    dg_dir, dg_label = dirs["dg"], "random model with the architecture embedded before (cpu-2h.json)"
    masked_dir, masked_label = dirs["masked"], "random bidirectional Gemma3 of the same width/depth"
    if _backend(EMBEDDED_TINY_DIR) == "masked":
        masked_dir, masked_label = EMBEDDED_TINY_DIR, "the 5M embedded-tiny model (trained, Dream-style)"
    causal_dir, ar_label = dirs["ar"], "random causal twin of the DiffusionGemma (Gemma4ForCausalLM)"
    if _backend(AR_TWIN_DIR) == "ar":
        causal_dir, ar_label = AR_TWIN_DIR, "the embedded model's AR twin (trained)"

    dg = DiffusionGemmaEngine(dg_dir)
    params = sum(p.numel() for p in dg.model.parameters()) / 1e6
    vocab = len(dg.tokenizer)
    sweeps = span_sweep(
        dg,
        "diffusion-gemma",
        text,
        reps,
        [(f"{s} steps", with_steps(s)) for s in (4, 8, 12)],
    )
    masked = MaskedDiffusionEngine(masked_dir)

    def masked_setting(threshold, dual, kind="max_prob"):
        def apply(r):
            masked.cfg = dataclasses.replace(
                masked.cfg, threshold=threshold, confidence=kind, dual_cache=dual
            )
            return dataclasses.replace(r, steps=max(1, r.max_tokens // 2))

        return apply

    sweeps += span_sweep(
        masked,
        "masked",
        text,
        reps,
        [
            ("schedule, steps = span/2, no cache", masked_setting(None, False)),
            ("schedule, steps = span/2, dual cache", masked_setting(None, True)),
            ("tau 0.9 + quota, steps = span/2, dual cache", masked_setting(0.9, True)),
        ],
    )
    agreement = dual_cache_agreement(masked, text)
    ar = AutoregressiveEngine(causal_dir)
    masked_params = sum(p.numel() for p in masked.model.parameters()) / 1e6
    ar_params = sum(p.numel() for p in ar.model.parameters()) / 1e6
    sweeps += span_sweep(ar, "ar", text, reps, [("greedy", lambda r: r)])
    masked.cfg = dataclasses.replace(masked.cfg, threshold=None, dual_cache=True)
    typing = (
        typing_session(dg, "diffusion-gemma", text, 12)
        + typing_session(masked, "masked (dual cache)", text, 12)
        + typing_session(ar, "ar", text, 12)
    )
    cont = [continuation_session(dg, "diffusion-gemma", text)]
    quant_rows = quantization_check(dg_dir, text, reps)

    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(sweeps, typing, RESULTS / "engine_bench.png")
    cmd = "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    lines = [
        "# Engine benchmark",
        "",
        f"Command: `{cmd}`",
        f"Date: {start:%Y-%m-%d %H:%M} UTC",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared; load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at start), torch {torch.__version__}, "
        f"{args.threads} torch thread(s), Python {platform.python_version()}",
        "",
        f"DiffusionGemma: {dg_label}, {params:.2f}M parameters, vocabulary {vocab:,}, "
        f"canvas {dg.canvas_length}. "
        f"Masked: {masked_label} ({masked_params:.2f}M). AR: {ar_label} ({ar_params:.2f}M). Random models "
        "share one BPE trained on the benchmark file; trained models bring their own (8,192 tokens).",
        "Prompt: ~3,000 characters of `_pydecimal.py` before the cursor and 600 after. "
        f"Figures are medians of {reps} seeds; 'ms/step' is (total - prompt encode) / forward passes; "
        "'CPU ms' is this process's CPU time (wall time includes waiting for the shared CPU). "
        "Random weights never emit EOS and are never "
        "confident, so a random model always fills the whole canvas and runs every step: these are the "
        "worst-case pass counts; a trained model stops where its span ends. Spans above the canvas take "
        "several canvases (one encoder pass each).",
        "",
        "## Span length x sampler (no caches)",
        "",
        *table(sweeps, COLS),
        "",
        "Dual cache (masked): the context KV comes from the first full pass and is not refreshed, so it is "
        f"approximate; tokens equal to the no-cache run: {agreement}. With random weights (near-flat "
        "distributions) tiny KV differences flip the argmax, so only a trained model's agreement means much "
        "(the canvas-only pass itself is exact while the context is unchanged: tests/engine/test_masked.py).",
        "",
        "## Reuse while typing (12 keystrokes, 16-token span, 4 steps)",
        "",
        "Prompt cache: DiffusionGemma reuses the causal encoder's KV of the unchanged prompt head (exact), "
        "AR its KV prefix (exact), the masked model the previous request's prefix KV in its first full pass "
        "(approximate: bidirectional). 'typing along the suggestion' is the continuation cache.",
        "",
        *table(
            typing + cont,
            [
                *COLS[:2],
                ("prompt tokens reused", "reused"),
                ("encode ms", "encode_ms"),
                *COLS[3:4],
                *COLS[6:8],
            ],
        ),
        "",
        "## Quantization (CPU, weight-only int8 incl. MoE expert banks; 32-token span, 8 steps)",
        "",
        *table(
            quant_rows,
            [
                ("setting", "setting"),
                ("resident bytes", "bytes"),
                ("logit cosine vs fp32", "cos"),
                ("top-1 agreement", "top1"),
                ("ms/step", "ms_per_step"),
                ("total ms", "total_ms"),
            ],
        ),
        "",
        "Resident bytes count unique parameters and buffers (tied encoder/decoder weights once); the "
        "embedding/LM head stays in fp32, so the saving grows with model size. Logit agreement on random "
        "weights is a pessimistic proxy (near-flat logits). bitsandbytes NF4/8-bit (CUDA) is not measured "
        "here: no GPU on this machine.",
        "",
        "![engine benchmark](engine_bench.png)",
        "",
    ]
    (RESULTS / "engine_bench.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
