"""Self-speculative denoising decodes what the step-by-step sampler decodes, in fewer passes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine import speculative
from dg_lsp.engine.loader import EMBEDDED_TINY_DIR
from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig
from dg_lsp.engine.step import Committed
from dg_lsp.engine.types import InfillRequest

SMOLLM2_DIR = EMBEDDED_TINY_DIR.parent / "embedded_smollm2"

SOURCE = '''import json
from pathlib import Path


class Store:
    """Keeps records on disk, one JSON file per key."""

    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key):
        return self.root / f"{key}.json"

    def get(self, key, default=None):
        p = self.path(key)
        if not p.exists():
            return default
        return json.loads(p.read_text())

    def put(self, key, value):
        self.path(key).write_text(json.dumps(value, indent=2))

    def keys(self):
        return sorted(p.stem for p in self.root.glob("*.json"))
'''


def cursors(n: int) -> list[InfillRequest]:
    """Natural stops at real cursors of SOURCE: rest of line (a third into a line) and, every third,
    the whole rest of the file as a multi-line span."""
    lines = SOURCE.splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        if len(line.strip()) < 12 or i < 3:
            continue
        at = sum(len(x) for x in lines[:i]) + len(line) - len(line.lstrip()) + len(line.strip()) // 3
        multi = len(out) % 3 == 2
        suffix = SOURCE[at:].split("\n", 1)[1] if not multi else SOURCE[at + 12 :]
        out.append(
            InfillRequest(SOURCE[:at], ("" if multi else "\n") + suffix, max_tokens=32, single_line=not multi)
        )
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def fp32():
    """Compared in fp32: a batched pass rounds differently in bf16, which can flip near-tied picks."""
    from dg_lsp.engine import quantization

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantization, "default_dtype", lambda device, model_dir=None: torch.float32)
        yield


def decode(engine: MaskedDiffusionEngine, requests, **cfg):
    engine.cfg = dataclasses.replace(engine.cfg, **cfg)
    out = [engine.infill(r) for r in requests]
    return [r.candidates[0].token_ids for r in out], sum(r.stats.forward_passes for r in out)


@pytest.mark.parametrize(
    "sampler",
    [{}, {"confidence": "leftmost", "steps": 32}, {"steps": 4}, {"commit": ("factor:1.0",)}],
    ids=["default", "leftmost", "capped-at-4-steps", "factor-rule"],
)
def test_same_tokens_as_step_by_step_in_fewer_passes(fp32, sampler):
    torch.set_num_threads(1)
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    engine.use_prompt_cache = False
    requests = cursors(12)
    alone, passes = decode(engine, requests, speculate=0, **sampler)
    for k in (2, 3):
        spec, spec_passes = decode(engine, requests, speculate=k, **sampler)
        assert spec == alone, f"speculate={k} changed a completion"
        assert spec_passes <= passes
    assert spec_passes < passes, "no draft was ever kept: the chain does nothing"


def test_the_shipped_block_model_decodes_the_same(fp32):
    torch.set_num_threads(1)
    engine = MaskedDiffusionEngine(SMOLLM2_DIR, use_continuation_cache=False)
    engine.use_prompt_cache = False
    requests = cursors(3)
    alone, passes = decode(engine, requests, speculate=0)
    spec, spec_passes = decode(engine, requests, speculate=2)
    assert spec == alone
    assert spec_passes <= passes


def test_option_reads_from_settings_and_more_candidates_decode_as_before(fp32):
    cfg = MaskedSamplerConfig.from_options({"masked": {"speculate": 3}})
    assert cfg.speculate == 3
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, sampler=cfg, use_continuation_cache=False)
    engine.use_prompt_cache = False
    request = dataclasses.replace(cursors(1)[0], num_candidates=3, seed=5)
    with_spec = [c.token_ids for c in engine.infill(request).candidates]
    engine.cfg = dataclasses.replace(cfg, speculate=0)
    assert [c.token_ids for c in engine.infill(request).candidates] == with_spec


def leftmost_advance(logits: torch.Tensor, st: speculative.State):
    """A small real sampler step: commit the leftmost mask with its argmax."""
    canvas, left = st.canvas.clone(), st.masked.clone()
    i = int(left[0].nonzero()[0])
    canvas[0, i] = int(logits[0, i].argmax())
    commit = torch.zeros_like(left)
    commit[0, i] = True
    left[0, i] = False
    return speculative.State(canvas, left, st.step + 1), Committed(canvas, commit, torch.zeros(1))


def one_hot(tokens: list[int], vocab: int = 8) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([tokens]), vocab).float()


def test_chain_keeps_drafts_until_the_first_the_sampler_does_not_reproduce():
    start = speculative.State(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool), 0)
    stale = one_hot([1, 2, 3, 4])  # what the last pass predicted everywhere
    first, _ = leftmost_advance(stale, start)
    chain = speculative.draft(leftmost_advance, stale, first, 3, steps=10, needs_full_pass=lambda s: False)
    assert [c.canvas[0].tolist() for c in chain] == [[1, 2, 0, 0], [1, 2, 3, 0], [1, 2, 3, 4]]
    assert chain[-1].finished
    # the real passes: the state after `first` still predicts 2 next; after that, 5 instead of 3
    real = [one_hot([1, 2, 3, 4]), one_hot([1, 2, 5, 4])]
    taken, source = speculative.walk(leftmost_advance, first, real, chain)
    assert [s.canvas[0].tolist() for s, _ in taken] == [[1, 2, 0, 0], [1, 2, 5, 0]]
    assert torch.equal(source, real[1])  # the next chain drafts from what made the last state


def test_chain_stops_at_the_step_cap_and_before_a_full_pass():
    start = speculative.State(torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool), 0)
    logits = one_hot([1, 2, 3, 4, 5, 6])
    capped = speculative.draft(leftmost_advance, logits, start, 5, steps=2, needs_full_pass=lambda s: False)
    assert len(capped) == 2
    chain = speculative.draft(
        leftmost_advance, logits, start, 5, steps=10, needs_full_pass=lambda s: s.step == 3
    )
    assert [c.step for c in chain] == [1, 2]


def test_describe_names_it_only_when_on():
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, sampler=MaskedSamplerConfig(speculate=2))
    assert engine.describe()["speculate"] == "2"
    engine.cfg = MaskedSamplerConfig()
    assert "speculate" not in engine.describe()
