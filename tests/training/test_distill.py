"""Parallel-decoding distillation on the real embedded model: traces are the engine's own decodes, the
training views mask what decoding leaves masked, and a few steps make the model surer of its traces."""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from dg_lsp.engine.masked import MaskedDiffusionEngine
from dg_lsp.models import tokens
from dg_lsp.training import corpus, distill
from dg_lsp.training.config import DataConfig

EMBEDDED = Path(__file__).resolve().parents[2] / "dg_lsp" / "models" / "embedded_tiny"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ["textwrap.py", "bisect.py", "colorsys.py", "fnmatch.py"]


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("distill-corpus")
    docs = [corpus.Doc((STDLIB / f).read_text(), "python-stdlib", f, "python") for f in FILES]
    (root / "train.jsonl").write_text("".join(json.dumps(asdict(d)) + "\n" for d in docs))
    return root


def job(root: Path, count: int) -> distill.TraceJob:
    return distill.TraceJob(str(EMBEDDED), str(root), 3, count, 192, 32, 12, DataConfig().span_weights)


@pytest.fixture(scope="module")
def traces(corpus_root) -> list[distill.Trace]:
    torch.set_num_threads(1)
    out = distill.trace_worker(job(corpus_root, 12))
    assert out, "no cursor produced a trace"
    return out


def test_traces_hold_the_engines_decode_in_the_canvas(traces):
    engine = MaskedDiffusionEngine(EMBEDDED, max_prompt_tokens=192, use_continuation_cache=False)
    for tr in traces:
        canvas = tr.ids[tr.start : tr.start + tr.length]
        assert tr.ids[0] == tokens.BOS_ID
        assert 0 < tr.content <= tr.length
        assert tokens.MASK_ID not in tr.ids
        assert canvas[tr.content :] == [engine.fill_id] * (tr.length - tr.content)
        assert engine.fill_id not in canvas[: tr.content]
        assert tr.passes >= 1


def test_traces_are_reproducible_from_their_seed(traces, corpus_root):
    """Same seed, same cursors, same greedy decodes: a run's traces can be regenerated."""
    again = distill.trace_worker(job(corpus_root, 3))
    assert again == traces[: len(again)] and len(again) == 3


def test_training_views_mask_only_the_canvas_and_keep_its_tail_masked(traces):
    rng = random.Random(0)
    kinds = set()
    for _ in range(60):
        tr = rng.choice(traces)
        hide = distill.hide_pattern(tr, rng)
        assert len(hide) == tr.length
        assert all(hide[tr.content :]), "the EOS tail is left masked, as the sampler leaves it"
        assert any(hide[: tr.content])
        content = hide[: tr.content]
        kinds.add("all" if all(content) else "suffix" if content == sorted(content) else "scattered")
    assert {"all", "suffix", "scattered"} <= kinds
    batch = distill.distill_batch(traces[:4], rng)
    for row, tr in enumerate(traces[:4]):
        ids = batch.input_ids[row, : len(tr.ids)].tolist()
        outside = [i for i in range(len(tr.ids)) if not tr.start <= i < tr.start + tr.length]
        assert all(ids[i] == tr.ids[i] for i in outside)
        scored = batch.scored[row].nonzero().flatten().tolist()
        assert scored and all(tr.start <= i <= tr.start + tr.content for i in scored)
        assert all(ids[i] == tokens.MASK_ID for i in scored)
        assert batch.targets[row, : len(tr.ids)].tolist() == tr.ids


def test_a_few_steps_make_the_model_surer_of_its_traces_and_export_loads(traces, tmp_path):
    out = tmp_path / "model"
    summary = distill.train(
        EMBEDDED, traces * 4, out, minutes=5, batch_size=8, lr=3e-4, certainty=0.5, threads=1, max_steps=20
    )
    assert summary["steps"] == 20
    first, last = summary["first"], summary["last"]
    assert last["valid_ce"] < first["valid_ce"]
    assert last["valid_entropy_right"] < first["valid_entropy_right"]
    engine = MaskedDiffusionEngine(out, max_prompt_tokens=192, use_continuation_cache=False)
    from dg_lsp.engine.types import InfillRequest

    result = engine.infill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=8))
    assert result.candidates and result.stats.forward_passes >= 1
