"""Real diffusion coders loaded natively: their weights in transformers' built-in layers, no model-dir code.

Why: the checkpoints users bring (Dream, Dream-Coder, DiffuCoder, DreamOn, LLaDA) ship their own modelling
code, written for transformers 4.4x. Under the pinned transformers 5 that code either fails to load
(LLaDA: `all_tied_weights_keys`, `tie_weights(missing_keys=)`, `use_cache`) or, worse, loads and runs
wrong (Dream: its rotary `inv_freq` buffer is never initialised, logits off by more than 1, argmax
changed). Running it also means executing code from a download. Both families are, mathematically, a
standard decoder stack run without a causal mask, so we read their config and tensors ourselves and run
transformers' own, maintained layers:

- **Dream family** (Dream-v0 Base/Instruct 7B, Dream-Coder-v0 7B, DiffuCoder-7B, DreamOn-v0 7B; config
  `DreamModel` / model_type `Dream`): Qwen2 layers (q/k/v with bias, o without, SwiGLU MLP, RMSNorm,
  RoPE). Its tensor names are already Qwen2ForCausalLM's. Trained from an AR model, it reads token i from
  the logits at i-1 ("shifted"); the forward itself is unshifted, the engine applies the shift.
  Open-dCoder 0.5B is the same math under Qwen2.5-Coder's own config (`Qwen2ForCausalLM`); only its
  tokenizer's mask token marks it as a diffusion model (`variant_from_config`).
- **LLaDA** (LLaDA-8B Base/Instruct, LLaDA-1.5; `LLaDAModelLM` / `llada`): OLMo-style names
  (`model.transformer.blocks.N.{q,k,v}_proj, attn_out, ff_proj, up_proj, ff_out, attn_norm, ff_norm`,
  `wte`, `ln_f`, head `ff_out`) over Llama math (SwiGLU with `ff_proj` as the gate, RMSNorm, RoPE
  with Llama's half rotation). Unshifted; the mask token is 126336.

Both run bidirectionally through an explicit 4D mask (all keys allowed, less padding), which
transformers' mask builder passes through unchanged. Their forward takes `position_ids` and a KV cache,
so the masked engine's dual cache (Fast-dLLM) works for both families.

Equivalence with each family's own code is checked in `benchmarks/native_equivalence.py`
(results in `benchmarks/results/native_equivalence.md`); `tests/models/test_native.py` checks the
mapping against hand-written attention on the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it runs: detection (backend choice, doctor) must not need it
    import torch


class NativeLoadError(ValueError):
    """A checkpoint that native loading cannot run; the message names what was found and what is supported."""


@dataclass(frozen=True)
class Family:
    """What the engine needs to know about a natively loaded family."""

    name: str
    checkpoints: str
    logits_shift: bool
    """Token i is read from the logits at i-1 (models adapted from an AR checkpoint)."""
    mask_token_id: int | None
    """Used when neither tokenizer nor config names a mask token."""


FAMILIES: dict[str, Family] = {
    "dream": Family(
        "dream",
        "Dream-v0 Base/Instruct 7B, Dream-Coder-v0 7B, DiffuCoder-7B, DreamOn-v0 7B, Open-dCoder 0.5B",
        logits_shift=True,
        mask_token_id=None,
    ),
    "llada": Family("llada", "LLaDA-8B Base/Instruct, LLaDA-1.5", logits_shift=False, mask_token_id=126336),
}


def supported_text() -> str:
    """One line naming the families native loading runs, for error messages."""
    return "; ".join(f"{f.name}: {f.checkpoints}" for f in FAMILIES.values())


# --- detection ------------------------------------------------------------------------------------


def _names(config: dict) -> list[str]:
    archs = config.get("architectures") or []
    names = [str(a).lower() for a in archs if isinstance(a, str)]
    names.append(str(config.get("model_type", "")).lower())
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict):
        for value in auto_map.values():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str):
                    names.append(v.lower())
    return names


def family_from_config(config: dict, tokenizer_config: dict | None = None) -> str | None:
    """The family `config.json` declares (architectures, model_type, auto_map module names), or None.

    MoE and other LLaDA/Dream derivatives with different layers (LLaDA-MoE, LLaDA 2) are not matched: only
    the exact dense classes below are, so an unknown relative is never run through the wrong layers.
    A plain Qwen2 config is the Dream family only when the checkpoint also has a mask token (Open-dCoder,
    see `variant_from_config`): an autoregressive Qwen2 has none."""
    names = _names(config)
    if any(n in ("llada", "lladamodellm") or n.endswith("modeling_llada.lladamodellm") for n in names):
        return "llada"
    if any(n in ("dream", "dreammodel") or n.endswith("modeling_dream.dreammodel") for n in names):
        return "dream"
    if variant_from_config(config, tokenizer_config) == "open-dcoder":
        return "dream"
    return None


def _has_mask_token(config: dict, tokenizer_config: dict | None) -> bool:
    if isinstance(config.get("mask_token_id"), int):
        return True
    tok = tokenizer_config or {}
    if tok.get("mask_token"):
        return True
    added = tok.get("added_tokens_decoder")
    return isinstance(added, dict) and any(
        isinstance(v, dict) and v.get("content") == "<|mask|>" for v in added.values()
    )


def variant_from_config(config: dict, tokenizer_config: dict | None = None) -> str | None:
    """`open-dcoder` for Open-dCoder 0.5B: its config is Qwen2.5-Coder's own (`Qwen2ForCausalLM`, model_type
    `qwen2`, no auto_map; its authors load it with their Qwen2 class run with `is_causal=False` and shift
    the logits as Dream does), so only the mask token in its tokenizer tells it from the AR model."""
    archs = [str(a) for a in config.get("architectures") or []]
    qwen2 = archs == ["Qwen2ForCausalLM"] or (not archs and str(config.get("model_type")) == "qwen2")
    if qwen2 and not config.get("auto_map") and _has_mask_token(config, tokenizer_config):
        return "open-dcoder"
    return None


def tokenizer_config(model_dir: str | Path) -> dict:
    """tokenizer_config.json as a dict ({} when absent or unreadable), read within the config cap."""
    from dg_lsp.engine.infill_format import read_json

    return read_json(Path(model_dir) / "tokenizer_config.json")


def _layout_of_names(names: Iterable[str]) -> str | None:
    """Which tensor layout a set of names is: LLaDA's OLMo-style blocks, Qwen2-style layers, or neither."""
    names = set(names)
    if "model.transformer.wte.weight" in names and "model.transformer.blocks.0.q_proj.weight" in names:
        return "llada"
    if "model.embed_tokens.weight" in names and "model.layers.0.self_attn.q_proj.bias" in names:
        return "dream"
    return None


