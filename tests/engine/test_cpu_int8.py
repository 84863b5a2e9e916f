"""Dynamic int8 narrow passes of the lean Llama forward (dg_lsp/engine/cpu_int8.py), on tiny random Llamas
and through the engines; the shipped models' completions in int8 are asserted in
tests/models/test_embedded_smollm2.py."""

from __future__ import annotations

import pytest
import torch

from dg_lsp.engine import cpu_int8, lean_llama
from dg_lsp.engine.kv import new_cache
from tests.engine.test_lean_llama import ids_with_block, tiny


@pytest.fixture(scope="module", autouse=True)
def _needs_fbgemm():
    why = cpu_int8.unavailable()
    if why is not None:  # torch 2.13 on x86 (CI) has it; a torch that dropped the ops keeps bf16
        pytest.skip(f"dynamic int8 unavailable here: {why}")


def test_packed_linear_is_close_to_fp32_and_takes_only_narrow_inputs():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(48, 80, generator=gen) * 0.05
    packs = cpu_int8.Int8Linears([w])
    narrow = torch.randn(2, 5, 80, generator=gen)
    got, ref = packs.linear(narrow, w), narrow @ w.T
    assert got.shape == ref.shape == (2, 5, 48)
    assert 0 < float((got - ref).norm() / ref.norm()) < 0.03  # int8 really ran, and stayed close
    wide = torch.randn(1, cpu_int8.MAX_ROWS + 1, 80, generator=gen)
    torch.testing.assert_close(packs.linear(wide, w), wide @ w.T, rtol=0, atol=0)
    other = torch.randn(48, 80, generator=gen)  # not packed: plain matmul whatever the width
    torch.testing.assert_close(packs.linear(narrow, other), narrow @ other.T, rtol=0, atol=0)
    assert packs.bytes == w.numel()
    every = cpu_int8.Int8Linears([w], max_rows=None)  # over fp32 weights: wide passes in int8 as well
    got, ref = every.linear(wide, w), wide @ w.T
    assert 0 < float((got - ref).norm() / ref.norm()) < 0.03


def test_each_row_gets_its_own_activation_scale():
    """A prompt's rows differ in magnitude; fbgemm's one scale per tensor would round a row 100x smaller than
    its neighbour to zeros. Every row keeps int8's precision relative to its own size."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 96, generator=gen) * 0.05
    x = torch.randn(4, 96, generator=gen)
    x[1] *= 0.01
    x[3] = 0.0  # an all-zero row stays zero, no NaN
    got, ref = cpu_int8.Int8Linears([w], max_rows=None).linear(x, w), x @ w.T
    for row in (0, 1, 2):
        err = float((got[row] - ref[row]).norm() / ref[row].norm())
        assert 0 < err < 0.03, (row, err)
    assert torch.equal(got[3], torch.zeros(64))


def test_smoothing_keeps_the_product_and_spares_channels_with_large_values():
    """An input with a few channels 30x larger than the rest (as a transformer's are): one activation scale
    per row still rounds the small channels away; smoothing moves that range into the weights."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 96, generator=gen) * 0.05
    x = torch.randn(7, 96, generator=gen)
    x[:, :3] *= 30.0
    ref = x @ w.T
    plain = cpu_int8.Int8Linears([w])
    smooth = cpu_int8.Int8Linears([w], {cpu_int8.key(w): x.abs().amax(dim=0)})
    err_plain = float((plain.linear(x, w) - ref).norm() / ref.norm())
    err_smooth = float((smooth.linear(x, w) - ref).norm() / ref.norm())
    assert err_smooth < 0.6 * err_plain, (err_smooth, err_plain)
    s = cpu_int8.smoothing(x.abs().amax(dim=0), w)
    assert s.shape == (96,) and bool((s[:3] > s[3:].max()).all())  # the large channels are scaled down most


def test_block_model_canvas_passes_in_int8_prompt_passes_unchanged():
    """The engine's pattern over bf16 weights: a cold prompt (wide: the model's own weights, bit-identical),
    then canvas passes against its cached keys (narrow: int8, close to the plain forward, same argmax)."""
    model = tiny(block=True, seed=3)
    plain, fast = lean_llama.LeanLlama(model), lean_llama.LeanLlama(model)
    fast.use_int8([ids_with_block(1, 100, 0, seed=9)[0, :100].tolist()])  # a calibration prompt
    assert all(s is not None for _, s in fast.int8._packed.values())  # every projection was smoothed
    assert plain.int8 is None and fast.int8 is not None
    x = ids_with_block(1, 90, 12, seed=4)
    prompt, canvas = x[:, :90], x[:, 90:]
    pos = torch.arange(90, 103).unsqueeze(0)
    with torch.inference_mode():
        c_plain, c_fast = new_cache(model.config), new_cache(model.config)
        a = plain(input_ids=prompt, cache=c_plain, use_cache=True).logits
        b = fast(input_ids=prompt, cache=c_fast, use_cache=True).logits
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        a = plain(input_ids=canvas, position_ids=pos, cache=c_plain).logits
        b = fast(input_ids=canvas, position_ids=pos, cache=c_fast).logits
    err = float((a - b).norm() / a.norm())
    assert 0 < err < 0.05, err
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9


def _shipped(kind: str):
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.loader import resolve_model_dir
    from dg_lsp.engine.masked import MaskedDiffusionEngine

    if kind == "masked":
        return MaskedDiffusionEngine, resolve_model_dir("embedded")
    return AutoregressiveEngine, resolve_model_dir("embedded").parent / "ar_twin_smollm2"


def _completes_with_class_state(engine) -> None:
    from dg_lsp.engine.types import InfillRequest

    prefix = "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    prefix += "    def size(self):\n        return "
    out = engine.infill(InfillRequest(prefix=prefix, suffix="\n", max_tokens=8, steps=8, seed=0))
    assert "self.items" in out.best, out  # the class state, as the bf16 and fp32 models write


@pytest.mark.parametrize("kind", ["masked", "ar"])
def test_int8_setting_runs_the_shipped_models_passes_in_int8(kind):
    """`quantization = "int8"` on the CPU reaches the lean forward (not the dequantize-per-call linears,
    which would switch the lean forward off) and the engine still completes: narrow passes in int8 over
    bf16 weights, every pass over fp32 ones."""
    cls, model_dir = _shipped(kind)
    engine = cls(model_dir, quantization="int8")
    info = engine.describe()
    assert info["quantization"] == "int8"
    rows = "on every pass" if engine.model.dtype == torch.float32 else f"up to {cpu_int8.MAX_ROWS} rows"
    assert info["forward"] == f"lean, int8 {rows}, smoothed", info
    assert isinstance(engine.model, lean_llama.LeanLlama) and engine.model.int8 is not None
    _completes_with_class_state(engine)
