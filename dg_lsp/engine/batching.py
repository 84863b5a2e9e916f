"""Canvases of several requests in one forward pass: what makes a shared team server worth having.

A single request on a small model leaves most of a forward's arithmetic idle; 16 users typing at once
would each pay a full pass per step if their canvases ran one after another. Here requests are grouped
by shape bucket (canvas length, then padded sequence length), their canvases aligned so every row's
canvas starts at the same column (prefixes left-padded, suffixes right-padded, pads excluded by the
attention mask, positions counted per row), and one forward per step serves every row still running.

The per-request step is the masked engine's (`MaskedDiffusionEngine._generate` without the block
schedule): the same quota, commit rules, frontier rule, stop fill and tail trimming, applied to that
request's rows of the batched logits. With the dual cache each row keeps the keys and values of its
last full pass, and each canvas pass recomputes every row's own window: a row attends to its fresh
columns inside the window and to its stale cached columns outside it, as it would alone. With greedy
decoding a batched request therefore decodes what the unbatched engine decodes
(tests/engine/test_batching.py), up to float rounding of the padded pass. The autoregressive twin is
batched the same way (left padding, one KV cache) so the two can be compared when served alike.

A server batches continuously (`BatchedMasked.decoding`, `BatchedAR.decoding`): requests join the running
decode between steps and leave it the step they end. A static batch holds every answer until its slowest
member ends (16 typists' requests to the shipped model: 7 of 16 rows ended within 6 of the batch's 12-14
forwards), and what arrives meanwhile waits for all of it. A joining request's rows are laid out with
the running ones (more left padding when its prompt is longer; the running rows' tokens and cached keys
and values move with them, positions being per row) and take their first pass at the next step; `run` is
the same decode with everyone joining at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dg_lsp.engine import commit as commit_rules
from dg_lsp.engine import sampler
from dg_lsp.engine.base import rank_candidates
from dg_lsp.engine.cache import common_prefix_len
from dg_lsp.engine.kv import KVSnapshot, cache_kwarg, new_cache
from dg_lsp.engine.passes import FrozenFront, GrowingCanvas, TailWindow
from dg_lsp.engine.step import StepPlan, denoise_step
from dg_lsp.engine.types import Cancelled, Candidate, InfillRequest, InfillResult, InfillStats, ShouldCancel

SEQ_BUCKET = 32
"""Padded sequence lengths are multiples of this: few distinct shapes, little padding."""

Outcome = InfillResult | Cancelled | Exception


def seq_bucket(n: int, multiple: int = SEQ_BUCKET) -> int:
    """The padded length for `n` tokens: the next multiple of `multiple`."""
    return max(multiple, -(-n // multiple) * multiple)


def shape_buckets(lengths: Sequence[int], buckets: Sequence[int]) -> dict[int, list[int]]:
    """Indices of requests grouped by canvas-length bucket, the largest group first: rows in one forward
    must share a canvas length so the canvas columns line up."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(sampler.bucket(n, buckets), []).append(i)
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


@dataclass(frozen=True)
class _Cached:
    """What one batch member (`rows` rows) can take from its document's cached prompt: the snapshot, the
    column its prompt starts at in the batch, and how many of its leading tokens the snapshot holds."""

    snap: KVSnapshot | None
    left: int
    n: int
    rows: int = 1

    @property
    def end(self) -> int:
        """The first column this member must compute."""
        return self.left + self.n


def _cached(eng, key: str | None, ids: list[int], left: int, limit: int, rows: int = 1) -> _Cached:
    """One prompt-cache lookup: the snapshot and its common prefix with `ids`, at most `limit` tokens."""
    snap = eng.prompt_cache.get(key) if eng.use_prompt_cache else None
    n = min(common_prefix_len(snap.ids, ids), limit) if snap is not None else 0
    return _Cached(snap, left, n, rows)


def _near_far(members: list, cached: Sequence[_Cached], slack: int, upto: int) -> list[list]:
    """The members split in two for their first pass: those whose cached prompts end within `slack`
    columns of column `upto`, and the rest (new documents, an edit far from the cursor, a moved prompt
    window). One pass from the smallest reusable column would make a single new document cost every row
    its whole prompt."""
    near = [bool(c.n and c.end >= upto - slack) for c in cached]
    groups = (
        [m for m, ok in zip(members, near, strict=True) if ok],
        [m for m, ok in zip(members, near, strict=True) if not ok],
    )
    return [g for g in groups if g]


def _stitched(config, cached: Sequence[_Cached], record: bool) -> tuple[int, object]:
    """(c0, cache): the smallest column any member must compute, and every member's cached keys and
    values before it, members' rows stacked in order. Members that could reuse more recompute a few
    tokens (each row's reused tokens are a prefix of its own); pad columns stay zero, hidden by the
    attention mask. (0, None) when nothing is reusable."""
    c0 = min(c.end for c in cached)
    ref = next((c.snap for c in cached if c.n and c0 > c.left), None)
    if c0 <= 0 or ref is None:
        return 0, None
    rows = sum(c.rows for c in cached)
    cache = new_cache(config, record=record)
    for i, layer in enumerate(cache.layers):
        k_ref, v_ref = ref.keys[i], ref.values[i]
        keys = k_ref.new_zeros(rows, k_ref.shape[1], c0, k_ref.shape[3])
        values = v_ref.new_zeros(rows, v_ref.shape[1], c0, v_ref.shape[3])
        r = 0
        for c in cached:
            if c.snap is not None and c.n and c0 > c.left:
                keys[r : r + c.rows, :, c.left : c0] = c.snap.keys[i][:, :, : c0 - c.left]
                values[r : r + c.rows, :, c.left : c0] = c.snap.values[i][:, :, : c0 - c.left]
            r += c.rows
        layer.update(keys, values)
    return c0, cache


