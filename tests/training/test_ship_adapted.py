"""`python -m dg_lsp.training.ship RUN` on a LoRA run, as a maintainer ships one: the adapter goes into the
model folder, the base once into the shared folder, and a run over another base cannot silently replace
the base the models already shipped were trained against."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dg_lsp.training.train import main as train_main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from dg_lsp.models.tiny_extra import make_tiny_packed_base, write_tiny_corpus

    root = tmp_path_factory.mktemp("ship")
    base = make_tiny_packed_base(root / "base")
    write_tiny_corpus(root / "corpus")
    cfg = {
        "kind": "block",
        "base": str(base),
        "lora_rank": 4,
        "lora_alpha": 8,
        "model": {"canvas_buckets": [8, 16]},
        "data": {"corpus": str(root / "corpus"), "tokenizer": str(root / "tok"), "context_tokens": [32],
                 "valid_samples": 8},
        "batch_size": 4,
        "warmup_steps": 1,
        "max_steps": 2,
        "eval_every": 2,
        "save_every": 2,
    }  # fmt: skip
    (root / "cfg.json").write_text(json.dumps(cfg))
    assert train_main([str(root / "cfg.json"), "--out", str(root / "run"), "--no-progress"]) == 0
    return root


def _ship(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dg_lsp.training.ship", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_ship_puts_the_adapter_beside_one_shared_base(run: Path, tmp_path: Path):
    dest, shared = tmp_path / "models" / "mine", tmp_path / "models" / "base"
    out = _ship(run / "run", "--dest", str(dest), "--shared-base", str(shared))
    assert out.returncode == 0, out.stderr[-2000:]
    assert (shared / "base.safetensors").read_bytes() == (run / "base" / "base.safetensors").read_bytes()
    assert {p.name for p in dest.iterdir()} >= {
        "adapter.safetensors",
        "config.json",
        "tokenizer.json",
        "README.md",
    }
    config = json.loads((dest / "config.json").read_text())
    assert config["dg_lsp_base"] == "../base/base.safetensors" and "dg_lsp_base_file" not in config
    assert (dest / config["dg_lsp_base"]).resolve() == (shared / "base.safetensors").resolve()


def test_a_run_over_another_base_does_not_replace_the_shared_one(run: Path, tmp_path: Path):
    dest, shared = tmp_path / "mine", tmp_path / "base"
    shared.mkdir()
    (shared / "base.safetensors").write_bytes(b"the base other shipped adapters were trained against")
    out = _ship(run / "run", "--dest", str(dest), "--shared-base", str(shared))
    assert out.returncode != 0 and "--replace-base" in out.stderr, out.stderr[-2000:]
    assert (shared / "base.safetensors").read_bytes().startswith(b"the base other")
    assert not dest.exists()
    out = _ship(run / "run", "--dest", str(dest), "--shared-base", str(shared), "--replace-base")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (shared / "base.safetensors").read_bytes() == (run / "base" / "base.safetensors").read_bytes()


def _reorder_metadata(src: Path, dst: Path) -> None:
    """The same packed base with its header's metadata keys written in reverse order (what a fresh repack
    of the GGUF may produce): other bytes, same weights."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8 : 8 + n])
    head["__metadata__"] = dict(reversed(list(head["__metadata__"].items())))
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def test_a_repacked_base_with_the_same_weights_is_the_same_base(run: Path, tmp_path: Path):
    """Continuing the shipped adapter and shipping over the shared base both accept a base whose file
    differs only in metadata order, and still refuse one whose weights differ."""
    import torch
    from safetensors.torch import load_file, save_file

    from dg_lsp.training.adapt import same_weights

    base = run / "base" / "base.safetensors"
    same = tmp_path / "same.safetensors"
    _reorder_metadata(base, same)
    assert same.read_bytes() != base.read_bytes() and same_weights(base, same) and same_weights(same, base)
    tensors = load_file(str(same))
    name = next(iter(tensors))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += torch.ones((), dtype=tensors[name].dtype)
    other = tmp_path / "other.safetensors"
    from safetensors import safe_open

    with safe_open(str(base), framework="pt") as f:
        save_file(tensors, str(other), metadata=f.metadata())
    assert not same_weights(base, other)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.safetensors").write_bytes(same.read_bytes())
    out = _ship(run / "run", "--dest", str(tmp_path / "mine"), "--shared-base", str(shared))
    assert out.returncode == 0, out.stderr[-2000:]
    assert (shared / "base.safetensors").read_bytes() == same.read_bytes()  # kept, not replaced


def test_shipping_over_a_model_keeps_its_sampler_defaults(run: Path, tmp_path: Path):
    """The shipped model's `dg_lsp_sampler` (its measured decoding defaults) survives a new adapter shipped
    over it, and a model shipped into an empty folder gets none."""
    dest, shared = tmp_path / "models" / "mine", tmp_path / "models" / "base"
    out = _ship(run / "run", "--dest", str(dest), "--shared-base", str(shared))
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((dest / "config.json").read_text())
    assert "dg_lsp_sampler" not in config
    config["dg_lsp_sampler"] = {"confidence": "leftmost"}
    (dest / "config.json").write_text(json.dumps(config))
    out = _ship(run / "run", "--dest", str(dest), "--shared-base", str(shared))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((dest / "config.json").read_text())["dg_lsp_sampler"] == {"confidence": "leftmost"}
    assert "kept the replaced model's sampler defaults" in out.stdout
    from dg_lsp.engine.masked import model_sampler_defaults

    shipped = json.loads((dest / "config.json").read_text())
    assert model_sampler_defaults(shipped) == {"confidence": "leftmost"}
