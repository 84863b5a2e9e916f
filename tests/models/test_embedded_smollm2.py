"""The shipped SmolLM2 models (`model = embedded`, the default, and its AR twin), loaded from the package as a
user gets them: one packed base shared by two small adapters, completions through `dg-lsp complete`.

The 5M `embedded-tiny` model answers the quickstart's `peek` with `self._dict_dict(self)`; these assert the
code these models write uses the class's own state, which is what makes them worth their size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dg_lsp.context import parse_snapshot
from dg_lsp.engine.loader import detect_backend, read_config, resolve_model_dir
from dg_lsp.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "dg_lsp" / "models"
EXAMPLE = ROOT / "dg_lsp" / "examples" / "stack.py"


def _complete(model: str, path: Path, line: int, character: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "dg_lsp", "complete", str(path), "--line", str(line), "--character",
         str(character), "--model", model, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_the_name_resolves_to_the_shipped_block_model_over_the_shared_base():
    block = resolve_model_dir("embedded")
    assert block == MODELS / "embedded_smollm2" == resolve_model_dir("embedded-smollm2")  # its opt-in name
    assert resolve_model_dir("embedded-tiny") == MODELS / "embedded_tiny"
    assert Settings().model == "embedded"
    twin = MODELS / "ar_twin_smollm2"
    assert detect_backend(read_config(block), block) == "masked"
    assert detect_backend(read_config(twin), twin) == "ar"
    for d in (block, twin):
        assert read_config(d)["dg_lsp_base"] == "../smollm2_base/base.safetensors"
    shipped = [MODELS / "smollm2_base" / "base.safetensors"] + [
        d / f for d in (block, twin) for f in ("adapter.safetensors", "tokenizer.json")
    ]
    assert sum(p.stat().st_size for p in shipped) <= 150 * 10**6  # the bound for the whole ship


@pytest.mark.parametrize("model", ["embedded", str(MODELS / "ar_twin_smollm2")])
def test_the_quickstart_completion_uses_the_class_state(model):
    data = _complete(model, EXAMPLE, 17, 16)  # `return ` in `def peek(self):`
    assert data["candidates"], data
    text = data["candidates"][0]
    assert "self.items" in text, text
    src = EXAMPLE.read_text()
    filled = src[: data["offset"]] + text + src[data["offset"] :]
    assert not parse_snapshot(filled, "python").tree.root_node.has_error, filled
    assert data["stats"]["forward_passes"] >= 1


def test_loading_in_bf16_gives_the_fp32_models_weights_rounded_once():
    """The loader merges the adapter into fp32 weights and allocates the model in bf16 alone (no fp32 copy
    of the model in a server's memory): the result must be bit for bit the fp32 model cast afterwards."""
    import torch

    from dg_lsp.models.block_llama import load_block_model

    fast = load_block_model(MODELS / "embedded_smollm2", dtype=torch.bfloat16)
    slow = load_block_model(MODELS / "embedded_smollm2", dtype=torch.float32).to(torch.bfloat16)
    a = {**fast.state_dict(), **dict(fast.named_buffers())}
    b = {**slow.state_dict(), **dict(slow.named_buffers())}
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