@dataclass
class _Job:
    """One request's rows and decoding state inside a batch."""

    index: int
    request: InfillRequest
    should_cancel: ShouldCancel | None
    ids: list[int]
    start: int
    steps: int
    rows: int
    stats: InfillStats
    stops: set[int]
    stop_tensor: torch.Tensor
    blank_start: torch.Tensor | None
    healed: torch.Tensor | None
    around: list | None
    """Per row: the prompt's tokens for the `copy` commit rule (`MaskedDiffusionEngine.surroundings`)."""
    gen: torch.Generator
    masked: torch.Tensor
    logp_sum: torch.Tensor
    logp_n: torch.Tensor
    t0: float = field(default_factory=time.perf_counter)
    step: int = 0
    done: bool = False
    final: torch.Tensor | None = None
    cached: _Cached | None = None
    """Its document's prompt-cache lookup for the first pass (`BatchedMasked._reuse_groups`)."""
    tail: TailWindow = field(default_factory=lambda: TailWindow(margin=0))
    """Tail trimming: the canvas positions its canvas passes recompute."""
    front: FrozenFront | None = None
    """`freeze_front`: the rows at the front of its canvas whose keys and values the context holds final."""
    refresh: bool = False
    """Its span outgrew its window: the next pass is a full one, as alone."""
    windows: list[int] = field(default_factory=list)
    """Canvas positions each of its passes recomputed (the engine's `last_windows`)."""
    init: torch.Tensor | None = None
    """(rows, canvas) the canvas a grown job's rows start from (`BatchedMasked._grow`); None: all masks."""
    grow: GrowingCanvas | None = None
    """The full canvas it may grow to (`MaskedDecoding`; `run` keeps it per group)."""
    r0: int = 0
    """Its first row in its group's batch tensors (`_CanvasGroup.admit` lays the rows out)."""
    first: bool = True
    """Its next pass is its first: the prompt, from its document's cached keys and values where it can."""


