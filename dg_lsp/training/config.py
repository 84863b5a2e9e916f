"""Training configuration: one JSON file per recipe in `dg_lsp/training/configs/`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class ModelConfig:
    # "gemma4": Gemma 4 layers with the mandatory MoE (DiffusionGemma and its causal twin);
    # "gemma3": dense Gemma 3 layers, run bidirectionally for the masked model, causally for its twin
    arch: str = "gemma4"
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    num_experts: int = 4
    top_k_experts: int = 2
    moe_intermediate_size: int = 256
    sliding_window: int = 512
    canvas_length: int = 32
    # masked kind: canvas lengths drawn per example (the engine buckets its canvas the same way)
    canvas_buckets: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    # repeated to num_hidden_layers; the last layer is always full attention, as in Gemma 4
    layer_pattern: list[str] = field(default_factory=lambda: ["sliding_attention", "full_attention"])


@dataclass
class DataConfig:
    corpus: str = "data/corpus"
    tokenizer: str = "data/tokenizer"
    # (prefix + suffix) token budgets, one drawn per batch so short and long contexts are both seen
    context_tokens: list[int] = field(default_factory=lambda: [64, 128, 256])
    max_suffix_fraction: float = 0.25
    # relative weights of middle kinds, drawn like real edits
    span_weights: dict[str, float] = field(
        default_factory=lambda: {
            "rest_of_line": 0.3,
            "lines": 0.25,
            "block": 0.15,
            "span": 0.25,
            "empty": 0.05,
        }
    )
    valid_samples: int = 64
    # pre-tokenized examples (dg_lsp/training/shards.py) to train from instead of drawing on the fly
    shards: str | None = None


@dataclass
class TrainConfig:
    # "diffusion" (DiffusionGemmaForBlockDiffusion), "masked" (absorbing-state, bidirectional Gemma 3)
    # or "ar" (the causal twin)
    kind: str = "diffusion"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    max_steps: int = 3000
    max_minutes: float = 0.0  # >0: the LR schedule and the run also end on wall-clock time
    ar_loss_weight: float = 0.5  # encoder AR loss next to the canvas loss (diffusion only)
    self_cond_prob: float = 0.5
    t_min: float = 1e-3
    # block kind: share of examples whose canvas is masked as left-to-right decoding leaves it (a clean
    # prefix of random length, the rest masked) instead of token by token at rate t: the states the
    # embedded model's sampler actually meets, where the guesses right of the frontier decide how many
    # tokens a pass can commit (benchmarks/commit_oracle.py)
    suffix_mask_prob: float = 0.0
    # masked kind: share of examples whose context is masked at the same rate as the canvas (plain
    # whole-sequence masked diffusion: more loss positions per pass); the rest mask only the canvas
    context_mask_prob: float = 0.5
    # masked kind: Dream/DiffuCoder-style, position i's token is read from logits at i-1, which lets the
    # model start from a causal checkpoint's next-token head (`dg-lsp train --init-from AR_RUN`)
    logits_shift: bool = False
    # masked kind with logits_shift: the first share of the schedule trains the causal twin (PSM prompts,
    # causal attention), then the run goes on as the masked model from those weights and optimizer state,
    # so the two-stage recipe (`--kind ar`, then `--init-from`) is one command with one LR schedule
    # (kind "ar", the twin, ignores it and stays causal to the end)
    causal_fraction: float = 0.0
    # export OUT/step-N at these steps (for comparisons at a matched token budget)
    snapshot_steps: list[int] = field(default_factory=list)
    eval_every: int = 200
    save_every: int = 100
    threads: int = 1
    seed: int = 0
    # a pretrained base adapted with LoRA (`dg_lsp/training/adapt.py`): kind "block" (one-block diffusion) or
    # "ar" (its causal twin); data.tokenizer then names the folder holding the base's weights and tokenizer
    base: str = ""
    lora_rank: int = 32
    lora_alpha: int = 32
    # transformers' attention kernel for the adapted base: "eager" trained the SmolLM2 block model and its
    # twin 8-15% faster than "sdpa" on this 2-core CPU (benchmarks/adapt_step.py); on a GPU sdpa is faster
    attention: str = "sdpa"
    # continued adaptation: a model directory (or its adapter.safetensors) of the same kind, base and
    # LoRA rank whose adapter this run starts from instead of zero (e.g. dg_lsp/models/embedded_smollm2),
    # so a new GPU lease adds to the training already shipped; the result is again one adapter over the
    # same base. Ignored when resuming (OUT/checkpoint.pt holds the run's own tensors)
    init_adapter: str = ""
    device: str = "cpu"

    def __post_init__(self):
        if self.causal_fraction and self.kind != "ar" and not (self.kind == "masked" and self.logits_shift):
            raise ValueError(
                "causal_fraction needs kind 'masked' with logits_shift: only shifted logits carry the "
                "causal phase's next-token head over to the masked phase"
            )
        if not 0.0 <= self.causal_fraction < 1.0:
            raise ValueError(f"causal_fraction must be in [0, 1), got {self.causal_fraction}")
        if not 0.0 <= self.suffix_mask_prob <= 1.0:
            raise ValueError(f"suffix_mask_prob must be in [0, 1], got {self.suffix_mask_prob}")

    def to_dict(self) -> dict:
        return asdict(self)


def _build(cls, raw: dict):
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    kwargs = {}
    for k, v in raw.items():
        sub = {"model": ModelConfig, "data": DataConfig}.get(k) if cls is TrainConfig else None
        kwargs[k] = _build(sub, v) if sub else v
    return cls(**kwargs)


def load_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    raw = json.loads(Path(path).read_text())
    raw.pop("_comment", None)
    raw.update(overrides or {})
    return _build(TrainConfig, raw)


def config_from_dict(raw: dict) -> TrainConfig:
    return _build(TrainConfig, dict(raw))