def detect_family(
    config: dict, tensor_names: Iterable[str] | None = None, tok_config: dict | None = None
) -> str | None:
    """The native family of a checkpoint, from its config and, when given, its tensor names.

    The config must declare the family; the tensor names must then have that family's layout (a
    checkpoint whose config says LLaDA but whose weights are something else is refused, not guessed)."""
    family = family_from_config(config, tok_config)
    if family is None or tensor_names is None:
        return family
    layout = _layout_of_names(tensor_names)
    if layout != family:
        found = "an unknown tensor layout" if layout is None else f"{layout}-style tensors"
        raise NativeLoadError(
            f"config.json declares the {family} family but the weights have {found}; natively supported: "
            f"{supported_text()}"
        )
    return family


def weight_files(model_dir: Path) -> dict[Path, list[str]]:
    """Safetensors file -> its tensor names: the sharded index when there is one, else every
    `*.safetensors` file's own header. Only headers are read (no weights)."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        files: dict[Path, list[str]] = {}
        for name, file in weight_map.items():
            # an index names files inside its directory; links there are followed (a hub cache snapshot
            # links every file to a blob outside it)
            rel = Path(str(file))
            if rel.is_absolute() or ".." in rel.parts:
                raise NativeLoadError(f"{index} points outside the model directory: {file!r}")
            files.setdefault(model_dir / rel, []).append(str(name))
        return files
    files = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            files[path] = list(f.keys())
    if not files:
        raise NativeLoadError(
            f"no safetensors weights in {model_dir} (native loading reads safetensors only)"
        )
    return files


def family_of(model_dir: str | Path, config: dict | None = None) -> str | None:
    """The native family of a model directory (config and tensor names), or None when the config declares
    none. Raises `NativeLoadError` when the config declares one and the weights disagree."""
    d = Path(model_dir)
    config = config if config is not None else json.loads((d / "config.json").read_text())
    if family_from_config(config, tokenizer_config(d)) is None:
        return None
    names = [n for ns in weight_files(d).values() for n in ns]
    return detect_family(config, names, tokenizer_config(d))


def remote_code_failure(exc: BaseException, config: dict, suggest: bool = True) -> str | None:
    """The one message for a checkpoint whose own code fails on the installed transformers, or None when
    `exc` does not look like that (no auto_map, or an error of another kind: missing file, out of memory).

    Code written for transformers 4.4x fails under 5 deep inside transformers (LLaDA's: AttributeError
    `all_tied_weights_keys`, TypeError `tie_weights(missing_keys=)`; Dream's: KeyError 'default' in the
    RoPE table), with a traceback that names neither the cause nor the way out."""
    import transformers

    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or not auto_map:
        return None
    if not isinstance(exc, AttributeError | KeyError | TypeError | ImportError | NotImplementedError):
        return None
    names = " ".join(_names(config))
    archs = config.get("architectures") or [config.get("model_type")]
    if not suggest:  # an autoregressive checkpoint: no diffusion family stands in for it
        hint = None
    elif "llada" in names:
        hint = "llada"
    elif any(h in names for h in ("dream", "qwen", "diffucoder", "dcoder")):
        hint = "dream"
    else:
        hint = None
    to_try = (
        f"If its weights are the {hint} family's layout ({FAMILIES[hint].checkpoints}), load them natively "
        f'with the masked setting `"nativeFamily": "{hint}"` (no code from the model directory runs).'
        if hint
        else f"dg-lsp loads these families natively, without their code: {supported_text()}."
        if suggest
        else "Use a checkpoint whose architecture transformers has built in."
    )
    modules = sorted({str(v if isinstance(v, str) else v[0]).split(".")[0] for v in auto_map.values() if v})
    return (
        f"{archs} runs its own modelling code ({', '.join(modules)}.py), which cannot run on the installed "
        f"transformers {transformers.__version__} ({type(exc).__name__}: {str(exc)[:160]}). {to_try}"
    )


# --- configs --------------------------------------------------------------------------------------


def _need(config: dict, key: str, family: str) -> Any:
    if config.get(key) is None:
        raise NativeLoadError(f"{family} config.json lacks {key!r}")
    return config[key]


def _refuse(config: dict, family: str, checks: dict[str, Any]) -> None:
    """Options these families never use in released checkpoints but the format allows: running them
    through layers that ignore them would be silently wrong, so they are refused by name."""
    bad = {k: config.get(k) for k, ok in checks.items() if k in config and config.get(k) not in ok}
    if bad:
        raise NativeLoadError(f"{family} checkpoint uses options native loading does not implement: {bad}")


def dream_config(config: dict):
    """A `Qwen2Config` with the Dream checkpoint's fields (Dream's config class is Qwen2's, renamed)."""
    from transformers import Qwen2Config

    _refuse(
        config,
        "dream",
        {
            "rope_scaling": (None,),
            "use_sliding_window": (False, None),
            "hidden_act": ("silu",),
            "use_mrope": (False,),
        },
    )
    n_layers = int(_need(config, "num_hidden_layers", "dream"))
    heads = int(_need(config, "num_attention_heads", "dream"))
    cfg = Qwen2Config(
        vocab_size=int(_need(config, "vocab_size", "dream")),
        hidden_size=int(_need(config, "hidden_size", "dream")),
        intermediate_size=int(_need(config, "intermediate_size", "dream")),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        hidden_act="silu",
        max_position_embeddings=int(config.get("max_position_embeddings") or 32768),
        rms_norm_eps=float(config.get("rms_norm_eps") or 1e-6),
        rope_theta=float(config.get("rope_theta") or 10000.0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=n_layers,
        attention_dropout=0.0,
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
    )
    cfg.mask_token_id = config.get("mask_token_id")
    return cfg


def llada_config(config: dict):
    """A `LlamaConfig` with the LLaDA checkpoint's fields (OLMo-style names: d_model, n_layers, ...)."""
    from transformers import LlamaConfig

    _refuse(
        config,
        "llada",
        {
            "block_type": ("llama",),
            "layer_norm_type": ("rms",),
            "activation_type": ("silu",),
            "rope": (True,),
            "alibi": (False,),
            "include_bias": (False,),
            "include_qkv_bias": (False,),
            "attention_layer_norm": (False,),
            "input_emb_norm": (False,),
            "scale_logits": (False,),
            "block_group_size": (1,),
            "layer_norm_with_affine": (True,),
            "bias_for_layer_norm": (False, None),
        },
    )
    d_model = int(_need(config, "d_model", "llada"))
    heads = int(_need(config, "n_heads", "llada"))
    kv = config.get("n_kv_heads")
    if config.get("multi_query_attention"):
        kv = 1
    mlp = config.get("mlp_hidden_size") or int(config.get("mlp_ratio") or 4) * d_model
    vocab = int(config.get("embedding_size") or _need(config, "vocab_size", "llada"))
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=int(mlp),
        num_hidden_layers=int(_need(config, "n_layers", "llada")),
        num_attention_heads=heads,
        num_key_value_heads=int(kv or heads),
        head_dim=d_model // heads,
        hidden_act="silu",
        max_position_embeddings=int(config.get("max_sequence_length") or 4096),
        rms_norm_eps=float(config.get("rms_norm_eps") or 1e-5),
        rope_theta=float(config.get("rope_theta") or 10000.0),
        tie_word_embeddings=bool(config.get("weight_tying", False)),
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
    )
    cfg.mask_token_id = config.get("mask_token_id") or FAMILIES["llada"].mask_token_id
    return cfg


