"""Native loading of the Dream family and LLaDA (`dg_lsp/models/native.py`) on tiny checkpoints built here
with the real config keys and tensor names (`benchmarks/native_equivalence.write_tiny_checkpoint`).

The logits are checked against a hand-written bidirectional transformer on the same weights (so a wrong
name mapping, a causal mask or a missing bias shows), and, where the throwaway reference venv exists,
against each family's own modelling code (`benchmarks/native_equivalence.py`)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.native_equivalence import probe_ids, tiny_config, tiny_tensors, write_tiny_checkpoint
from dg_lsp.models import native

FAMILIES = ("dream", "llada")
REF_PYTHON = Path("/tmp/ref-venv/bin/python")
REF_CODE = Path("/tmp/ref-venv/refcode")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# --- a transformer written out by hand --------------------------------------------------------------


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    """Half rotation (Llama/Qwen2/LLaDA): pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def manual_logits(family: str, config: dict, tensors: dict, ids: torch.Tensor) -> torch.Tensor:
    """Every query attends to every key; token ids in, unshifted logits out. Reads the checkpoint's own
    tensor names, so it shares nothing with the native mapping."""
    if family == "dream":
        n_layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
        kv_heads, eps, theta = config["num_key_value_heads"], config["rms_norm_eps"], config["rope_theta"]
        t = {
            "emb": tensors["model.embed_tokens.weight"],
            "norm": tensors["model.norm.weight"],
            "head": tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"]),
        }

        def layer(i, k):
            names = {
                "q": "self_attn.q_proj",
                "k": "self_attn.k_proj",
                "v": "self_attn.v_proj",
                "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj",
                "up": "mlp.up_proj",
                "down": "mlp.down_proj",
                "n1": "input_layernorm",
                "n2": "post_attention_layernorm",
            }
            return tensors.get(f"model.layers.{i}.{names[k[0]]}.{k[1]}")
    else:
        n_layers, heads = config["n_layers"], config["n_heads"]
        kv_heads, eps, theta = config["n_kv_heads"], config["rms_norm_eps"], config["rope_theta"]
        t = {
            "emb": tensors["model.transformer.wte.weight"],
            "norm": tensors["model.transformer.ln_f.weight"],
            "head": tensors.get("model.transformer.ff_out.weight", tensors["model.transformer.wte.weight"]),
        }

        def layer(i, k):
            names = {
                "q": "q_proj",
                "k": "k_proj",
                "v": "v_proj",
                "o": "attn_out",
                "gate": "ff_proj",
                "up": "up_proj",
                "down": "ff_out",
                "n1": "attn_norm",
                "n2": "ff_norm",
            }
            return tensors.get(f"model.transformer.blocks.{i}.{names[k[0]]}.{k[1]}")

    def lin(x, i, name):
        w, b = layer(i, (name, "weight")), layer(i, (name, "bias"))
        return x @ w.T + (b if b is not None else 0)

    x = t["emb"][ids]
    bsz, n, hidden = x.shape
    hd = hidden // heads
    pos = torch.arange(n)
    for i in range(n_layers):
        h = _rms(x, layer(i, ("n1", "weight")), eps)
        q = lin(h, i, "q").view(bsz, n, heads, hd).transpose(1, 2)
        k = lin(h, i, "k").view(bsz, n, kv_heads, hd).transpose(1, 2)
        v = lin(h, i, "v").view(bsz, n, kv_heads, hd).transpose(1, 2)
        q, k = _rope(q, pos, theta), _rope(k, pos, theta)
        k = k.repeat_interleave(heads // kv_heads, 1)
        v = v.repeat_interleave(heads // kv_heads, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        x = x + lin(att.transpose(1, 2).reshape(bsz, n, hidden), i, "o")
        h = _rms(x, layer(i, ("n2", "weight")), eps)
        x = x + lin(torch.nn.functional.silu(lin(h, i, "gate")) * lin(h, i, "up"), i, "down")
    return _rms(x, t["norm"], eps) @ t["head"].T


# --- detection ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_family_from_real_config_keys(family):
    from dg_lsp.engine.loader import detect_backend

    config = tiny_config(family)
    assert native.family_from_config(config) == family
    assert detect_backend(config) == "masked"
    only_auto_map = {"auto_map": config["auto_map"], "architectures": [], "model_type": "x"}
    assert native.family_from_config(only_auto_map) == family
    assert (
        native.family_from_config({"architectures": ["LLaDAMoEModelLM"], "model_type": "llada_moe"}) is None
    )
    assert native.family_from_config({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}) is None


def test_tensor_names_must_match_the_declared_family():
    dream_names = tiny_tensors("dream", tiny_config("dream"))
    llada_names = tiny_tensors("llada", tiny_config("llada"))
    assert native.detect_family(tiny_config("dream"), dream_names) == "dream"
    assert native.detect_family(tiny_config("llada"), llada_names) == "llada"
    with pytest.raises(native.NativeLoadError, match="declares the llada family but the weights have dream"):
        native.detect_family(tiny_config("llada"), dream_names)
    with pytest.raises(native.NativeLoadError, match="unknown tensor layout"):
        native.detect_family(tiny_config("dream"), ["foo.weight"])


def test_unknown_architecture_names_the_native_families(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "x", "dream", shards=1)
    config = json.loads((d / "config.json").read_text())
    config.update(architectures=["SomethingElse"], model_type="other", auto_map={})
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(native.NativeLoadError) as err:
        native.load_native(d)
    text = str(err.value)
    assert "SomethingElse" in text and "Dream-Coder" in text and "LLaDA-8B" in text


def test_unsupported_options_are_refused_by_name(tmp_path):
    d = write_tiny_checkpoint(tmp_path / "x", "llada", shards=1, input_emb_norm=True)
    with pytest.raises(native.NativeLoadError, match="input_emb_norm"):
        native.load_native(d)


# --- logits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["head", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_a_hand_written_bidirectional_transformer(tmp_path, family, tie):
    d = write_tiny_checkpoint(tmp_path / family, family, seed=3, shards=2, tie=tie)
    config = json.loads((d / "config.json").read_text())
    tensors = tiny_tensors(family, config, seed=3)
    ids = probe_ids()
    model = native.load_native(d)
    assert type(model).__name__ == (
        "BidirectionalQwen2ForCausalLM" if family == "dream" else "BidirectionalLlamaForCausalLM"
    )
    with torch.no_grad():
        got = model(input_ids=ids).logits
    want = manual_logits(family, config, tensors, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # the last position sees the first: bidirectional, not causal
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 100
    with torch.no_grad():
        again = model(input_ids=changed).logits
    assert (again[:, 0] - got[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_and_single_file_load_the_same(tmp_path, family):
    ids = probe_ids()
    outs = []
    for shards in (1, 3):
        d = write_tiny_checkpoint(tmp_path / f"{family}{shards}", family, seed=5, shards=shards)
        assert (d / "model.safetensors.index.json").exists() == (shards > 1)
        with torch.no_grad():
            outs.append(native.load_native(d)(input_ids=ids).logits)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_rotary_frequencies_are_initialised_in_fp32(tmp_path, family):
    """Dream's own code leaves `inv_freq` uninitialised under transformers 5: here it is computed, fp32,
    even when the weights load as bf16."""
    d = write_tiny_checkpoint(tmp_path / family, family, shards=1)
    model = native.load_native(d, dtype=torch.bfloat16)
    config = tiny_config(family)
    theta = config["rope_theta"]
    hd = 64 // 4
    want = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    inv = model.model.rotary_emb.inv_freq
    assert inv.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(inv, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_and_positions_reproduce_the_full_pass(tmp_path, family):
    """The dual cache's pass: context KV from a full pass, then only the middle span with its positions."""
    from transformers import DynamicCache

    d = write_tiny_checkpoint(tmp_path / family, family, seed=7, shards=1)
    model = native.load_native(d)
    ids = probe_ids(batch=1)
    lo, hi = 8, 16
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        full = model(input_ids=ids, cache=cache).logits
        ctx = DynamicCache(config=model.config)
        for layer, src in zip(ctx.layers, cache.layers, strict=True):
            keys = torch.cat([src.keys[:, :, :lo], src.keys[:, :, hi:]], 2)
            values = torch.cat([src.values[:, :, :lo], src.values[:, :, hi:]], 2)
            layer.update(keys, values)
        part = model(input_ids=ids[:, lo:hi], position_ids=torch.arange(lo, hi)[None], cache=ctx).logits
    torch.testing.assert_close(part, full[:, lo:hi], rtol=1e-4, atol=1e-4)


def test_padding_masks_keys_only():
    mask = native.bidirectional_mask(
        1, 2, 1, torch.tensor([[0, 1, 1]]), torch.device("cpu"), torch.float32, "sdpa"
    )
    assert mask.shape == (1, 1, 2, 3) and mask[0, 0].tolist() == [[False, True, True]] * 2
    eager = native.bidirectional_mask(1, 2, 0, None, torch.device("cpu"), torch.float32, "eager")
    assert eager.dtype == torch.float32 and float(eager.abs().max()) == 0.0


# --- through the engine ---------------------------------------------------------------------------


def _with_tokenizer(path: Path, family: str, seed: int = 0) -> Path:
    """A tiny checkpoint with the project's tiny tokenizer (its vocabulary sizes the model)."""
    from dg_lsp.models import tokens
    from dg_lsp.models.tiny import _SAMPLE_CODE, build_tokenizer

    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    v = len(tokenizer)
    sizes = {"vocab_size": v, "mask_token_id": tokens.MASK_ID, "eos_token_id": tokens.EOS_ID}
    if family == "llada":
        sizes["embedding_size"] = v
    d = write_tiny_checkpoint(path, family, seed=seed, shards=2, **sizes)
    tokenizer.save_pretrained(d)
    return d


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_loads_natively_with_dual_cache(tmp_path, family):
    import dataclasses

    from dg_lsp.engine.loader import load_engine
    from dg_lsp.engine.types import InfillRequest
    from dg_lsp.settings import Settings

    d = _with_tokenizer(tmp_path / family, family)
    engine = load_engine(Settings(model=str(d), device="cpu", dtype="float32"))  # compared exactly below
    facts = engine.describe()
    assert engine.name == "masked" and facts["native_family"] == family
    assert facts["logits_shift"] == str(family == "dream") and facts["dual_cache"] == "True"
    assert "dual_cache_off" not in facts
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    ids, start = engine.canvas(InfillRequest(prefix, suffix), 16)
    x = torch.tensor([ids])
    with torch.inference_mode():
        full, ctx = engine._canvas_logits(x, start, 16, None, refresh=False)
        block, _ = engine._canvas_logits(x, start, 16, ctx, refresh=False)
    torch.testing.assert_close(block, full, rtol=1e-4, atol=1e-4)
    result = engine.infill(InfillRequest(prefix, suffix, max_tokens=8, steps=4))
    assert result.candidates and result.stats.forward_passes >= 1
    engine.cfg = dataclasses.replace(engine.cfg, dual_cache=False)
    assert engine.describe()["dual_cache_off"] == "masked.dualCache is false"


def test_dream_tokenizer_loads_without_its_code(tmp_path):
    """Dream ships `DreamTokenizer` through auto_map; its vocab.json/merges.txt load in Qwen2's tokenizer."""
    # byte-level BPE's byte -> printable character table (printable bytes stay, the rest shift past 255)
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    vocab = {table[b]: i for i, b in enumerate(range(256))}
    specials = ["<|endoftext|>", "<|beginoftext|>", "<|mask|>"]
    vocab.update({s: 256 + i for i, s in enumerate(specials)})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "DreamTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
                "bos_token": "<|beginoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "mask_token": "<|mask|>",
                "added_tokens_decoder": {
                    str(256 + i): {
                        "content": s,
                        "special": True,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "single_word": False,
                    }
                    for i, s in enumerate(specials)
                },
            }
        )
    )
    tok = native.load_tokenizer(tmp_path)
    assert tok.mask_token_id == 258 and tok.eos_token_id == 256
    assert tok.decode(tok.encode("def f():", add_special_tokens=False)) == "def f():"


# --- the families' own code (needs the throwaway reference venv) ----------------------------------


@pytest.mark.skipif(
    not (REF_PYTHON.exists() and (REF_CODE / "dream").is_dir() and (REF_CODE / "llada").is_dir()),
    reason="no reference venv at /tmp/ref-venv with refcode/ (see benchmarks/native_equivalence.py)",
)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_the_family_own_code(tmp_path, family):
    from benchmarks.native_equivalence import compare

    row = compare(family, str(REF_PYTHON), REF_CODE, tmp_path, seed=4, shards=2, tie=False)
    assert row["max_abs_diff"] < 1e-4 and row["argmax_agree"] == 1.0
    assert row["causal_control_diff"] > 0.1
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_code_from_the_model_directory_runs(tmp_path, family):
    """Even with remote code allowed, the families' own .py files (here: ones that fail when imported)
    are never imported: the model loads natively."""
    from dg_lsp.engine.loader import load_engine
    from dg_lsp.settings import Settings

    d = _with_tokenizer(tmp_path / family, family)
    config = json.loads((d / "config.json").read_text())
    for module in {v.split(".")[0] for v in config["auto_map"].values()}:
        (d / f"{module}.py").write_text("raise RuntimeError('model-directory code ran')\n")
    engine = load_engine(Settings(model=str(d), device="cpu", trust_remote_code=True))
    assert engine.describe()["native_family"] == family


def test_index_may_not_point_outside_but_links_are_followed(tmp_path):
    """A hub cache snapshot links each file to a blob elsewhere: fine. An index naming ../x is not."""
    d = write_tiny_checkpoint(tmp_path / "snap", "dream", seed=2, shards=2)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for f in d.glob("*.safetensors"):
        f.rename(blobs / f.name)
        f.symlink_to(blobs / f.name)
    with torch.no_grad():
        assert native.load_native(d)(input_ids=probe_ids()).logits.shape == (2, 24, 320)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../blobs/model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(native.NativeLoadError, match="outside the model directory"):
        native.load_native(d)
