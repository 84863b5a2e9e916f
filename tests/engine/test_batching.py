"""Batched canvases: requests decoded together in one forward per step decode what each decodes alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine.ar import AutoregressiveEngine
from dg_lsp.engine.batching import BatchedAR, BatchedMasked, batcher_for, seq_bucket, shape_buckets
from dg_lsp.engine.loader import EMBEDDED_TINY_DIR
from dg_lsp.engine.masked import MaskedDiffusionEngine, MaskedSamplerConfig
from dg_lsp.engine.types import Cancelled, InfillRequest

AR_TWIN_DIR = EMBEDDED_TINY_DIR.parent / "ar_twin"

REQUESTS = [
    InfillRequest("def add(a, b):\n    return ", "\n", max_tokens=16, steps=8),
    InfillRequest(
        "import os\n\ndef read(path):\n    with open(path) as f:\n        ",
        "\n\nprint(read('x'))\n",
        max_tokens=16,
        single_line=True,
    ),
    InfillRequest(
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        ",
        "\n",
        max_tokens=32,
        steps=12,
        blank_start=False,
    ),
    InfillRequest("for i in range(", "):\n    print(i)\n", max_tokens=8),
    InfillRequest("x = ", "\n", max_tokens=16, num_candidates=3, seed=4),
]


def test_shape_buckets_group_by_canvas_length_largest_group_first():
    groups = shape_buckets([5, 16, 17, 3, 12, 64, 1000], (8, 16, 32, 64))
    assert groups == {16: [1, 4], 8: [0, 3], 64: [5, 6], 32: [2]}
    sizes = [len(g) for g in groups.values()]
    assert sizes == sorted(sizes, reverse=True)
    assert [seq_bucket(n) for n in (1, 32, 33, 95)] == [32, 32, 64, 96]


@pytest.fixture(scope="module")
def fp32():
    """Equality is checked in fp32: in bf16 (the default on CPUs with native bf16) the padded pass's
    rounding differs enough to flip near-tied greedy picks."""
    from dg_lsp.engine import quantization

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quantization, "default_dtype", lambda device, model_dir=None: torch.float32)
        yield


@pytest.fixture(scope="module", params=[False, True], ids=["full-passes", "dual-cache"])
def masked_engine(fp32, request):
    """Both ways the masked engine decodes: a full pass every step, and Fast-dLLM's dual cache (the
    default), which the batched path reproduces with one context cache for all rows."""
    torch.set_num_threads(1)
    cfg = MaskedSamplerConfig(dual_cache=request.param)
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, sampler=cfg, use_continuation_cache=False)
    engine.use_prompt_cache = False
    return engine


def test_batched_masked_equals_unbatched(masked_engine):
    alone = [masked_engine.infill(r) for r in REQUESTS]
    runner = batcher_for(masked_engine)
    assert isinstance(runner, BatchedMasked)
    together = runner.run(REQUESTS)
    # 5 requests in 3 canvas buckets (8, 16, 32): 12 + 8 + 12 steps alone would be far more forwards
    assert runner.forwards <= 12 + 12 + 8
    for a, b in zip(alone, together, strict=True):
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates]
        assert [c.stopped for c in a.candidates] == [c.stopped for c in b.candidates]
        assert [c.mean_logprob for c in a.candidates] == pytest.approx(
            [c.mean_logprob for c in b.candidates], abs=1e-4
        )
        assert a.stats.forward_passes == b.stats.forward_passes
        assert a.stats.generated_tokens == b.stats.generated_tokens


TRIMMED = [  # canvases of 64 that natural stops leave mostly unused: tail trimming has work to do
    InfillRequest("def add(a, b):\n    return ", "\n", max_tokens=48),
    InfillRequest(REQUESTS[1].prefix, REQUESTS[1].suffix, max_tokens=48, single_line=True),
    InfillRequest(REQUESTS[2].prefix, "\n", max_tokens=64, steps=16),
    InfillRequest("x = ", "\n", max_tokens=48, num_candidates=3, seed=4),
    InfillRequest("def mean(values):\n    total = sum(values)\n    ", "\n", max_tokens=64, steps=24),
]


@pytest.mark.parametrize("margin", [8, 1], ids=["default-margin", "margin-1"])
def test_batched_rows_trim_their_tails_as_each_would_alone(fp32, margin):
    """Each row of a batch recomputes only its own window, refreshes when its span outgrows it, and so
    decodes what it decodes alone with tail trimming, pass for pass (margin 1 makes spans outgrow)."""
    cfg = MaskedSamplerConfig(trim_margin=margin)
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, sampler=cfg, use_continuation_cache=False)
    engine.use_prompt_cache = False
    assert engine.cfg.trim_tail and engine.dual_on()
    alone = []
    for r in TRIMMED:
        alone.append((engine.infill(r), list(engine.last_windows)))
    runner = BatchedMasked(engine)
    together = runner.run(TRIMMED)
    windows = [w for _, w in alone]
    assert any(0 < w < 64 for ws in windows for w in ws), "nothing was trimmed: the test checks nothing"
    if margin == 1:
        assert any(64 in ws[1:] for ws in windows), "no span outgrew its window"
    for i, ((a, ws), b) in enumerate(zip(alone, together, strict=True)):
        assert runner.last_windows[i] == ws
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates]
        assert a.stats.forward_passes == b.stats.forward_passes
    # one forward per step for all rows, plus one per step in which some row needs a full pass again
    assert runner.forwards < sum(a.stats.forward_passes for a, _ in alone)


@pytest.mark.parametrize(
    "options",
    [{"schedule": "one"}, {"schedule": "dream", "threshold": None}, {"stops_in_quota": False}],
    ids=["one-per-step", "dream", "stops-out-of-quota"],
)
def test_batched_requests_follow_the_engines_step_for_every_schedule(fp32, options):
    """The batch takes the engine's own step (`step.denoise_step`), whatever the sampler options: a
    schedule the batch handled apart once (one token per pass) decoded differently there."""
    engine = MaskedDiffusionEngine(
        EMBEDDED_TINY_DIR, sampler=MaskedSamplerConfig(**options), use_continuation_cache=False
    )
    engine.use_prompt_cache = False
    alone = [engine.infill(r) for r in REQUESTS]
    together = BatchedMasked(engine).run(REQUESTS)
    for a, b in zip(alone, together, strict=True):
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates]
        assert a.stats.forward_passes == b.stats.forward_passes


def test_batched_requests_reuse_each_documents_prompt_kv(fp32):
    """The next keystroke in two documents, batched: each row starts from its document's cached prompt
    keys and values (from a batch or from a request alone) and decodes what the engine alone decodes
    with its per-document prompt cache."""
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    assert engine.use_prompt_cache and engine.dual_on()
    body = "import os\n\n\ndef scale(values, k={k}):\n    out = []\n"
    body += "    for v in values:\n        out.append(v * k)\n"
    docs = {name: body.format(k=k) for name, k in (("a", 2), ("b", 3))}  # same token counts, other text
    first = [InfillRequest(t + "    return ", "\n", max_tokens=16, doc_key=n) for n, t in docs.items()]
    typed = [InfillRequest(t + "    return out", "\n", max_tokens=16, doc_key=n) for n, t in docs.items()]
    alone = [engine.infill(r) for r in (*first, *typed)][2:]
    assert all(r.stats.reused_prompt_tokens > 0 for r in alone)
    engine.reset_caches()
    runner = BatchedMasked(engine)
    runner.run(first)
    together = runner.run(typed)
    for a, b in zip(alone, together, strict=True):
        assert b.stats.reused_prompt_tokens == a.stats.reused_prompt_tokens
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates]
    engine.reset_caches()
    runner.run(first)  # a batch leaves snapshots the engine's own path reuses
    assert engine.infill(typed[0]).stats.reused_prompt_tokens == alone[0].stats.reused_prompt_tokens
    # with full passes every step there is no KV to reuse, however full the prompt cache
    import dataclasses

    saved, engine.cfg = engine.cfg, dataclasses.replace(engine.cfg, dual_cache=False)
    try:
        full = [engine.infill(r) for r in typed]
        batched = BatchedMasked(engine).run(typed)
    finally:
        engine.cfg = saved
    assert [r.best for r in batched] == [r.best for r in full]
    assert all(r.stats.reused_prompt_tokens == 0 for r in batched)


def test_a_cancelled_row_leaves_the_others_untouched(masked_engine):
    runner = BatchedMasked(masked_engine)
    calls = {"n": 0}

    def cancel_on_third_step() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    outcomes = runner.run(REQUESTS[:2], [cancel_on_third_step, None])
    assert isinstance(outcomes[0], Cancelled) and runner.rows_cancelled == 1
    assert outcomes[1].best == masked_engine.infill(REQUESTS[1]).best


def test_batched_ar_equals_unbatched(fp32):
    engine = AutoregressiveEngine(AR_TWIN_DIR, use_continuation_cache=False, use_prompt_cache=False)
    alone = [engine.infill(r) for r in REQUESTS]
    runner = batcher_for(engine)
    assert isinstance(runner, BatchedAR)
    together = runner.run(REQUESTS)
    assert runner.forwards == max(a.stats.forward_passes for a in alone)
    for a, b in zip(alone, together, strict=True):
        assert a.best == b.best
        assert a.candidates[0].mean_logprob == pytest.approx(b.candidates[0].mean_logprob, abs=1e-4)


def test_the_team_runner_serves_typed_suggestions_without_a_pass_and_keeps_every_document(fp32):
    """A replica's runner: a request whose prefix typed into the suggestion shown for its document is
    answered from it (no forward), the others batch; and 16 documents all keep their prompt KV."""
    from dg_lsp.team.local import EngineRunner

    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR)
    runner = EngineRunner(engine, batching=True)
    docs = [InfillRequest(f"def f{i}(x):\n    return ", "\n", 8, doc_key=f"d{i}") for i in range(16)]
    first = runner.run(docs, [lambda: False] * 16)
    assert len(engine.prompt_cache) == 16
    shown = next(i for i, r in enumerate(first) if len(r.best) > 1)
    typed = InfillRequest(docs[shown].prefix + first[shown].best[0], "\n", max_tokens=8, doc_key=f"d{shown}")
    other = InfillRequest("def g(y):\n    return ", "\n", max_tokens=8, doc_key="new")
    forwards = runner.batcher.forwards
    hit, miss = runner.run([typed, other], [lambda: False] * 2)
    assert hit.stats.cache_hit and hit.best == first[shown].best[1:]
    assert not miss.stats.cache_hit and runner.batcher.forwards > forwards


def test_batched_ar_reuses_each_documents_prompt_exactly(fp32):
    """The AR twin's prompts are causal, so reused keys and values are exact: the next keystroke in two
    documents, batched with a document never seen (it prefills apart), decodes what each decodes alone."""
    engine = AutoregressiveEngine(AR_TWIN_DIR, use_continuation_cache=False)
    body = "import os\n\n\ndef scale(values, k):\n    out = []\n    for v in values:\n"
    box = "class Box:\n    def __init__(self):\n        "
    first = [InfillRequest(body + "        out.append(v * k)\n    return ", "\n", 16, doc_key="a"),
             InfillRequest(box, "\n", 16, doc_key="b")]  # fmt: skip
    typed = [InfillRequest(first[0].prefix + "out", "\n", 16, doc_key="a"),
             InfillRequest(first[1].prefix + "self.items = ", "\n", 16, doc_key="b"),
             InfillRequest("def mean(xs):\n    return ", "\n", 16, doc_key="c")]  # fmt: skip
    alone = [engine.infill(r) for r in (*first, *typed)][2:]
    engine.reset_caches()
    runner = BatchedAR(engine)
    runner.run(first)
    together = runner.run(typed)
    for a, b in zip(alone, together, strict=True):  # a row may recompute a few tokens its group needs
        assert b.stats.reused_prompt_tokens <= a.stats.reused_prompt_tokens
        assert a.candidates[0].token_ids == b.candidates[0].token_ids
    assert [r.stats.reused_prompt_tokens > 0 for r in together] == [True, True, False]


def test_a_block_models_rows_refresh_without_reading_their_prompts_again(fp32):
    """The shipped block model with no tail margin, so spans outgrow their windows: a batch's later full
    passes start at the block (its causal prompt's keys and values come from the context) and each row
    decodes what it decodes alone, where the same holds (tests/models/test_block_llama.py)."""
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    engine = MaskedDiffusionEngine(
        SMOLLM2_DIR, sampler=MaskedSamplerConfig(trim_margin=0), use_continuation_cache=False, dtype="float32"
    )
    engine.use_prompt_cache = False
    requests = cursors(4)
    alone = [(engine.infill(r), list(engine.last_windows)) for r in requests]
    assert any(32 in ws[1:] for _, ws in alone), "no span outgrew its window: the test checks nothing"
    fed: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        runner = BatchedMasked(engine)
        together = runner.run(requests)
    finally:
        hook.remove()
    assert max(fed[1:]) <= 32 + 1 < fed[0]  # only the first pass reads the prompts
    for i, ((a, ws), b) in enumerate(zip(alone, together, strict=True)):
        assert runner.last_windows[i] == ws
        assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]


def test_a_block_models_rows_grow_their_canvas_as_each_would_alone(fp32):
    """`grow_from`: a span that fills its short canvas without stopping goes on on the full one, in a
    batch exactly as alone (the same tokens, passes and windows), single-line spans from 8 masks and
    multi-line ones from 16 in one batch. The model was trained to end its span inside its canvas, so
    stops are barred from the first 6 positions to make some spans fill it."""
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    engine = MaskedDiffusionEngine(
        SMOLLM2_DIR,
        sampler=MaskedSamplerConfig(grow_from=8, grow_from_multiline=16, min_tokens=6),
        use_continuation_cache=False,
        dtype="float32",  # packed models load in bf16 whatever the fixture says
    )
    requests = cursors(6)
    alone = []
    for r in requests:
        engine.reset_caches()
        alone.append((engine.infill(dataclasses.replace(r, doc_key="alone")), list(engine.last_windows)))
    assert [ws[0] for _, ws in alone] == [8 if r.single_line else 16 for r in requests]
    assert any(32 in ws for _, ws in alone), "no span grew: the test checks nothing"
    assert any(32 not in ws for _, ws in alone), "every span grew: the test checks half"
    engine.reset_caches()
    runner = BatchedMasked(engine)
    together = runner.run([dataclasses.replace(r, doc_key=f"doc{i}") for i, r in enumerate(requests)])
    for i, ((a, ws), b) in enumerate(zip(alone, together, strict=True)):
        assert runner.last_windows[i] == ws
        assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]
        assert a.stats.forward_passes == b.stats.forward_passes


@pytest.mark.parametrize("ahead", [0, 4], ids=["tail-windows", "windows-4-ahead"])
def test_a_block_models_rows_freeze_their_fronts_as_each_would_alone(fp32, ahead):
    """`freeze_front`: each row's written front joins its context and its canvas passes start behind it,
    in a batch as alone (the same tokens, passes and windows), though its rows' fronts differ and share
    one pass that starts at the smallest; also with windows that end 4 positions past the frontier
    (`window_ahead`), which spans outgrow every few tokens."""
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    cfg = MaskedSamplerConfig(freeze_front=True, confidence="leftmost", window_ahead=ahead)
    engine = MaskedDiffusionEngine(SMOLLM2_DIR, sampler=cfg, use_continuation_cache=False, dtype="float32")
    engine.use_prompt_cache = False
    assert engine.freezes_front()
    requests = cursors(4)
    alone = [(engine.infill(r), list(engine.last_windows)) for r in requests]
    # a window shrinks as the front moves up behind it (the tail window's end stays put)
    assert any(min(ws[2:], default=ws[1]) < ws[1] for _, ws in alone), (
        "no front moved: the test checks nothing"
    )
    if ahead:  # a window is at most 4 past the frontier, and spans outgrow them (a full pass: 32 again)
        assert all(w <= 4 for _, ws in alone for w in ws[1:] if w != 32)
        assert any(32 in ws[1:] for _, ws in alone)
    runner = BatchedMasked(engine)
    together = runner.run(requests)
    for i, ((a, ws), b) in enumerate(zip(alone, together, strict=True)):
        assert runner.last_windows[i] == ws
        assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]
        assert a.stats.forward_passes == b.stats.forward_passes


@pytest.mark.parametrize(
    "extra",
    [{}, {"grow_from": 8, "grow_from_multiline": 16, "min_tokens": 8}],
    ids=["recommended", "recommended-and-growing"],
)
def test_the_shipped_block_model_is_batched_with_its_own_defaults(fp32, extra):
    """The team server batches the embedded model (`batcher_for` once left the block layout out, so a
    replica ran its requests one at a time): with the sampler options its config.json recommends (short
    canvases that grow, a frozen front, windows 8 past the frontier, leftmost commits), each row decodes
    what it decodes alone, and the batch takes fewer forwards than the requests alone. The second case
    makes canvases grow under a frozen front (shorter first canvases, stops barred from the first 8
    positions), a combination no other test batches."""
    import json

    from dg_lsp.engine.masked import model_sampler_defaults
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    recommended = model_sampler_defaults(json.loads((SMOLLM2_DIR / "config.json").read_text()))
    cfg = MaskedSamplerConfig.from_options(extra, model_defaults=recommended)  # as the loader builds it
    engine = MaskedDiffusionEngine(SMOLLM2_DIR, sampler=cfg, use_continuation_cache=False, dtype="float32")
    engine.use_prompt_cache = False
    assert engine.freezes_front() and cfg.window_ahead and cfg.grow_from and cfg.confidence == "leftmost"
    runner = batcher_for(engine)
    assert isinstance(runner, BatchedMasked)
    requests = cursors(5)
    alone = [(engine.infill(r), list(engine.last_windows)) for r in requests]
    assert any(len(ws) > 2 and ws[2] < ws[1] for _, ws in alone), "no front moved: the test checks little"
    assert any(ws[0] in ws[1:] for _, ws in alone), "no span outgrew its window: the test checks little"
    if extra:  # a grown canvas's next pass is a full one over all 32 positions
        assert any(32 in ws and ws[0] < 32 for _, ws in alone), "no canvas grew: the test checks little"
    together = runner.run(requests)
    for i, ((a, ws), b) in enumerate(zip(alone, together, strict=True)):
        assert runner.last_windows[i] == ws
        assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]
        assert a.stats.forward_passes == b.stats.forward_passes
    assert runner.forwards < sum(a.stats.forward_passes for a, _ in alone)


def test_the_shipped_ar_twin_is_batched_and_reuses_each_documents_prompt(fp32):
    """The embedded model's AR twin (the `spm` layout: suffix first, then prefix) is batched too, prompt
    caches and all: the next keystroke in two documents, batched with a document never seen, decodes
    what each decodes alone."""
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    engine = AutoregressiveEngine(SMOLLM2_DIR.parent / "ar_twin_smollm2", use_continuation_cache=False)
    assert engine.layout == "spm"
    runner = batcher_for(engine)
    assert isinstance(runner, BatchedAR)
    a, b, c = cursors(3)
    first = [dataclasses.replace(a, doc_key="a"), dataclasses.replace(b, doc_key="b")]
    typed = [  # a keystroke or two later: the suffix comes first, so only the prompt's end is new
        dataclasses.replace(a, prefix=a.prefix + "s", doc_key="a"),
        dataclasses.replace(b, prefix=b.prefix + "re", doc_key="b"),
        dataclasses.replace(c, doc_key="c"),
    ]
    alone = [engine.infill(r) for r in (*first, *typed)][2:]
    assert any(r.stats.generated_tokens > 1 for r in alone), "nothing was generated: the test checks little"
    engine.reset_caches()
    runner.run(first)
    together = runner.run(typed)
    for x, y in zip(alone, together, strict=True):
        assert y.stats.reused_prompt_tokens <= x.stats.reused_prompt_tokens
        assert x.candidates[0].token_ids == y.candidates[0].token_ids
    assert [r.stats.reused_prompt_tokens > 0 for r in together] == [True, True, False]


def _drive(decoding, joins: dict[int, list[tuple[int, InfillRequest]]]) -> tuple[dict, dict]:
    """Steps a continuous decode to its end, adding `joins[k]` just before step k; returns each request's
    outcome and the step it ended at."""
    out: dict = {}
    ended_at: dict = {}
    step = 0
    while step <= max(joins) or len(decoding):
        if step in joins:
            decoding.add([(key, r, None) for key, r in joins[step]])
        for key, outcome in decoding.step():
            out[key], ended_at[key] = outcome, step
        step += 1
        assert step < 500, "the decode never ended"
    return out, ended_at


JOINS = {  # short prompts first; longer ones join the running canvases (their rows are laid out again)
    0: [(3, REQUESTS[3]), (4, REQUESTS[4])],
    2: [(0, REQUESTS[0]), (1, REQUESTS[1])],
    3: [(2, REQUESTS[2])],
}


def test_requests_joining_a_running_masked_decode_decode_what_they_decode_alone(masked_engine):
    """Continuous batching: requests added between steps, to canvases already decoding (a longer prompt
    moves every running row's tokens and cached keys and values), each decode what they decode alone, and
    each is returned the step it ends, not when the slowest is done."""
    alone = {key: masked_engine.infill(r) for joins in JOINS.values() for key, r in joins}
    runner = batcher_for(masked_engine)
    out, ended_at = _drive(runner.decoding(), JOINS)
    assert sorted(out) == sorted(alone)
    for key, a in alone.items():
        b = out[key]
        assert [c.text for c in a.candidates] == [c.text for c in b.candidates], key
        assert [c.mean_logprob for c in a.candidates] == pytest.approx(
            [c.mean_logprob for c in b.candidates], abs=1e-4
        )
        assert (a.stats.forward_passes, a.stats.generated_tokens) == (
            b.stats.forward_passes,
            b.stats.generated_tokens,
        )
    # each ends after as many steps as it takes alone, counted from the step it joined
    joined = {key: step for step, joins in JOINS.items() for key, _ in joins}
    assert {k: ended_at[k] - joined[k] + 1 for k in alone} == {
        k: a.stats.forward_passes for k, a in alone.items()
    }
    assert len(set(ended_at.values())) > 1


def test_a_cancelled_request_leaves_a_running_decode_and_the_others_untouched(masked_engine):
    decoding = batcher_for(masked_engine).decoding()
    calls = {"n": 0}

    def cancel_on_third_step() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    decoding.add([("a", REQUESTS[0], cancel_on_third_step), ("b", REQUESTS[4], None)])
    out = {}
    while len(decoding):
        out.update(decoding.step())
    assert isinstance(out["a"], Cancelled)
    assert out["b"].best == masked_engine.infill(REQUESTS[4]).best


def test_requests_joining_a_running_ar_decode_decode_what_they_decode_alone(fp32):
    engine = AutoregressiveEngine(AR_TWIN_DIR, use_continuation_cache=False, use_prompt_cache=False)
    alone = {key: engine.infill(r) for joins in JOINS.values() for key, r in joins}
    runner = batcher_for(engine)
    out, ended_at = _drive(runner.decoding(), JOINS)
    for key, a in alone.items():
        assert a.best == out[key].best, key
        assert a.candidates[0].mean_logprob == pytest.approx(out[key].candidates[0].mean_logprob, abs=1e-4)
        assert a.stats.forward_passes == out[key].stats.forward_passes
    joined = {key: step for step, joins in JOINS.items() for key, _ in joins}
    # a request's last forward is its last token's: it ends at the step that picks the token after it
    assert {k: ended_at[k] - joined[k] + 1 for k in alone} == {
        k: a.stats.forward_passes for k, a in alone.items()
    }


@pytest.mark.parametrize("split", [None, 0.0], ids=["default-split", "a-pass-per-stage"])
def test_the_shipped_block_models_canvases_grow_and_freeze_in_a_running_decode(fp32, split, monkeypatch):
    """The embedded model with its recommended sampler and canvases that grow: requests joining at
    different steps, some growing to the full canvas while others start on the short one, decode what
    they decode alone; also when every stage takes its own canvas pass (fronts frozen in any of them)."""
    from dg_lsp.engine import batching

    if split is not None:
        monkeypatch.setitem(batching.SPLIT_COST, "cpu", split)
    import json

    from dg_lsp.engine.masked import model_sampler_defaults
    from tests.engine.test_speculative import SMOLLM2_DIR, cursors

    recommended = model_sampler_defaults(json.loads((SMOLLM2_DIR / "config.json").read_text()))
    extra = {"grow_from": 8, "grow_from_multiline": 16, "min_tokens": 8}
    cfg = MaskedSamplerConfig.from_options(extra, model_defaults=recommended)
    engine = MaskedDiffusionEngine(SMOLLM2_DIR, sampler=cfg, use_continuation_cache=False, dtype="float32")
    engine.use_prompt_cache = False
    requests = cursors(5)
    alone = {}
    for i, r in enumerate(requests):
        alone[i] = (engine.infill(r), list(engine.last_windows))
    assert any(32 in ws and ws[0] < 32 for _, ws in alone.values()), "no canvas grew: the test checks little"
    joins = {
        0: [(0, requests[0]), (1, requests[1])],
        3: [(2, requests[2]), (3, requests[3])],
        9: [(4, requests[4])],
    }
    out, _ = _drive(batcher_for(engine).decoding(), joins)
    for i, (a, _) in alone.items():
        assert [c.token_ids for c in a.candidates] == [c.token_ids for c in out[i].candidates], i
        assert a.stats.forward_passes == out[i].stats.forward_passes


def test_canvas_passes_split_only_where_padding_costs_more_than_a_pass():
    from dg_lsp.engine.batching import canvas_shares

    young, old = (0, 32, 1), (10, 14, 1)  # a row just joined, and rows near their ends
    assert canvas_shares([young] * 3 + [old] * 10, 22.0) == [[0, 1, 2], list(range(3, 13))]
    assert canvas_shares([young] * 3 + [old] * 10, 1e9) == [list(range(13))]  # a GPU: never
    assert canvas_shares([(0, 12, 1), (1, 13, 2), (0, 12, 1)], 22.0) == [[0, 2, 1]]  # alike: one pass
    assert canvas_shares([], 22.0) == []