def build_config(family: str, config: dict):
    return dream_config(config) if family == "dream" else llada_config(config)


# --- tensor names ---------------------------------------------------------------------------------

_LLADA_BLOCK = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",  # LLaDA applies the activation to ff_proj and multiplies by up_proj
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ff_norm": "post_attention_layernorm",
}
_LLADA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}


def native_name(family: str, name: str) -> str:
    """The built-in model's parameter name for a checkpoint tensor name (Dream's are Qwen2's already)."""
    if family == "dream":
        return name
    if name in _LLADA_TOP:
        return _LLADA_TOP[name]
    parts = name.split(".")
    # model.transformer.blocks.N.<module>.weight
    if len(parts) == 6 and parts[:3] == ["model", "transformer", "blocks"] and parts[4] in _LLADA_BLOCK:
        return f"model.layers.{parts[3]}.{_LLADA_BLOCK[parts[4]]}.{parts[5]}"
    raise NativeLoadError(f"unexpected LLaDA tensor {name!r} (natively supported: {supported_text()})")


# --- the bidirectional model ----------------------------------------------------------------------


def bidirectional_mask(
    batch: int,
    q: int,
    past: int,
    padding: torch.Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
    implementation: str | None,
) -> torch.Tensor:
    """(B, 1, q, past+q): every query attends to every key (cached and new), less padded keys.

    Boolean for SDPA (True = attend); additive float (0 / dtype min) for eager attention, which adds the
    mask to the scores. Never None: a None mask lets SDPA fall back to causal attention."""
    import torch

    kv = past + q
    allowed = torch.ones(batch, 1, q, kv, dtype=torch.bool, device=device)
    if padding is not None:
        allowed = allowed & padding[:, None, None, -kv:].to(device=device, dtype=torch.bool)
    if implementation in (None, "sdpa"):
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def _bidirectional(base: type) -> type:
    class Bidirectional(base):  # type: ignore[misc, valid-type]
        """The built-in causal LM run with full (bidirectional) attention, as masked diffusion LMs are."""

        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            cache=None,
            inputs_embeds=None,
            logits_to_keep=0,
            **kwargs,
        ):
            if cache is None:
                cache = kwargs.pop("past_key_values", None)
            shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:2]
            device = input_ids.device if input_ids is not None else inputs_embeds.device
            past = cache.get_seq_length() if cache is not None else 0
            if attention_mask is None or attention_mask.dim() == 2:
                attention_mask = bidirectional_mask(
                    shape[0],
                    shape[1],
                    past,
                    attention_mask,
                    device,
                    self.model.embed_tokens.weight.dtype,
                    self.config._attn_implementation,
                )
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                inputs_embeds=inputs_embeds,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )

    Bidirectional.__name__ = Bidirectional.__qualname__ = f"Bidirectional{base.__name__}"
    return Bidirectional


