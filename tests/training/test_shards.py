"""Pre-tokenized shards for the GPU recipe: the same examples the CPU recipe draws, in size-capped files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dg_lsp.training import adapt, shards
from dg_lsp.training.config import load_config
from dg_lsp.training.corpus import load_docs
from dg_lsp.training.train import DocSampler
from dg_lsp.training.train import main as train_main


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    from dg_lsp.models.tiny_extra import make_tiny_packed_base, write_tiny_corpus

    root = tmp_path_factory.mktemp("shards")
    base = make_tiny_packed_base(root / "base")
    corpus = write_tiny_corpus(root / "corpus")
    cfg = {
        "kind": "block",
        "base": str(base),
        "lora_rank": 4,
        "lora_alpha": 8,
        "model": {"canvas_buckets": [8, 16]},
        "data": {"corpus": str(corpus), "tokenizer": str(root / "tok"), "context_tokens": [32, 48],
                 "valid_samples": 8},
        "batch_size": 4,
        "warmup_steps": 1,
        "max_steps": 3,
        "eval_every": 3,
        "save_every": 3,
    }  # fmt: skip
    (root / "cfg.json").write_text(json.dumps(cfg))
    return root


def test_shards_hold_the_examples_the_cpu_recipe_draws(setup):
    out = setup / "shards"
    assert train_main([str(setup / "cfg.json"), "--pretokenize", str(out), "--examples", "30",
                       "--shard-mb", "0.002"]) == 0  # fmt: skip
    manifest = json.loads((out / shards.MANIFEST).read_text())
    assert manifest["examples"] == 32 and manifest["batches"] == 8  # whole batches of 4
    assert len(manifest["files"]) > 1  # 2 kB shards: the cap splits them
    assert all((out / f).stat().st_size <= 2_000 + 200 for f in manifest["files"])  # + the file's header
    cfg = load_config(setup / "cfg.json")
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    reader = shards.ShardReader(out, cfg.batch_size, len(tok))
    sampler = DocSampler(load_docs(Path(cfg.data.corpus) / "train.jsonl"))
    for b in (0, 5, 7):
        drawn = adapt.make_examples(cfg, tok, sampler, random.Random(b), cfg.batch_size)
        assert reader.batch(b) == drawn
    assert reader.batch(8) == reader.batch(0)  # a longer run cycles
    with pytest.raises(ValueError, match="batches of 4, the config asks for 8"):
        shards.ShardReader(out, 8, len(tok))


def test_a_run_trains_from_shards(setup):
    out = setup / "shards-run"
    assert train_main([str(setup / "cfg.json"), "--pretokenize", str(out), "--examples", "8"]) == 0
    cfg = json.loads((setup / "cfg.json").read_text())
    cfg["data"]["shards"] = str(out)
    (setup / "cfg-shards.json").write_text(json.dumps(cfg))
    run = setup / "run"
    assert train_main([str(setup / "cfg-shards.json"), "--out", str(run), "--no-progress"]) == 0
    history = json.loads((run / "history.json").read_text())
    steps = [h for h in history if "loss" in h]
    assert len(steps) == 3 and all(h["tokens"] > 0 for h in steps)
    assert (run / "best" / "adapter.safetensors").exists()
