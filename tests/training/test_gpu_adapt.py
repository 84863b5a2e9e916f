"""scripts/gpu-adapt.sh, the GPU recipe's two device calls, rehearsed on the CPU with a tiny random base.

A device lease is short and a warm machine goes back 30 s after a call, so a broken stage costs a whole
lease: the pack -> call 1 -> call 2 -> unpack round trip runs here, each call in a fresh folder that holds
only what would travel (the tree and that call's carried part).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dg_lsp.training.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-adapt.sh"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("xz", "tar", "split", "bash")), reason="needs xz, tar, split and bash"
)


def _sh(cwd: Path, *args: str, **env: str) -> str:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "DEVICE": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_pack_two_calls_and_unpack_round_trip(tmp_path):
    from dg_lsp.models.tiny_extra import make_tiny_packed_base, write_tiny_corpus

    here = tmp_path / "here"
    (here / ".git" / "info").mkdir(parents=True)
    make_tiny_packed_base(here / "tinybase")
    write_tiny_corpus(here / "data" / "corpus")
    cfg = {
        "kind": "block",
        "base": "tinybase",
        "lora_rank": 4,
        "lora_alpha": 8,
        "model": {"canvas_buckets": [8, 16]},
        "data": {
            "tokenizer": "data/tok",
            "context_tokens": [32, 48],
            "valid_samples": 8,
            "shards": "data/sh",
        },
        "batch_size": 4,
        "warmup_steps": 1,
        "max_steps": 1000,
        "eval_every": 2,
        "save_every": 2,
    }
    (here / "cfg.json").write_text(json.dumps(cfg))
    cwd = Path.cwd()
    os.chdir(here)  # the config's paths are relative to the repository root, as on the device
    try:
        assert train_main(["cfg.json", "--pretokenize", "data/sh", "--examples", "16"]) == 0
    finally:
        os.chdir(cwd)

    env = {"CFG": "cfg.json", "PART1_BYTES": "20000"}  # the tiny base is split in two like the real one
    _sh(here, "pack", **env)
    assert (here / ".git" / "info" / "exclude").read_text().splitlines() == ["/.dev/"]
    assert sorted(p.name for p in (here / ".dev" / "p1").iterdir()) == ["base.xz.aa"]
    rest = sorted(p.name for p in (here / ".dev" / "p2").iterdir())
    assert rest[0] == "base.xz.ab" and rest[-1] == "data.tar.xz", rest

    # the device: a folder with the tree (here, the config) and one carried part per call
    device, stage, out = tmp_path / "device", tmp_path / "stage", tmp_path / "out"
    (device / ".dev").mkdir(parents=True)
    out.mkdir()
    shutil.copy(here / "cfg.json", device / "cfg.json")
    shutil.copytree(here / ".dev" / "p1", device / ".dev" / "p1")
    assert "smoke ok" in _sh(device, "stage1", STAGE=str(stage), **env)
    shutil.rmtree(device / ".dev" / "p1")
    shutil.copytree(here / ".dev" / "p2", device / ".dev" / "p2")
    _sh(device, "train", "0.02", STAGE=str(stage), OUT=str(out), **env)

    # call 2 rebuilt the base and the data byte for byte from the two parts
    for rel in ("tinybase/base.safetensors", "data/sh/shards.json", "data/tok/tokenizer.json"):
        assert (device / rel).read_bytes() == (here / rel).read_bytes(), rel
    returned = sorted(p.name for p in out.iterdir())
    assert {"block.log", "ar.log", "gpu-block.tar.aa", "gpu-ar.tar.aa"} <= set(returned), returned
    assert all(p.stat().st_size <= 16 * 2**20 for p in out.iterdir())

    _sh(here, "unpack", str(out), **env)
    for kind in ("block", "ar"):
        best = here / "runs" / f"gpu-{kind}" / "best"
        assert (best / "adapter.safetensors").stat().st_size > 0
        assert (best / "base.safetensors").resolve() == (here / "tinybase" / "base.safetensors").resolve()
        assert (best / "tokenizer.json").exists()
        history = json.loads((here / "runs" / f"gpu-{kind}" / "history.json").read_text())
        assert [h for h in history if "loss" in h], kind
        assert json.loads((best / "metrics.json").read_text())["kind"] == kind

    # the next lease continues from those adapters: a third part carries them, one more call stages it
    (here / "runs" / "gpu-block").rename(here / "runs" / "shipped-block")
    (here / "runs" / "gpu-ar").rename(here / "runs" / "shipped-ar")
    init = {"INIT_BLOCK": "runs/shipped-block/best", "INIT_AR": "runs/shipped-ar/best"}
    _sh(here, "pack", **env, **init)
    assert sorted(p.name for p in (here / ".dev" / "p3").iterdir()) == ["init.tar"]
    shutil.rmtree(device)
    shutil.rmtree(stage)
    shutil.rmtree(out)
    (device / ".dev").mkdir(parents=True)
    out.mkdir()
    shutil.copy(here / "cfg.json", device / "cfg.json")
    for part, call in (("p1", "stage1"), ("p3", "stage2")):
        shutil.copytree(here / ".dev" / part, device / ".dev" / part)
        _sh(device, call, STAGE=str(stage), **env)
        shutil.rmtree(device / ".dev" / part)
    shutil.copytree(here / ".dev" / "p2", device / ".dev" / "p2")
    _sh(device, "train", "0.02", STAGE=str(stage), OUT=str(out), **env)
    for kind in ("block", "ar"):
        log = (out / f"{kind}.log").read_text()
        assert f"starting from the adapter in .dev/init/{kind}/adapter.safetensors" in log, log[-2000:]
        metrics = json.loads((device / "runs" / f"gpu-{kind}" / "last" / "metrics.json").read_text())
        assert metrics["init_adapter"] == f".dev/init/{kind}"

    # an adapter trained over another base is refused here, before a lease is spent on it
    other = here / "runs" / "other-block"
    shutil.copytree(here / "runs" / "shipped-block" / "best", other, symlinks=False)
    data = bytearray((other / "base.safetensors").read_bytes())
    data[-1] ^= 1
    (other / "base.safetensors").write_bytes(bytes(data))
    proc = subprocess.run(
        ["bash", str(SCRIPT), "pack"],
        cwd=here,
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), **env, **init,
             "INIT_BLOCK": "runs/other-block"},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "was trained over" in proc.stderr, proc.stderr[-2000:]
