"""Each family's infill format, stop tokens and variable-length canvas, through the masked engine, on tiny
checkpoints in the families' real layouts (`benchmarks/native_equivalence.tiny_config/tiny_tensors`).

The decoding tests use "bigram" checkpoints: the real tensor layout with every attention output and MLP
output projection zeroed, so each position's hidden state is its own token's embedding. A shifted model
(Dream family) then predicts token i from token i-1 alone, an unshifted one (LLaDA) predicts every mask
the same way; the embeddings and output head below set those predictions. What is decoded is then known
in advance, and the tests check what the engine does with it: grow and shrink the canvas, stop the span.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.native_equivalence import tiny_config, tiny_tensors
from dg_lsp.engine import sampler
from dg_lsp.models import native

VOCAB = ["<|endoftext|>", "<|beginoftext|>", "<|mask|>", "<|expand|>", "<|delete|>", "<|im_end|>"]
VOCAB += ["<|eot_id|>", "<unk>", "a", "b", "x", "=", "(", ")", "def", "f", ":", "return"]
ID = {t: i for i, t in enumerate(VOCAB)}
MODEL_VOCAB = 32  # rows of the embedding and head (more than the tokenizer has, as real checkpoints do)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def write_tokenizer(d: Path, specials: dict[str, str], chat_template: str | None = None) -> None:
    """A word-level tokenizer over VOCAB, saved as transformers does (tokenizer.json + tokenizer_config)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra = [t for t in VOCAB if t.startswith("<|") and t not in specials.values()]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **specials)
    fast.add_special_tokens({"additional_special_tokens": extra})
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(d)