class BatchedMasked:
    """Runs a list of requests on a `MaskedDiffusionEngine`'s model, one forward per step for all."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.forwards = 0
        """Batched forward passes run so far (tests and the benchmark read it)."""
        self.rows_cancelled = 0
        self._last_full = None
        self._last_canvas = None
        """(cache, first column, columns) of the last canvas pass: the context, then its fresh columns."""
        self.last_windows: dict[int, list[int]] = {}
        """Per request index of the last `run`, the canvas positions each of its passes recomputed."""

    def run(
        self, requests: Sequence[InfillRequest], cancels: Sequence[ShouldCancel | None] | None = None
    ) -> list[Outcome]:
        """One outcome per request, in order: its result, or `Cancelled` if its `should_cancel` fired.
        Requests are healed (`LocalEngine.heal`) as the engine alone would heal them."""
        cancels = list(cancels) if cancels is not None else [None] * len(requests)
        requests = [self.engine.heal(r) for r in requests]
        out: list[Outcome] = [Cancelled()] * len(requests)
        self.last_windows = {}
        lengths = [min(r.max_tokens, self.engine.cfg.buckets[-1]) for r in requests]
        for length, members in shape_buckets(lengths, self.engine.cfg.buckets).items():
            # rows start on the canvas they would start on alone (`grow_from`: single- and multi-line
            # spans may differ), one batch per starting length
            starts: dict[GrowingCanvas | None, list[int]] = {}
            for i in members:
                starts.setdefault(self.engine.growing(length, requests[i].single_line), []).append(i)
            for grow, group in starts.items():
                first = length if grow is None else grow.first
                jobs = [self._job(i, requests[i], cancels[i], first, length) for i in group]
                with torch.inference_mode():
                    self._decode(jobs, first)
                    if grow is not None:
                        self._decode_grown(jobs, grow)
                for job in jobs:
                    out[job.index] = self._finish(job, length)
                    self.last_windows[job.index] = job.windows
        return out

    def decoding(self) -> MaskedDecoding:
        """A decode that requests join and leave between steps (continuous batching)."""
        return MaskedDecoding(self)

    def _decode_grown(self, jobs: list[_Job], grow: GrowingCanvas) -> None:
        """The spans that filled the short canvas without stopping go on together on the full one."""
        done = [j for j in jobs if j.stats is not None and j.final is not None]  # not cancelled
        grown = [j for j in done if grow.needed(j.final, j.masked, j.stop_tensor)]
        for j in grown:
            self._grow(j, grow)
        if grown:
            self._decode(grown, grow.full)

    def _decode(self, jobs: list[_Job], length: int) -> None:
        """`jobs` decoded together to their ends."""
        group = _CanvasGroup(self, length)
        group.admit(jobs)
        while group.live:
            group.step()

    def _grow(self, j: _Job, grow: GrowingCanvas) -> None:
        """`j` continued on the full canvas as the engine alone continues it (`passes.GrowingCanvas`):
        its decoded tokens kept, masks appended, the share of the steps the full canvas would have given
        them, and a full pass first (its prompt keys and values from the document's prompt cache)."""
        eng = self.engine
        elapsed = (time.perf_counter() - j.t0) * 1000
        more = grow.extra_steps(j.steps, j.final.shape[1], elapsed, eng.ms_per_step, j.request.deadline_ms)
        j.ids = j.ids + [eng.mask_id] * (grow.full - j.final.shape[1])
        j.init, j.masked = grow.extend(j.final, j.masked, eng.mask_id, j.stops, eng.fill_id)
        j.steps, j.step, j.done, j.final, j.first = more, 0, False, None, True
        j.stats.step_cap += more
        j.tail, j.refresh, j.cached = TailWindow(eng.cfg.trim_margin, ahead=eng.cfg.window_ahead), False, None

    def _job(
        self,
        index: int,
        request: InfillRequest,
        cancel: ShouldCancel | None,
        length: int,
        full: int,
    ) -> _Job:
        """`length`: the canvas it starts with; `full`: the one it may grow to, which bounds its steps."""
        eng, cfg = self.engine, self.engine.cfg
        ids, start = eng.canvas(request, length)
        steps = min(max(1, request.steps or cfg.steps), full)
        if request.deadline_ms is not None and eng.ms_per_step:
            capped = sampler.cap_steps(steps, 0.0, eng.ms_per_step, request.deadline_ms)
            steps = max(capped, min(steps, cfg.min_capped_steps))
        rows = max(1, request.num_candidates)
        stops = eng.stop_ids | (eng.newline_ids() if request.single_line else set())
        blank = eng.first_token_bars(request, eng.logits_vocab)
        stats = InfillStats(prompt_tokens=len(ids) - length, step_cap=steps)
        return _Job(
            index=index,
            request=request,
            should_cancel=cancel,
            ids=ids,
            start=start,
            steps=steps,
            rows=rows,
            stats=stats,
            stops=stops,
            stop_tensor=torch.tensor(sorted(stops) or [-1], device=eng.device),
            blank_start=blank,
            healed=eng.fragment_ids(request),
            around=None if (near := eng.surroundings(ids, start, length)) is None else [near] * rows,
            gen=torch.Generator(device=eng.device).manual_seed(int(request.seed)),
            masked=torch.ones(rows, length, dtype=torch.bool, device=eng.device),
            logp_sum=torch.zeros(rows, device=eng.device),
            logp_n=torch.zeros(rows, device=eng.device),
            tail=TailWindow(eng.cfg.trim_margin, ahead=eng.cfg.window_ahead),
            front=FrozenFront(int(eng.shift)) if eng.freezes_front() else None,
        )

    REUSE_SLACK = 64
    """Rows whose reusable prompt ends within this many columns of the canvas share one first pass."""

    def _reuse_groups(self, live: list[_Job], head: int, shift: int, lo: int) -> list[list[_Job]]:
        """The rows in two groups for the first pass (`_near_far`); each job's prompt-cache lookup is kept
        on it for `_reused` (with the prompt cache off it finds nothing: one group, nothing reused)."""
        eng = self.engine
        for j in live:
            j.cached = _cached(eng, j.request.doc_key, j.ids, head - j.start, j.start - shift, j.rows)
        return _near_far(live, [j.cached for j in live], self.REUSE_SLACK, lo)

    def _reused(self, live: list[_Job]) -> tuple[int, object]:
        """(c0, cache): the first pass may start at column c0, the keys and values before it taken from
        each document's previous request (the engine's per-document prompt cache, as one request alone
        reuses it)."""
        cached = [j.cached for j in live]
        assert all(c is not None for c in cached), "_reuse_groups looks every row up first"
        return _stitched(self.engine.model.config, cached, record=False)

    def _remember(self, live: list[_Job], head: int, ctx_full) -> None:
        """Each document's first-pass keys and values, for its next request (batched or alone)."""
        eng = self.engine
        if ctx_full is None or not eng.use_prompt_cache:
            return
        r = 0
        for j in live:
            if j.request.doc_key is not None:
                left = head - j.start
                cols = slice(left, left + len(j.ids))
                snap = KVSnapshot(
                    ids=list(j.ids),
                    keys=[la.keys[r : r + 1, :, cols].clone() for la in ctx_full.layers],
                    values=[la.values[r : r + 1, :, cols].clone() for la in ctx_full.layers],
                )
                eng.prompt_cache.put(j.request.doc_key, snap)
            r += j.rows

    def _prompt_past(self, ctx, rows: torch.Tensor, lo: int) -> tuple[int, object]:
        """A block model's later full pass starts at the block: its causal prompt's keys and values (every
        column before `lo`) are the same whatever the canvas holds, so they come from the context."""
        cache = new_cache(self.engine.model.config, record=False)
        for layer, (k, v) in zip(cache.layers, ctx, strict=True):
            layer.update(k[rows, :, :lo], v[rows, :, :lo])
        return lo, cache

    def _full_pass(
        self, x, attn, pos, idx, lo: int, hi: int, length: int, keep: dict, dual: bool, past=(0, None)
    ):
        """Canvas logits from a pass over every column (from column c0 when `past` = (c0, cache) holds
        the keys and values before it); with the dual cache on, also every column's keys and values."""
        model = self.engine.model
        c0, cache = past
        kw: dict = dict(keep)
        if keep and c0:
            kw["logits_to_keep"] = keep["logits_to_keep"] - c0
        self._last_full = None
        if dual:
            cache = cache if cache is not None else new_cache(model.config, record=False)
            kw[cache_kwarg(model.forward) or "past_key_values"] = cache
        logits = model(
            input_ids=x[idx, c0:], attention_mask=attn[idx], position_ids=pos[idx, c0:], use_cache=dual, **kw
        ).logits
        logits = logits if keep else logits[:, lo - c0 : lo - c0 + length]
        if cache is None:
            return logits, None
        self._last_full = cache
        return logits, [(la.keys, la.values) for la in cache.layers]

    def _canvas_pass(
        self, x, attn, pos, idx, lo: int, head: int, widths: torch.Tensor, ctx, rows, fronts: torch.Tensor
    ):
        """Fast-dLLM's dual cache, batched, with each row's tail trimmed: the columns from `lo` up to the
        widest row's window are recomputed; a row attends to its fresh columns inside its own window
        (`widths`, canvas positions) and to its cached columns everywhere else (its prompt and the stale
        tail past its window), which is what its own trimmed pass alone sees. `fronts`: per row, the
        leading rows from `lo` its context holds final (`freeze_front`); the pass starts at the smallest,
        and a row reads the columns before its own from the context. Logits for canvas position 0 on,
        zero before a row's front (as alone: those positions are committed)."""
        model = self.engine.model
        cache = new_cache(model.config, record=False)
        for layer, (k, v) in zip(cache.layers, ctx, strict=True):
            layer.update(k[rows], v[rows])
        hi = head + int(widths.max())
        first = int(fronts.min())
        a = lo + first
        ends = (head + widths.to(attn.device))[:, None]
        begins = (lo + fronts.to(attn.device))[:, None]
        cols = torch.arange(attn.shape[1], device=attn.device)[None, :]
        stale = attn[idx] * ~((cols >= begins) & (cols < ends))
        fresh = attn[idx, a:hi] * ((cols[:, a:hi] >= begins) & (cols[:, a:hi] < ends))
        mask = torch.cat([stale, fresh], dim=1)
        kw = {cache_kwarg(model.forward) or "past_key_values": cache}
        out = model(
            input_ids=x[idx, a:hi], attention_mask=mask, position_ids=pos[idx, a:hi], use_cache=True, **kw
        )
        self._last_canvas = (cache, a, attn.shape[1])
        logits = out.logits[:, : hi - head - first]
        if first == 0 and not bool(fronts.any()):
            return logits
        logits = torch.nn.functional.pad(logits, (0, 0, first, 0))
        before = (
            torch.arange(logits.shape[1], device=logits.device)[None, :] < fronts.to(logits.device)[:, None]
        )
        return logits.masked_fill(before[..., None], 0.0)

    def _freeze(self, ctx, ctx_rows, at: int, n: int, c0: int, c1: int, canvas) -> None:
        """Columns c0..c1-1 of a canvas pass's rows at..at+n-1 become final context (`freeze_front`):
        copied over those rows' context, which alone they join as views. `canvas`: that pass's (cache,
        first column, columns)."""
        cache, a, total = canvas
        for layer, (k, v) in zip(cache.layers, ctx, strict=True):
            k[ctx_rows, :, c0:c1] = layer.keys[at : at + n, :, total + c0 - a : total + c1 - a]
            v[ctx_rows, :, c0:c1] = layer.values[at : at + n, :, total + c0 - a : total + c1 - a]

    def _step(
        self, j: _Job, logits: torch.Tensor, canvas: torch.Tensor, rules, window: int | None = None
    ) -> torch.Tensor:
        """One denoising step of one request, the step the engine alone takes (`step.denoise_step`);
        `window`: the pass recomputed only that many leading canvas positions. Returns the predictions."""
        eng = self.engine
        j.stats.forward_passes += 1
        done = denoise_step(
            eng.cfg,
            rules,
            logits,
            canvas,
            j.masked,
            j.stops,
            j.stop_tensor,
            eng.fill_id,
            StepPlan(j.step, j.steps, j.steps - j.step),
            gen=j.gen,
            blank_start=j.blank_start,
            window_end=window,
            healed=j.healed,
            around=j.around,
            pending=j.tail.pending(j.masked) if window is not None else None,
        )
        j.logp_sum += done.logp_gain
        j.logp_n += done.commit.sum(dim=-1)
        j.step += 1
        if not j.masked.any() or j.step >= j.steps:
            j.stats.early_exit = j.step < j.steps
            j.done = True
            j.final = canvas.clone()
        return done.pred

    def _finish(self, j: _Job, length: int) -> Outcome:
        if j.stats is None:
            return Cancelled()
        eng = self.engine
        cands = []
        for b in range(j.rows):
            assert j.final is not None
            row = j.final[b].tolist()
            new = sampler.trim_at_stop(row, eng.stop_ids | {eng.mask_id})[: j.request.max_tokens]
            stopped = sampler.stopped_at(row, len(new), eng.stop_ids)
            score = float(j.logp_sum[b] / j.logp_n[b]) if j.logp_n[b] > 0 else 0.0
            text = eng.tokenizer.decode(new, skip_special_tokens=True)
            cands.append(Candidate(text, score, new, stopped))
            j.stats.generated_tokens = max(j.stats.generated_tokens, len(new))
        j.stats.total_ms = (time.perf_counter() - j.t0) * 1000
        ranked = rank_candidates(cands, j.request.syntax_ok)[: j.rows]
        return InfillResult(eng.unheal(j.request, ranked), j.stats)


SPLIT_COST = {"cpu": 22.0, "cuda": 1e9}
"""What one more forward costs, in row-positions of canvas recomputed. On the CPU a canvas pass costs about
a weight read plus 2.2 ms per position (50 ms for 1 position, 118 ms for 32, against a 338-token prompt,
benchmarks/results/embedded_smollm2/tail_margin/), so a second forward pays off once it saves ~22 positions
of padding; on a GPU a forward is bound by reading the weights and padding is nearly free: never split."""


def _reach(j: _Job, length: int) -> tuple[int, int, int]:
    """(front, window end, rows): the canvas positions a job's canvas pass recomputes."""
    return (0 if j.front is None else j.front.rows, length if j.tail.end is None else j.tail.end, j.rows)


def canvas_shares(reach: Sequence[tuple[int, int, int]], split_cost: float) -> list[list[int]]:
    """Indices of the rows (`_reach` of each) in the canvas passes that recompute least. One pass computes
    from its smallest front to its largest end for every row in it, so rows at different stages of their
    decodes (continuous batching) padded each other to 40% useful positions in one pass. Sorted by front
    and end, the rows split into consecutive runs that minimise positions recomputed plus `split_cost` per
    pass (dynamic programming over at most a few dozen rows)."""
    order = sorted(range(len(reach)), key=lambda i: (reach[i][0], reach[i][1]))
    n = len(order)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        lo, hi, rows = 1 << 30, 0, 0
        for i in range(j, 0, -1):  # the last pass holds order[i-1:j]
            front, end, r = reach[order[i - 1]]
            lo, hi, rows = min(lo, front), max(hi, end), rows + r
            cost = best[i - 1] + rows * max(0, hi - lo) + split_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    shares: list[list[int]] = []
    j = n
    while j > 0:
        shares.append(order[cut[j] : j])
        j = cut[j]
    return shares[::-1]


class _CanvasGroup:
    """Jobs decoding on canvases of one length, one forward per step for all of them. Jobs may join
    between steps (`admit`): a server then starts a request the step after it arrives instead of after
    the slowest member of a running batch, and settles each one the step it ends."""

    def __init__(self, batcher: BatchedMasked, length: int) -> None:
        self.b = batcher
        self.eng = batcher.engine
        self.length = length
        self.shift = 1 if self.eng.shift else 0
        self.rules = commit_rules.build(self.eng.rule_specs())
        self.dual = self.eng.cfg.dual_cache and self.eng.supports_kv
        self.trim = self.dual and self.eng.cfg.trim_tail
        self.split = SPLIT_COST.get(torch.device(self.eng.device).type, SPLIT_COST["cpu"])
        """What one more canvas forward costs, in row-positions recomputed (`canvas_shares`)."""
        self.jobs: list[_Job] = []
        self.head = 0
        """Every row's canvas starts at this column."""
        self.x = self.attn = self.pos = torch.empty(0, 0, dtype=torch.long)
        self.ctx: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        """Per layer, every row's keys and values of its last full pass (all columns: a canvas pass masks
        out the ones it recomputes), rows in batch order."""

    @property
    def live(self) -> bool:
        return any(not j.done for j in self.jobs)

    def admit(self, new: list[_Job]) -> None:
        """Lay out the unfinished jobs and `new` afresh: canvases aligned at one column, prefixes
        left-padded, suffixes right-padded. A kept row's tokens and cached keys and values move with it;
        positions are counted per row, so nothing is recomputed. The new jobs take their first pass at the
        next step; finished rows are dropped."""
        eng, length = self.eng, self.length
        keep = [j for j in self.jobs if not j.done]
        jobs = keep + list(new)
        if not jobs:
            self.jobs = []
            return
        head = max(j.start for j in jobs)
        tail = max(len(j.ids) - j.start - length for j in jobs)
        total = seq_bucket(head + length + tail)
        head += total - (head + length + tail)  # bucket padding goes on the left, with the other pads
        n_rows = sum(j.rows for j in jobs)
        x = torch.full((n_rows, total), eng.fill_id, dtype=torch.long, device=eng.device)
        attn = torch.zeros(n_rows, total, dtype=torch.long, device=eng.device)
        ctx = None
        if self.ctx is not None and keep:
            ctx = [
                (
                    k.new_zeros(n_rows, k.shape[1], total, k.shape[3]),
                    v.new_zeros(n_rows, v.shape[1], total, v.shape[3]),
                )
                for k, v in self.ctx
            ]
        r = 0
        kept = len(keep)
        for n, j in enumerate(jobs):
            rows, left = slice(r, r + j.rows), head - j.start
            cols = slice(left, left + len(j.ids))
            if n < kept:  # its canvas as decoded so far, and its context
                old_left = self.head - j.start
                old = (slice(j.r0, j.r0 + j.rows), slice(old_left, old_left + len(j.ids)))
                x[rows, cols] = self.x[old]
                if ctx is not None and self.ctx is not None and not j.first:
                    for (k, v), (ok, ov) in zip(ctx, self.ctx, strict=True):
                        k[rows, :, cols] = ok[old[0], :, old[1]]
                        v[rows, :, cols] = ov[old[0], :, old[1]]
            else:
                x[rows, cols] = torch.tensor(j.ids, device=eng.device)
                if j.init is not None:  # a grown canvas: each row's own decoded tokens
                    x[rows, head : head + length] = j.init
                j.first = True
            attn[rows, cols] = 1
            j.r0 = r
            r += j.rows
        self.jobs, self.head, self.x, self.attn, self.ctx = jobs, head, x, attn, ctx
        self.pos = (attn.cumsum(-1) - 1).clamp(min=0)

    def _rows(self, jobs: list[_Job]) -> torch.Tensor:
        return torch.cat([torch.arange(j.r0, j.r0 + j.rows) for j in jobs])

    def _keep_context(self, idx: torch.Tensor, fresh) -> None:
        """Rows `idx`'s keys and values of the full pass they just took become their context."""
        if self.ctx is None:
            n = self.x.shape[0]
            self.ctx = [(k.new_zeros(n, *k.shape[1:]), v.new_zeros(n, *v.shape[1:])) for k, v in fresh]
        for (k, v), (fk, fv) in zip(self.ctx, fresh, strict=True):
            k[idx], v[idx] = fk, fv

    def step(self) -> list[_Job]:
        """One denoising step for every unfinished job; returns the jobs that ended in it (finished, or
        cancelled: `stats` None)."""
        b, eng, length, shift = self.b, self.eng, self.length, self.shift
        ended: list[_Job] = []
        live: list[_Job] = []
        for j in self.jobs:
            if j.done:
                continue
            if j.should_cancel is not None and j.should_cancel():
                j.done = True
                j.stats = None  # type: ignore[assignment]  # marks the job cancelled
                b.rows_cancelled += j.rows
                ended.append(j)
                continue
            live.append(j)
        if not live:
            return ended
        t0 = time.perf_counter()
        x, attn, pos, head = self.x, self.attn, self.pos, self.head
        span = slice(head, head + length)
        lo, hi = head - shift, head + length
        keep = {}
        if eng.slices_logits:
            keep = {"logits_to_keep": torch.arange(lo, lo + length, device=eng.device)}
        # without the dual cache every step is a full pass; with it, a job's first pass reads its prompt
        # (from its document's cached keys and values where it can), a job whose span outgrew its window
        # takes a full pass (a second forward this step), as it would alone, and the others recompute their
        # windows against their cached context
        reads_prompt = [j.first or not self.dual for j in live]
        firsts = [j for j, p in zip(live, reads_prompt, strict=True) if p]
        full = [j for j, p in zip(live, reads_prompt, strict=True) if not p and j.refresh]
        rest = [j for j, p in zip(live, reads_prompt, strict=True) if not p and not j.refresh]
        parts = []
        if firsts:
            # per group of rows that reuse about as much of their documents' prompts
            groups = b._reuse_groups(firsts, head, shift, lo) if self.dual else [firsts]
            firsts = [j for g in groups for j in g]
            for group in groups:
                past = b._reused(group) if self.dual else (0, None)
                idx = self._rows(group)
                lg, fresh = b._full_pass(x, attn, pos, idx, lo, hi, length, keep, self.dual, past)
                if self.dual:
                    b._remember(group, head, ctx_full=b._last_full)
                    self._keep_context(idx, fresh)
                for j in group:
                    j.stats.reused_prompt_tokens = max(0, past[0] - (head - j.start))
                    j.first = False
                parts.append(lg)
            b.forwards += 1
        if full:
            idx = self._rows(full)
            past = b._prompt_past(self.ctx, idx, lo) if eng.layout == "block" else (0, None)
            lg, fresh = b._full_pass(x, attn, pos, idx, lo, hi, length, keep, self.dual, past)
            self._keep_context(idx, fresh)
            parts.append(lg)
            b.forwards += 1
        passes: dict[int, tuple[object, int]] = {}  # per job: its canvas pass, and its first row in it
        shares = [
            [rest[i] for i in share] for share in canvas_shares([_reach(j, length) for j in rest], self.split)
        ]
        rest = [j for jobs in shares for j in jobs]
        for jobs in shares:
            ends = [length if j.tail.end is None else j.tail.end for j in jobs]
            widths = torch.tensor([w for j, w in zip(jobs, ends, strict=True) for _ in range(j.rows)])
            fronts = torch.tensor(
                [0 if j.front is None else j.front.rows for j in jobs for _ in range(j.rows)]
            )
            idx = self._rows(jobs)
            # as wide as the widest window in it: a trimmed row's step reads its own window alone
            parts.append(b._canvas_pass(x, attn, pos, idx, lo, head, widths, self.ctx, idx, fronts))
            at = 0
            for j in jobs:
                passes[id(j)] = (b._last_canvas, at)
                at += j.rows
            b.forwards += 1
        live = firsts + full + rest  # the order of `parts`' rows
        width = max(p.shape[1] for p in parts)  # a full pass's rows need the whole canvas
        logits = torch.cat([torch.nn.functional.pad(p, (0, 0, 0, width - p.shape[1])) for p in parts])
        n_full = len(firsts) + len(full)
        r = 0
        for n, j in enumerate(live):
            rows = slice(j.r0, j.r0 + j.rows)
            canvas = x[rows, span]
            passed_full = n < n_full
            window = None if passed_full else j.tail.end
            frozen = 0 if passed_full or j.front is None else j.front.rows
            j.windows.append((length if window is None else window) - frozen)
            seen = j.masked.clone() if j.front is not None else None
            pred = b._step(j, logits[r : r + j.rows].float(), canvas, self.rules, window)
            if j.front is not None:
                computed = (frozen, (length if window is None else window) + shift)
                j.front.after_pass(seen, j.masked, computed)
                if not passed_full and j.front.rows > frozen:
                    canvas_pass, at = passes[id(j)]
                    b._freeze(self.ctx, rows, at, j.rows, lo + frozen, lo + j.front.rows, canvas_pass)
            if self.trim and passed_full:
                j.tail.after_full_pass(canvas, j.masked, pred, j.stop_tensor)
                j.refresh = False
            elif j.tail.outgrew(j.masked):
                j.refresh = True
            x[rows, span] = canvas
            if j.done:
                ended.append(j)
            r += j.rows
        step_ms = (time.perf_counter() - t0) * 1000
        eng.ms_per_step = step_ms if eng.ms_per_step is None else 0.7 * eng.ms_per_step + 0.3 * step_ms
        return ended


class MaskedDecoding:
    """Continuous batching on a `BatchedMasked`: requests join the running decode between steps (`add`)
    and leave it the step they end (`step` returns them). A static batch holds every answer until its
    slowest member is done, and whatever arrives meanwhile waits for all of it; here a request starts one
    step after it arrives and its rows run in the same forwards as everyone else's of its canvas length.
    Each request decodes what it decodes alone (tests/engine/test_batching.py)."""

    def __init__(self, batcher: BatchedMasked) -> None:
        self.b = batcher
        self.groups: dict[int, _CanvasGroup] = {}
        """Per canvas length: rows must share it for their canvas columns to line up."""
        self._keys: dict[int, object] = {}
        self._next = 0

    def __len__(self) -> int:
        """Requests decoding now."""
        return len(self._keys)

    def add(self, items: Sequence[tuple[object, InfillRequest, ShouldCancel | None]]) -> None:
        """(key, request, should_cancel) each: they take their first pass at the next `step`."""
        eng = self.b.engine
        joining: dict[int, list[_Job]] = {}
        keys: dict[int, object] = {}
        for n, (key, request, cancel) in enumerate(items, start=self._next):
            request = eng.heal(request)
            length = sampler.bucket(min(request.max_tokens, eng.cfg.buckets[-1]), eng.cfg.buckets)
            grow = eng.growing(length, request.single_line)
            first = length if grow is None else grow.first
            job = self.b._job(n, request, cancel, first, length)
            job.grow = grow
            keys[n] = key
            joining.setdefault(first, []).append(job)
        self._next += len(items)  # nothing is registered unless every request could be set up
        self._keys.update(keys)
        for length, jobs in joining.items():
            self._group(length).admit(jobs)

    def _group(self, length: int) -> _CanvasGroup:
        if length not in self.groups:
            self.groups[length] = _CanvasGroup(self.b, length)
        return self.groups[length]

    def step(self) -> list[tuple[object, Outcome]]:
        """One step for every canvas length with requests decoding; the (key, outcome) of each request
        that ended in it. A span that filled its short canvas without stopping moves to its full one
        (`passes.GrowingCanvas`), as alone, and ends there."""
        out: list[tuple[object, Outcome]] = []
        with torch.inference_mode():
            for length in sorted(self.groups):
                group = self.groups[length]
                if not group.live:
                    continue
                for j in group.step():
                    grow = j.grow
                    if (
                        j.stats is not None
                        and grow is not None
                        and grow.needed(j.final, j.masked, j.stop_tensor)
                    ):
                        group.jobs.remove(j)  # it leaves this group's rows for the full canvas's
                        self.b._grow(j, grow)
                        self._group(grow.full).admit([j])
                    else:
                        out.append((self._keys.pop(j.index), self.b._finish(j, length)))
                if not group.live:  # its rows' tensors and keys and values go with it
                    del self.groups[length]
        return out

    def fail(self) -> list[object]:
        """Drop every request (after a failed step) and return their keys."""
        keys = list(self._keys.values())
        self._keys.clear()
        self.groups.clear()
        return keys


class BatchedAR:
    """Greedy decoding of several requests on an `AutoregressiveEngine`'s model: prompts left-padded,
    one KV cache, one forward per generated token for every row still running."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.forwards = 0
        self.rows_cancelled = 0

    def run(
        self, requests: Sequence[InfillRequest], cancels: Sequence[ShouldCancel | None] | None = None
    ) -> list[Outcome]:
        cancels = list(cancels) if cancels is not None else [None] * len(requests)
        decoding = self.decoding()
        decoding.add(list(zip(range(len(requests)), requests, cancels, strict=True)))
        out: list[Outcome] = [Cancelled()] * len(requests)
        while len(decoding):
            for i, outcome in decoding.step():
                out[i] = outcome  # type: ignore[index]
        return out

    def decoding(self) -> ARDecoding:
        """A decode that requests join and leave between steps (continuous batching)."""
        return ARDecoding(self)

    def _prefill(self, x, attn, pos, prompts, requests, stats, cache_arg):
        """(one cache for every row, last-position logits): each group of rows (`_near_far`) starts at the
        first column any of its rows cannot take from its document's cached prompt; causal attention makes
        the reused keys and values exact."""
        eng, model = self.engine, self.engine.model
        n, total = x.shape
        logits = None
        layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        lefts = [total - len(p) for p in prompts]
        cached = [
            _cached(eng, req.doc_key, ids, left, len(ids) - 1)
            for ids, req, left in zip(prompts, requests, lefts, strict=True)
        ]
        for rows in _near_far(list(range(n)), cached, PREFILL_SLACK, total):
            c0, cache = _stitched(model.config, [cached[i] for i in rows], record=True)
            cache = cache if cache is not None else new_cache(model.config)
            idx = torch.tensor(rows, device=x.device)
            out = model(
                input_ids=x[idx, c0:],
                attention_mask=attn[idx],
                position_ids=pos[idx, c0:],
                use_cache=True,
                **{cache_arg: cache},
                **eng._last,
            )
            self.forwards += 1
            if logits is None:
                logits = out.logits.new_zeros(n, out.logits.shape[-1])
                layers = [
                    (la.keys.new_zeros(n, *la.keys.shape[1:]), la.values.new_zeros(n, *la.values.shape[1:]))
                    for la in cache.layers
                ]
            logits[idx] = out.logits[:, -1, :]
            for (keys, values), la in zip(layers, cache.layers, strict=True):
                keys[idx], values[idx] = la.keys, la.values
            for r, i in enumerate(rows):
                stats[i].reused_prompt_tokens = max(0, c0 - lefts[i])
                doc = requests[i].doc_key
                if eng.use_prompt_cache and doc is not None:
                    cols = slice(lefts[i], total)
                    eng.prompt_cache.put(
                        doc,
                        KVSnapshot(
                            ids=list(prompts[i]),
                            keys=[la.keys[r : r + 1, :, cols].clone() for la in cache.layers],
                            values=[la.values[r : r + 1, :, cols].clone() for la in cache.layers],
                        ),
                    )
        full = new_cache(model.config)
        for layer, (keys, values) in zip(full.layers, layers, strict=True):
            layer.update(keys, values)
        assert logits is not None
        return full, logits.float()


@dataclass
class _ARJob:
    """One request's row in an `ARDecoding`."""

    key: object
    request: InfillRequest
    should_cancel: ShouldCancel | None
    stats: InfillStats
    bars: torch.Tensor | None = None
    """Tokens its first pick may not take (`first_token_bars`)."""
    new: list[int] = field(default_factory=list)
    picked: list[float] = field(default_factory=list)
    done: bool = False
    cancelled: bool = False
    t0: float = field(default_factory=time.perf_counter)


def _rows_of_cache(config, cache, idx: torch.Tensor | None, pad: int = 0):
    """A new cache holding rows `idx` (all when None) of `cache`, `pad` zero columns on the left."""
    out = new_cache(config)
    for layer, old in zip(out.layers, cache.layers, strict=True):
        keys = old.keys if idx is None else old.keys[idx]
        values = old.values if idx is None else old.values[idx]
        if pad:
            keys = torch.nn.functional.pad(keys, (0, 0, pad, 0))
            values = torch.nn.functional.pad(values, (0, 0, pad, 0))
        layer.update(keys, values)
    return out


class ARDecoding:
    """Continuous batching on a `BatchedAR`: requests join between steps (`add` prefills them and lines
    their keys and values up with the running rows', left-padded; positions are per row) and leave the
    step they end, which also drops their rows from later forwards."""

    def __init__(self, batcher: BatchedAR) -> None:
        self.b = batcher
        eng = batcher.engine
        self.eng = eng
        self.pad = next(iter(sorted(eng.stop_ids)), 0)
        self.newline = eng.newline_ids()
        self.cache_arg = cache_kwarg(eng.model.forward) or eng.cache_arg
        self.jobs: list[_ARJob] = []
        """The rows, in cache order; every one still decoding."""
        self.cache = None
        self.attn = torch.zeros(0, 0, dtype=torch.long)
        self.next_pos = torch.zeros(0, 1, dtype=torch.long)
        self.logits = torch.zeros(0, 0)
        """Per row, the logits its next token is picked from."""

    def __len__(self) -> int:
        return len(self.jobs)

    @torch.inference_mode()
    def add(self, items: Sequence[tuple[object, InfillRequest, ShouldCancel | None]]) -> None:
        """(key, request, should_cancel) each: prefilled now (reusing each document's cached prompt, as
        alone), their first token picked at the next `step`."""
        if not items:
            return
        eng = self.eng
        requests = [eng.heal(r) for _, r, _ in items]  # as the engine alone would
        prompts = [eng.prompt_ids(r) for r in requests]
        total = seq_bucket(max(len(p) for p in prompts))
        n = len(requests)
        x = torch.full((n, total), self.pad, dtype=torch.long, device=eng.device)
        attn = torch.zeros(n, total, dtype=torch.long, device=eng.device)
        for i, p in enumerate(prompts):
            x[i, total - len(p) :] = torch.tensor(p, device=eng.device)
            attn[i, total - len(p) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        jobs = [
            _ARJob(key, r, cancel, InfillStats(prompt_tokens=len(p), encoder_passes=1, forward_passes=1))
            for (key, _, cancel), r, p in zip(items, requests, prompts, strict=True)
        ]
        cache, logits = self.b._prefill(
            x, attn, pos, prompts, requests, [j.stats for j in jobs], self.cache_arg
        )
        for j in jobs:
            j.bars = eng.first_token_bars(j.request, logits.shape[-1])
        if self.cache is None or not self.jobs:
            self.jobs, self.cache, self.attn, self.logits = jobs, cache, attn, logits
            self.next_pos = pos[:, -1:] + 1
            return
        config = eng.model.config
        width = max(self.attn.shape[1], total)
        old, new = width - self.attn.shape[1], width - total
        merged = new_cache(config)
        ours = _rows_of_cache(config, self.cache, None, old)
        theirs = _rows_of_cache(config, cache, None, new)
        for layer, a, b in zip(merged.layers, ours.layers, theirs.layers, strict=True):
            layer.update(torch.cat([a.keys, b.keys]), torch.cat([a.values, b.values]))
        pad = torch.nn.functional.pad
        self.cache = merged
        self.attn = torch.cat([pad(self.attn, (old, 0)), pad(attn, (new, 0))])
        self.next_pos = torch.cat([self.next_pos, pos[:, -1:] + 1])
        self.logits = torch.cat([self.logits, logits])
        self.jobs += jobs

    @torch.inference_mode()
    def step(self) -> list[tuple[object, Outcome]]:
        """Every row's next token, then one forward for the rows still decoding; the (key, outcome) of
        each request that ended."""
        eng = self.eng
        ended: list[_ARJob] = []
        nxt = torch.full((len(self.jobs), 1), self.pad, dtype=torch.long, device=eng.device)
        for i, j in enumerate(self.jobs):
            req = j.request
            if j.should_cancel is not None and j.should_cancel():
                j.done = j.cancelled = True
                self.b.rows_cancelled += 1
                ended.append(j)
                continue
            row = self.logits[i].clone()
            barred: set[int] = set()
            if len(j.new) < eng.min_tokens + eng.retyped(req, j.new):
                barred = eng.stop_ids | (self.newline if req.single_line else set())
            if barred:
                row[sorted(barred)] = float("-inf")
            if not j.new and j.bars is not None:
                row[j.bars] = float("-inf")
            tok = int(row.argmax())
            if tok in eng.stop_ids:
                j.done = True
                ended.append(j)
                continue
            j.new.append(tok)
            j.picked.append(float(torch.log_softmax(row, -1)[tok]))
            if len(j.new) >= req.max_tokens or (req.single_line and tok in self.newline):
                j.done = True
                ended.append(j)
                continue
            nxt[i, 0] = tok
        live = [i for i, j in enumerate(self.jobs) if not j.done]
        if len(live) < len(self.jobs) and live:
            idx = torch.tensor(live, device=eng.device)
            self.cache = _rows_of_cache(eng.model.config, self.cache, idx)
            self.attn, self.next_pos, nxt = self.attn[idx], self.next_pos[idx], nxt[idx]
        self.jobs = [self.jobs[i] for i in live]
        if self.jobs:
            self.attn = torch.cat([self.attn, self.attn.new_ones(len(self.jobs), 1)], dim=1)
            out = eng.model(
                input_ids=nxt,
                attention_mask=self.attn,
                position_ids=self.next_pos,
                use_cache=True,
                **{self.cache_arg: self.cache},
                **eng._last,
            )
            self.b.forwards += 1
            self.next_pos = self.next_pos + 1
            self.logits = out.logits[:, -1, :].float()
            for j in self.jobs:
                j.stats.forward_passes += 1
        else:
            self.cache = None
        return [(j.key, self._finish(j)) for j in ended]

    def _finish(self, j: _ARJob) -> Outcome:
        if j.cancelled:
            return Cancelled()
        eng = self.eng
        j.stats.generated_tokens = len(j.new)
        j.stats.total_ms = (time.perf_counter() - j.t0) * 1000
        score = sum(j.picked) / len(j.picked) if j.picked else 0.0
        text = eng.tokenizer.decode(j.new, skip_special_tokens=True)
        return InfillResult(eng.unheal(j.request, [Candidate(text, score, j.new)]), j.stats)

    def fail(self) -> list[object]:
        """Drop every request (after a failed step) and return their keys."""
        keys = [j.key for j in self.jobs]
        self.jobs, self.cache = [], None
        return keys


PREFILL_SLACK = 64
"""`BatchedAR`: rows with at most this many new prompt tokens share one prefill; the rest take another."""


def batcher_for(engine):
    """The batched runner for a loaded engine, or None when its backend has no batched path (then the
    server runs its requests one at a time through `engine.infill`)."""
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.masked import MaskedDiffusionEngine

    if isinstance(engine, MaskedDiffusionEngine) and not engine.cfg.block_length:
        # a dreamon canvas changes length per row as it decodes: one request at a time, its own loop
        return None if engine.variable else BatchedMasked(engine)
    if isinstance(engine, AutoregressiveEngine):  # every layout: the prompt is the engine's `prompt_ids`
        return BatchedAR(engine)
    return None