def model_class(family: str) -> type:
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    return _bidirectional(Qwen2ForCausalLM if family == "dream" else LlamaForCausalLM)


def load_native(model_dir: str | Path, dtype: torch.dtype | None = None, family: str | None = None):
    """Build the family's bidirectional model from the checkpoint's config and safetensors (sharded or
    not) without running any code from the directory; weights are cast to `dtype`, RoPE stays fp32."""
    import torch

    dtype = dtype or torch.float32
    d = Path(model_dir)
    raw = json.loads((d / "config.json").read_text())
    files = weight_files(d)
    names = [n for ns in files.values() for n in ns]
    tok_config = tokenizer_config(d)
    if family is not None and family not in FAMILIES:
        raise NativeLoadError(f"unknown native family {family!r}; expected one of {sorted(FAMILIES)}")
    if family is not None and _layout_of_names(names) != family:
        layout = _layout_of_names(names)
        found = "an unknown tensor layout" if layout is None else f"{layout}-style tensors"
        raise NativeLoadError(f"the {family} family was asked for but the weights in {d} have {found}")
    family = family or detect_family(raw, names, tok_config)
    if family is None:
        archs = raw.get("architectures")
        raise NativeLoadError(
            f"architectures={archs} model_type={raw.get('model_type')!r} is not a family dg-lsp loads "
            f"natively ({supported_text()}); other checkpoints run their own code with --trust-remote-code"
        )
    detect_family(raw, names, tok_config)
    cfg = build_config(family, raw)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = model_class(family)(cfg)
    state: dict[str, torch.Tensor] = {}
    from safetensors import safe_open

    for path, keys in files.items():
        with safe_open(str(path), framework="pt") as f:
            for key in keys:
                state[native_name(family, key)] = f.get_tensor(key).to(dtype)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    result = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in result.missing_keys if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise NativeLoadError(
            f"{family} checkpoint in {d} does not match its config: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # RoPE frequencies are a buffer, not a weight: computed here, in fp32 (Dream's own code under
    # transformers 5 leaves them uninitialised, a silent error this rebuild avoids)
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise NativeLoadError(f"{family}: tensors left uninitialised: {left[:5]}")
    return model.eval()


def load_tokenizer(model_dir: str | Path):
    """The checkpoint's tokenizer without any code from the directory, even where remote code is allowed
    (transformers would import the directory's `configuration_*.py` through auto_map just to read the
    config). Dream ships `DreamTokenizer` (Qwen2's byte-level BPE under another name, via auto_map): its
    `vocab.json`/`merges.txt` load in transformers' Qwen2 tokenizer. LLaDA's `tokenizer.json` loads as is."""
    from transformers import AutoTokenizer

    d = Path(model_dir)
    tok_cfg_path = d / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.exists() else {}
    if tok_cfg.get("tokenizer_class") == "DreamTokenizer":
        from transformers import Qwen2Tokenizer

        return Qwen2Tokenizer.from_pretrained(d)
    if tok_cfg.get("tokenizer_class") in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        from transformers import PreTrainedTokenizerFast  # LLaDA's; AutoTokenizer would warn on `llada`

        return PreTrainedTokenizerFast.from_pretrained(d)
    return AutoTokenizer.from_pretrained(d, trust_remote_code=False)