def bigram_checkpoint(
    d: Path,
    family: str,
    after: dict[str, list[str]],
    config_overrides: dict | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """A tiny checkpoint of `family` whose prediction after token class k is `after[k]` (best first).

    Classes: "mask" (the mask token), a token of VOCAB by name, or "other" (every other token)."""
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    config = {**tiny_config(family, vocab=MODEL_VOCAB), **(config_overrides or {})}
    for key in drop:
        config.pop(key, None)
    tensors = tiny_tensors(family, config, seed=0)
    classes = ["other", "mask", *sorted(k for k in after if k not in ("other", "mask"))]
    dim = {c: i for i, c in enumerate(classes)}
    emb = torch.zeros(MODEL_VOCAB, 64)
    for t in range(MODEL_VOCAB):
        name = "mask" if t == ID["<|mask|>"] else (VOCAB[t] if t < len(VOCAB) else "other")
        emb[t, dim.get(name, dim["other"])] = 1.0
    head = torch.zeros(MODEL_VOCAB, 64)
    for cls, best in after.items():
        for rank, token in enumerate(best):
            head[ID[token], dim[cls]] = 3.0 - rank  # logits 24, 16, ... after the RMSNorm's x8
    for name in list(tensors):
        t = tensors[name]
        if name.endswith(("o_proj.weight", "down_proj.weight", "attn_out.weight")) or (
            ".blocks." in name and name.endswith("ff_out.weight")
        ):
            tensors[name] = torch.zeros_like(t)  # the layers add nothing to the residual stream
        elif name.endswith(("model.norm.weight", "ln_f.weight")):
            tensors[name] = torch.ones_like(t)
    if family == "dream":
        tensors["model.embed_tokens.weight"], tensors["lm_head.weight"] = emb, head
    else:
        tensors["model.transformer.wte.weight"], tensors["model.transformer.ff_out.weight"] = emb, head
    (d / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
    return d


DREAM_SPECIALS = {
    "bos_token": "<|beginoftext|>",
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "mask_token": "<|mask|>",
}
LLADA_SPECIALS = {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "mask_token": "<|mask|>"}


def dream_config(**extra) -> dict:
    return {
        "mask_token_id": ID["<|mask|>"],
        "bos_token_id": ID["<|endoftext|>"],  # Dream's config.json names <|endoftext|> for all three
        "eos_token_id": ID["<|endoftext|>"],
        "pad_token_id": ID["<|endoftext|>"],
        **extra,
    }


def engine_for(d: Path, **masked):
    from dg_lsp.engine.loader import load_engine
    from dg_lsp.settings import Settings

    return load_engine(Settings.from_dict({"model": str(d), "device": "cpu", "masked": masked}))


# --- the variable-length canvas as a pure function ----------------------------------------------------


def test_apply_edits_grows_shrinks_and_keeps_within_the_maximum():
    m, e, dl = 0, 1, 2
    # an expand becomes two masks
    assert sampler.apply_edits([7, e, m], [False, False, True], m, e, dl, 8) == (
        [7, 0, 0, 0],
        [False, True, True, True],
    )
    # three expands with room for one more position: the first grows, the others stay one mask each
    canvas, masked = sampler.apply_edits([e, e, e], [False] * 3, m, e, dl, 4)
    assert canvas == [0, 0, 0, 0] and all(masked)
    # a delete is removed with every mask after it; committed tokens after it stay (DreamOn's own rule)
    out = sampler.apply_edits([7, dl, m, 9, m], [False, False, True, False, True], m, e, dl, 8)
    assert out == ([7, 9], [False, False])
    # a committed stop ends the span the same way, but stays (the caller trims at it)
    assert sampler.apply_edits([7, 5, m, m], [False, False, True, True], m, e, dl, 8, {5}) == (
        [7, 5],
        [False, False],
    )


# --- DreamOn ----------------------------------------------------------------------------------------


def test_dreamon_expand_grows_the_canvas_and_the_text(tmp_path):
    """After a mask the model predicts <|expand|> (then "b" once expanding is barred), after "a" or the
    prefix it predicts "a": the 4-mask canvas grows to the 8-token maximum and all 8 are decoded."""
    d = bigram_checkpoint(
        tmp_path / "dreamon",
        "dream",
        {"mask": ["<|expand|>", "b"], "other": ["a"], "a": ["a"]},
        dream_config(),
    )
    write_tokenizer(d, DREAM_SPECIALS)
    engine = engine_for(d, expandStart=4, buckets=[8])
    from dg_lsp.engine.types import InfillRequest

    facts = engine.describe()
    assert facts["format"] == "dreamon" and facts["native_family"] == "dream"
    assert facts["dual_cache"] == "False" and "moves the suffix" in facts["dual_cache_off"]
    ids, start = engine.canvas(InfillRequest("x =", "f ( )"), 4)
    assert ids[: start + 4] == [ID["<|beginoftext|>"], ID["x"], ID["="], *[ID["<|mask|>"]] * 4]
    assert ids[-4:] == [ID["f"], ID["("], ID[")"], ID["<|endoftext|>"]]  # DreamOn: EOS after the suffix
    result = engine.infill(InfillRequest("x =", "f ( )", max_tokens=8, steps=8))
    assert engine.last_lengths[0] == 4 and max(engine.last_lengths) == 8
    assert engine.last_lengths == sorted(engine.last_lengths)  # it only grew
    assert result.candidates[0].token_ids is not None and len(result.candidates[0].token_ids) == 8
    assert result.best.split() == ["a", "a", "a", "b", "b", "b", "b", "b"]


def test_dreamon_delete_shrinks_the_canvas(tmp_path):
    """After "a" the model predicts <|delete|>: one "a" is decoded, the delete removes its own position and
    every mask after it, and the 8-mask canvas ends at one token."""
    d = bigram_checkpoint(
        tmp_path / "dreamon",
        "dream",
        {"mask": ["a"], "other": ["a"], "a": ["<|delete|>", "b"]},
        dream_config(),
    )
    write_tokenizer(d, DREAM_SPECIALS)
    engine = engine_for(d, expandStart=8, buckets=[8], threshold=None, confidence="leftmost")
    from dg_lsp.engine.types import InfillRequest

    result = engine.infill(InfillRequest("x =", "f ( )", max_tokens=8, steps=8))
    assert engine.last_lengths[0] == 8 and engine.last_lengths[-1] == 1
    assert result.best == "a" and result.candidates[0].token_ids == [ID["a"]]


def test_dreamon_format_is_reachable_and_refused_without_its_tokens(tmp_path):
    d = bigram_checkpoint(tmp_path / "dream", "dream", {"other": ["a"]}, dream_config())
    specials = dict(DREAM_SPECIALS)
    write_tokenizer(d, specials)
    # the vocabulary has the tokens, so `auto` picks dreamon; `bos` overrides it
    assert engine_for(d).describe()["format"] == "dreamon"
    engine = engine_for(d, format="bos")
    from dg_lsp.engine.types import InfillRequest

    assert engine.describe()["format"] == "bos" and engine.describe()["dual_cache"] == "True"
    ids, start = engine.canvas(InfillRequest("x =", "f"), 2)
    assert ids == [ID["<|beginoftext|>"], ID["x"], ID["="], ID["<|mask|>"], ID["<|mask|>"], ID["f"]]
    assert start == 3


# --- stop tokens ------------------------------------------------------------------------------------


def test_llada_stop_tokens_come_from_tokenizer_and_generation_config(tmp_path):
    """LLaDA-Instruct ends a turn with <|eot_id|> (126348) and pads with <|endoftext|> (126081); only the
    latter is its tokenizer's eos. Every mask here predicts <|eot_id|> first, "a" second: with one
    position barred from stops (minTokens 1) the span is "a" and ends at the <|eot_id|> after it."""
    d = bigram_checkpoint(
        tmp_path / "llada",
        "llada",
        {"mask": ["<|eot_id|>", "a"], "other": ["a"]},
        {"mask_token_id": ID["<|mask|>"], "eos_token_id": ID["<|endoftext|>"], "pad_token_id": None},
    )
    write_tokenizer(d, LLADA_SPECIALS)
    (d / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ID["<|beginoftext|>"], "eos_token_id": [ID["<|endoftext|>"], ID["b"]]})
    )
    engine = engine_for(d)
    from dg_lsp.engine.types import InfillRequest

    assert engine.describe()["native_family"] == "llada" and engine.describe()["format"] == "bos"
    assert {ID["<|eot_id|>"], ID["<|endoftext|>"], ID["b"], ID["<|im_end|>"]} <= engine.stop_ids
    assert ID["<|mask|>"] not in engine.stop_ids and ID["<|beginoftext|>"] not in engine.stop_ids
    result = engine.infill(InfillRequest("x =", "f", max_tokens=8, steps=8))
    assert result.best == "a" and result.candidates[0].token_ids == [ID["a"]]
    assert engine.describe()["dual_cache"] == "True"  # LLaDA natively: Llama layers take position_ids


def test_dream_named_end_of_turn_ends_the_span(tmp_path):
    """<|im_end|> is not Dream's eos, yet ends an Instruct turn: a native Dream checkpoint stops on it."""
    d = bigram_checkpoint(
        tmp_path / "dream",
        "dream",
        {"mask": ["a"], "other": ["a"], "a": ["<|im_end|>", "b"]},
        dream_config(),
    )
    write_tokenizer(d, DREAM_SPECIALS)
    engine = engine_for(d, format="bos", confidence="leftmost", threshold=None)
    from dg_lsp.engine.types import InfillRequest

    assert ID["<|im_end|>"] in engine.stop_ids
    assert engine.infill(InfillRequest("x =", "f", max_tokens=8, steps=8)).best == "a"


# --- Open-dCoder ------------------------------------------------------------------------------------

QWEN2_CODER_05B = {  # Qwen2.5-Coder-0.5B's config.json keys (Open-dCoder ships its base model's config)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "attention_dropout": 0.0,
    "bos_token_id": ID["<|endoftext|>"],
    "eos_token_id": ID["<|endoftext|>"],
    "hidden_act": "silu",
    "max_window_layers": 24,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
OPEN_DCODER_SPECIALS = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>"}


def test_open_dcoder_is_detected_by_its_mask_token(tmp_path):
    from dg_lsp.engine.loader import detect_backend
    from dg_lsp.engine.types import InfillRequest

    d = bigram_checkpoint(
        tmp_path / "odc",
        "dream",
        {"mask": ["a"], "other": ["a"]},
        QWEN2_CODER_05B,
        drop=("auto_map", "mask_token_id", "use_mrope", "rope_scaling"),
    )
    config = json.loads((d / "config.json").read_text())
    # the config alone is an autoregressive Qwen2
    assert native.family_from_config(config) is None and detect_backend(config) == "ar"
    write_tokenizer(d, OPEN_DCODER_SPECIALS)
    assert native.variant_from_config(config, native.tokenizer_config(d)) == "open-dcoder"
    assert detect_backend(config, d) == "masked"
    engine = engine_for(d)
    facts = engine.describe()
    assert facts["native_family"] == "dream" and facts["variant"] == "open-dcoder"
    assert facts["format"] == "plain" and facts["logits_shift"] == "True" and facts["dual_cache"] == "True"
    ids, start = engine.canvas(InfillRequest("x =", "f"), 2)
    assert ids == [ID["x"], ID["="], ID["<|mask|>"], ID["<|mask|>"], ID["f"]] and start == 2  # no bos
    assert engine.infill(InfillRequest("x =", "f", max_tokens=4, steps=4)).best == "a a a a"


def test_plain_qwen2_without_a_mask_token_stays_autoregressive(tmp_path):
    from dg_lsp.engine.loader import detect_backend

    d = bigram_checkpoint(tmp_path / "qwen", "dream", {"other": ["a"]}, QWEN2_CODER_05B, drop=("auto_map",))
    config = json.loads((d / "config.json").read_text())
    config.pop("mask_token_id")
    (d / "config.json").write_text(json.dumps(config))
    write_tokenizer(d, {"eos_token": "<|endoftext|>"})
    assert detect_backend(config, d) == "ar"


# --- chat format ------------------------------------------------------------------------------------


def test_chat_format_puts_the_masks_in_the_assistant_turn(tmp_path):
    d = bigram_checkpoint(tmp_path / "dream", "dream", {"other": ["a"]}, dream_config())
    template = "{% for m in messages %}<|beginoftext|> {{ m['content'] }} <|im_end|>{% endfor %} assistant"
    write_tokenizer(d, DREAM_SPECIALS, chat_template=template)
    engine = engine_for(d, format="chat")
    from dg_lsp.engine.types import InfillRequest

    ids, start = engine.canvas(InfillRequest("x =", "f"), 3)
    assert ids[-3:] == [ID["<|mask|>"]] * 3 and start == len(ids) - 3
    assert ID["<|im_end|>"] in ids[:start]  # the user turn, closed, then the assistant's answer


# --- remote code that cannot run here ------------------------------------------------------------

OLD_CODE = """
import torch
from transformers import PretrainedConfig, PreTrainedModel


class LLaDAMoEConfig(PretrainedConfig):
    model_type = "llada_moe"


class LLaDAMoEModelLM(PreTrainedModel):
    config_class = LLaDAMoEConfig

    def __init__(self, config):
        super().__init__(config)
        self.proj = torch.nn.Linear(2, 2)

    def tie_weights(self):  # transformers 4.4x's signature; 5 passes missing_keys=
        pass
"""


def test_remote_code_that_cannot_run_gives_one_clear_message(tmp_path):
    """A relative of a native family (here an LLaDA-MoE-like class) whose own code predates transformers 5:
    with remote code allowed it is loaded through that code, which fails inside transformers; the user
    sees one message naming the cause and the native family to try."""
    from dg_lsp.engine.loader import ModelLoadError, load_engine
    from dg_lsp.settings import Settings

    d = tmp_path / "moe"
    d.mkdir()
    (d / "modeling_llada_moe.py").write_text(OLD_CODE)
    config = {
        "architectures": ["LLaDAMoEModelLM"],
        "model_type": "llada_moe",
        "auto_map": {
            "AutoConfig": "modeling_llada_moe.LLaDAMoEConfig",
            "AutoModel": "modeling_llada_moe.LLaDAMoEModelLM",
        },
        "mask_token_id": ID["<|mask|>"],
    }
    (d / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({"proj.weight": torch.zeros(2, 2), "proj.bias": torch.zeros(2)}, str(d / "model.safetensors"))
    write_tokenizer(d, LLADA_SPECIALS)
    with pytest.raises(ModelLoadError) as err:
        load_engine(Settings(model=str(d), device="cpu", trust_remote_code=True))
    text = str(err.value)
    assert "cannot run on the installed transformers" in text and "modeling_llada_moe.py" in text
    assert '"nativeFamily": "llada"' in text and "LLaDA-8B" in text
    assert "Traceback" not in text and text.count("\n") == 0


NO_POSITIONS_CODE = """
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class TinyMdlmConfig(PretrainedConfig):
    model_type = "tiny_mdlm"


class TinyMdlmModel(PreTrainedModel):
    config_class = TinyMdlmConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = torch.nn.Embedding(config.vocab_size, 8)
        self.head = torch.nn.Linear(8, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
        return CausalLMOutput(logits=self.head(self.emb(input_ids)))
"""


def test_remote_code_without_position_ids_runs_without_the_dual_cache_and_says_why(tmp_path):
    """LLaDA's own forward takes `past_key_values` but no `position_ids`: the canvas-only pass would put
    the canvas at the suffix's positions. Such a model decodes with full passes, and doctor/`complete
    --json` (both print describe()) say so."""
    from safetensors.torch import save_file

    from dg_lsp.engine.loader import load_engine
    from dg_lsp.engine.types import InfillRequest
    from dg_lsp.settings import Settings

    d = tmp_path / "mdlm"
    d.mkdir()
    (d / "modeling_tiny_mdlm.py").write_text(NO_POSITIONS_CODE)
    auto_map = {
        "AutoConfig": "modeling_tiny_mdlm.TinyMdlmConfig",
        "AutoModel": "modeling_tiny_mdlm.TinyMdlmModel",
    }
    config = {"architectures": ["TinyMdlmModel"], "model_type": "tiny_mdlm", "auto_map": auto_map}
    config.update(vocab_size=MODEL_VOCAB, mask_token_id=ID["<|mask|>"])
    (d / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    weights = {
        "emb.weight": torch.randn(MODEL_VOCAB, 8, generator=g),
        "head.weight": torch.randn(MODEL_VOCAB, 8, generator=g),
        "head.bias": torch.zeros(MODEL_VOCAB),
    }
    save_file(weights, str(d / "model.safetensors"))
    write_tokenizer(d, LLADA_SPECIALS)
    engine = load_engine(Settings(model=str(d), device="cpu", trust_remote_code=True))
    facts = engine.describe()
    assert facts["dual_cache"] == "False" and "no position_ids" in facts["dual_cache_off"]
    result = engine.infill(InfillRequest("x =", "f", max_tokens=4, steps=2))
    assert result.stats.forward_passes >= 1 and result.candidates


def test_doctor_warns_when_the_dual_cache_is_off_and_says_why(tmp_path, capsys):
    from dg_lsp.doctor import run_doctor
    from dg_lsp.settings import Settings

    d = bigram_checkpoint(tmp_path / "dreamon", "dream", {"mask": ["a"], "other": ["a"]}, dream_config())
    write_tokenizer(d, DREAM_SPECIALS)
    run_doctor(Settings(model=str(d), device="cpu"))
    out = capsys.readouterr().out
    assert "[warn] dual cache     off: the dreamon format grows and shrinks the canvas" in out
    assert "format=dreamon" in out and "native_family=dream" in out


# --- DreamOn's own decoding rule, reached through settings --------------------------------------------


def dreamon_reference(model, head, n_masks, tail, max_length, mask_id, expand_id, delete_id):
    """DreamOn's `diffusion_generate` as its authors' `_sample` decodes (alg "entropy", temperature 0,
    `number_transfer_tokens` 1, deletes padded to the right), re-implemented here from that code's
    behaviour: each step one mask, the one of least entropy, takes its argmax; a delete removes itself and
    every mask after it, an expand becomes two masks; expand is barred once the window (prefix, canvas,
    suffix, EOS) is `max_length` long. Returns the final canvas, or None when it has not finished in
    `2 * max_length` steps: the rule can cycle (expand up to the maximum, delete back, again), which
    DreamOn's loop ends only at its step bound, with masks left."""
    x = [*head, *[mask_id] * n_masks, *tail]
    for _ in range(2 * max_length):
        if mask_id not in x:
            return x[len(head) : len(x) - len(tail)]
        masks = [i for i, t in enumerate(x) if t == mask_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([x])).logits[0].float()
        logits = torch.cat([logits[:1], logits[:-1]])[masks]  # token i read at i - 1
        if len(x) >= max_length:
            logits[:, expand_id] -= 1e9
        probs = logits.softmax(-1)
        x0 = probs.argmax(-1)
        neg_entropy = (probs * torch.log(probs + 1e-10)).sum(-1)
        j = int(neg_entropy.argmax())
        pos, token = masks[j], int(x0[j])
        if token == delete_id:
            x = [t for i, t in enumerate(x) if i < pos or (i > pos and t != mask_id)]
        elif token == expand_id:
            x[pos : pos + 1] = [mask_id, mask_id]
        else:
            x[pos] = token
    return None


def test_dreamon_settings_reproduce_dreamon_own_decoding(tmp_path):
    """With `schedule: one, confidence: entropy, threshold: null, stopAtFrontier: false, minTokens: 0`
    the dreamon canvas decodes as DreamOn's own loop does, on random tiny Dream checkpoints (special tokens
    other than expand/delete given zero logits, so the span holds ordinary tokens)."""
    from dg_lsp.engine.types import InfillRequest

    settings = {
        "schedule": "one",
        "confidence": "entropy",
        "threshold": None,
        "stopAtFrontier": False,
        "minTokens": 0,
        "expandStart": 4,
        "buckets": [8],
    }
    lengths_seen: set[int] = set()
    compared = cycled = 0
    for seed in range(8):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        config = {**tiny_config("dream", vocab=MODEL_VOCAB), **dream_config()}
        tensors = tiny_tensors("dream", config, seed=seed)
        head = tensors["lm_head.weight"] * 10
        keep = [ID[t] for t in ("<|expand|>", "<|delete|>")] + list(range(ID["a"], len(VOCAB)))
        head[[t for t in range(MODEL_VOCAB) if t not in keep]] = 0.0
        tensors["lm_head.weight"] = head
        (d / "config.json").write_text(json.dumps(config))
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
        write_tokenizer(d, DREAM_SPECIALS)
        engine = engine_for(d, **settings)
        request = InfillRequest("def f ( x ) :", "return x", max_tokens=8, steps=8)
        ids, start = engine.canvas(request, 4)
        got = engine.infill(request).candidates[0].token_ids
        tail = ids[start + 4 :]
        want = dreamon_reference(
            engine.model, ids[:start], 4, tail, start + 8 + len(tail), ID["<|mask|>"], *engine.edits
        )
        if want is None:  # DreamOn's own loop cycles here; the engine still ends within its pass bound
            cycled += 1
            assert len(engine.last_lengths) <= 2 * 8 + 8 + 1
            continue
        assert got == want, seed
        compared += 1
        lengths_seen.update(engine.last_lengths)
    assert compared >= 5 and min(lengths_seen) < 4 < max(lengths_seen)  # deletes and expands compared


def test_autoregressive_remote_code_that_cannot_run_gives_one_clear_message(tmp_path):
    """The same for a causal checkpoint: one message, and no diffusion family offered in its place."""
    from safetensors.torch import save_file

    from dg_lsp.engine.loader import ModelLoadError, load_engine
    from dg_lsp.settings import Settings

    d = tmp_path / "old"
    d.mkdir()
    code = OLD_CODE.replace("LLaDAMoEModelLM", "OldCoderForCausalLM").replace("LLaDAMoEConfig", "OldConfig")
    (d / "modeling_old.py").write_text(code.replace('"llada_moe"', '"old_coder"'))
    auto_map = {
        "AutoConfig": "modeling_old.OldConfig",
        "AutoModelForCausalLM": "modeling_old.OldCoderForCausalLM",
    }
    config = {"architectures": ["OldCoderForCausalLM"], "model_type": "old_coder", "auto_map": auto_map}
    (d / "config.json").write_text(json.dumps(config))
    save_file({"proj.weight": torch.zeros(2, 2), "proj.bias": torch.zeros(2)}, str(d / "model.safetensors"))
    write_tokenizer(d, {"eos_token": "<|endoftext|>"})
    with pytest.raises(ModelLoadError) as err:
        load_engine(Settings(model=str(d), device="cpu", trust_remote_code=True))
    text = str(err.value)
    assert "cannot run on the installed transformers" in text and "modeling_old.py" in text
    assert "nativeFamily" not in text and text.count("\n") == 0


@pytest.mark.parametrize("refresh", [False, True])
def test_block_decoding_refreshes_the_context_kv_at_block_boundaries(tmp_path, refresh):
    """Fast-dLLM's dual cache: a full pass (fresh prefix/suffix KV) when decoding enters a new block.
    Counted with a forward hook on the native LLaDA model: full-length inputs are the full passes."""
    from dg_lsp.engine.types import InfillRequest

    d = bigram_checkpoint(
        tmp_path / "llada",
        "llada",
        {"mask": ["a"], "other": ["a"]},
        {"mask_token_id": ID["<|mask|>"], "eos_token_id": ID["<|endoftext|>"]},
    )
    write_tokenizer(d, LLADA_SPECIALS)
    engine = engine_for(d, blockLength=4, buckets=[8], threshold=None, refreshBlocks=refresh)
    request = InfillRequest("x =", "f", max_tokens=8, steps=4)
    ids, _ = engine.canvas(request, 8)
    lengths: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    result = engine.infill(request)
    assert result.best == "a a a a a a a a" and engine.last_commits == [2, 2, 2, 2]
    full = [n for n in lengths if n == len(ids)]
    assert len(full) == (2 if refresh else 1) and len(lengths) == 4  # blocks of 4, 2 steps each
    cached = [n for n in lengths if n != len(ids)]
    assert cached == ([4, 4] if refresh else [8, 8, 8])  # Fast-dLLM: only the current block is recomputed


def test_the_dreamon_format_is_never_batched_with_a_fixed_canvas(tmp_path):
    """The team server batches masked requests into fixed canvases; a dreamon canvas grows and shrinks
    per row, so its requests run through the engine's own variable-length loop."""
    from dg_lsp.engine.batching import batcher_for

    d = bigram_checkpoint(tmp_path / "dreamon", "dream", {"other": ["a"]}, dream_config())
    write_tokenizer(d, DREAM_SPECIALS)
    assert batcher_for(engine_for(d)) is None
    assert batcher_for(engine_for(d, format="bos")) is not None


def test_dreamon_canvas_keeps_to_the_step_budget(tmp_path):
    """A model that always asks to expand still finishes within the request's steps (the latency budget's
    unit): at the last step the canvas stops growing and every mask left is committed."""
    from dg_lsp.engine.types import InfillRequest

    d = bigram_checkpoint(
        tmp_path / "dreamon",
        "dream",
        {"mask": ["<|expand|>", "b"], "other": ["a"], "a": ["a"]},
        dream_config(),
    )
    write_tokenizer(d, DREAM_SPECIALS)
    engine = engine_for(d, expandStart=2, buckets=[16])
    result = engine.infill(InfillRequest("x =", "f", max_tokens=16, steps=3))
    assert result.stats.forward_passes == 3 and engine.last_lengths == [2, 3, 4, 4]
    assert result.best == "a a a b"  # the last mask, no longer allowed to expand, takes its second choice
