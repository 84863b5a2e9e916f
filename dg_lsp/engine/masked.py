"""Masked (absorbing-state) diffusion LMs: canvas `prefix [MASK]xN suffix`, unmasked by confidence.

Two families share this loop: LLaDA-style models read position i's token from logits at i, and
Dream/DiffuCoder/DreamOn-style models (trained from AR checkpoints) from logits at i-1 ("shifted").
Each step commits every masked position whose confidence clears `threshold`, and at least the
quota that lets the remaining masks finish within the remaining steps (exact integer schedule).
Once an EOS/pad is committed, every still-masked position after it is filled with EOS at once:
the span is variable-length and the tail would be trimmed anyway, so those steps are skipped.

Dual cache (Fast-dLLM): when the model's forward accepts `past_key_values`, the first step is a full
pass whose prefix and suffix keys/values are kept; later steps feed only the canvas (plus, when
shifted, the token before it) against that context. With the context unchanged this reproduces the
full pass exactly; as the canvas fills in it is an approximation (the context KV is not refreshed).
Per document, that first pass's KV is kept too: the next request (the user typed on) reuses the KV of
the common token prefix and computes only the rest. Bidirectional attention makes this approximate as
well (the kept prefix KV saw the old tail); `use_prompt_cache=False` turns it off.

Tail trimming (`trim_tail`): after a full pass, later passes recompute only the canvas up to a little past
where the model means the span to end; the masks beyond stay in the cached context. A natural stop often
uses a fifth of its canvas, and a canvas pass costs about the positions it recomputes.

Frozen front (`freeze_front`, with tail trimming on a block model): the committed tokens in front of the
frontier, once a pass has computed them from their final inputs, join the cached context, and later
passes recompute only from the frontier to the window's end.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from dg_lsp.engine import commit as commit_rules
from dg_lsp.engine import infill_format, layouts, lean, sampler, speculative
from dg_lsp.engine.base import LocalEngine, budget_prompt, prompt_budget, quiet_long_input_warning
from dg_lsp.engine.cache import LRU, common_prefix_len
from dg_lsp.engine.kv import KVSnapshot, cache_kwarg, context_joined, context_outside, new_cache, restore
from dg_lsp.engine.passes import BlockSchedule, FrozenFront, GrowingCanvas, TailWindow
from dg_lsp.engine.step import StepPlan, StepTrace, denoise_step
from dg_lsp.engine.types import Candidate, InfillRequest, InfillStats
from dg_lsp.models import native

log = logging.getLogger(__name__)

SHIFTED_HINTS = ("dream", "diffucoder")


@dataclass(frozen=True)
class MaskedSamplerConfig:
    steps: int = 12
    """Upper bound on denoising passes per canvas (also capped by the latency budget)."""
    confidence: str = "max_prob"
    """How the quota ranks masks: `max_prob`, `margin` (top-1 minus top-2), `entropy` or `leftmost`."""
    threshold: float | None = 0.9
    """Commit every position at least this confident; None = pure schedule (quota only). The `threshold`
    commit rule's parameter when `commit` names it without one."""
    commit: tuple[str, ...] | None = None
    """Parallel commit rules (`dg_lsp/engine/commit.py`), e.g. `("factor:1.0",)` or `("threshold",
    "prophet:0.6")`: each step commits the union of their picks and the schedule's quota. None = the
    `threshold` rule alone (or nothing beyond the quota when `threshold` is None)."""
    stops_in_quota: bool = False
    """Count masks that predict a stop in the per-step quota. They cannot commit away from the frontier,
    so leaving them out makes a natural-stop span commit about one token per pass; counting them spends
    the schedule on the positions that can commit. Off by default: on the 5M embedded model it cut passes
    per token from 0.63 to 0.39 but shown-and-parsing single-line completions from 55% to 14%
    (benchmarks/results/natural_stops/)."""
    min_capped_steps: int = 2
    """When the latency budget caps the steps of an automatic request, never below this: one pass over a
    fully masked canvas is a guess, not a completion. Invoked requests are never capped."""
    temperature: float = 0.7
    """Gumbel temperature for extra candidates; the first candidate is always greedy."""
    buckets: tuple[int, ...] = (8, 16, 32, 64, 128)
    logits_shift: bool | None = None
    """None = decide from the checkpoint (Dream-like names or `dg_lsp_logits_shift` in config.json)."""
    dual_cache: bool = True
    """Fast-dLLM dual cache, where the model's forward takes a KV cache: prefix/suffix KV from one full
    pass, then only the canvas is recomputed. Approximate: the context KV ignores later canvas changes."""
    refresh_every: int = 0
    """Recompute the context KV with a full pass every this many steps (0 = only at the first step)."""
    refresh_blocks: bool = False
    """With `block_length`, Fast-dLLM's dual cache: a full pass whenever decoding enters a new block (so it
    sees the earlier blocks' tokens), its KV cached for every position but that block's, and each cached
    pass recomputes only the block. Off: the context KV is the canvas's surroundings and every cached
    pass recomputes the whole canvas."""
    trim_tail: bool = True
    """With the dual cache: after each full pass, later passes recompute the canvas only up to
    `trim_margin` positions past the last one the model still means to write (not a stop and not yet a
    committed stop), keeping the masks beyond it in the cached context. A natural stop often uses a fifth
    of a 64-token canvas, and a canvas pass costs about its length. When the span outgrows the window,
    the next pass is a full one and the window is drawn again."""
    trim_margin: int = 8
    """`trim_tail`: positions kept past the predicted end of the span."""
    window_ahead: int = 0
    """`trim_tail`: when > 0, a window also ends this many positions past the frontier as the full pass
    left it (`passes.TailWindow.ahead`); once the frontier gets there, a full pass draws the next one. A
    multi-line span's model means to write most of its canvas, so its tail window trims little, yet
    decoding commits about one token a pass from the left. The masks past the window that the span still
    needs count in each step's quota (`step.denoise_step`'s `pending`). 0: the window ends at the tail."""
    freeze_front: bool = False
    """With `trim_tail` and the lean forward: once the committed tokens in front of the frontier have been
    computed from their final inputs, their keys and values join the cached context and later passes stop
    recomputing them (`passes.FrozenFront`). Decoding runs mostly left to right, so a canvas pass otherwise
    recomputes every token already written; where a pass costs about its rows (fp32 on CPUs without
    native bf16) that is much of the pass. The embedded model recommends it with `window_ahead = 8`: its
    model runs at real cursors took 1.17x less CPU on a 2-core AMD EPYC, 1.09x with this alone
    (benchmarks/results/embedded_smollm2/freeze_front/)."""
    stop_at_frontier: bool = True
    """Commit a predicted EOS/pad only at the leftmost masked position. An EOS-padded canvas makes the
    tail's EOS the most confident predictions; committed first, they talk the model into an empty span.
    Elsewhere a position predicting EOS just waits; the span ends when the frontier reaches it."""
    min_tokens: int = 1
    """Stops (EOS/pad, newline on a single line) are barred from the first this-many canvas positions. An
    empty infill shows the user nothing, yet on a fully masked canvas "empty" is often a weak model's most
    confident guess (training includes empty middles), and committed at the frontier it ends the span at
    once. 0 allows empty results."""
    block_length: int | None = None
    """Semi-autoregressive blocks (LLaDA, Fast-dLLM): unmask only inside the leftmost block that still has
    masks, each block given an even share of the steps up front (LLaDA's allotment). None = the whole
    canvas at once."""
    schedule: str = "even"
    """How many masks the quota commits per step: `even` (LLaDA: the remaining masks spread evenly over
    the remaining steps), `dream` (Dream's timestep schedule, int(n(1 - s/t)) on linspace(1, 1e-3)) or
    `one` (one per step, DreamOn's `number_transfer_tokens=1`; a fixed canvas then needs as many steps
    as masks, a `dreamon` canvas runs until it is full)."""
    format: str = "auto"
    """The canvas format (`dg_lsp/engine/infill_format.py`): `auto` (from the checkpoint), `bos`, `plain`,
    `dreamon` (variable length through `<|expand|>`/`<|delete|>`) or `chat`."""
    native_family: str | None = None
    """Load the weights natively as this family (`dream` or `llada`) whatever config.json declares: for
    relatives whose own code cannot run here (the load error names the family to try)."""
    expand_start: int = 8
    """`dreamon` format: masks the canvas starts with; it grows to the request's length at most."""
    grow_from: int = 0
    """Block-layout models (`dg_lsp_layout: block`), single-line spans: start the canvas at this many masks
    and append the rest of the span kind's canvas only when the span fills them without stopping
    (`passes.GrowingCanvas`). 0 = the whole canvas from the first pass. The embedded model recommends 16
    here and 32 for multi-line spans (its config.json): it was trained on canvases drawn among the buckets
    that hold the middle, so a canvas's length is a prior on the span's, and the span kinds' canvases
    (32 for the rest of a line, 64 at a blank line) made it write too much
    (benchmarks/results/embedded_smollm2/short_canvas/)."""
    grow_from_multiline: int = 0
    """`grow_from` for multi-line spans."""
    speculate: int = 0
    """Self-speculative denoising (`dg_lsp/engine/speculative.py`): each pass also verifies the next
    `speculate - 1` sampler steps, drafted from the previous pass's predictions, in one batched pass,
    and keeps those the sampler reproduces: the same completion in fewer passes. 0 or 1 = off. Used for
    a single candidate with the dual cache and no blocks or context refreshes; otherwise ignored."""

    @classmethod
    def from_options(
        cls, options: dict[str, Any] | None, steps: int | None = None, model_defaults: dict | None = None
    ) -> MaskedSamplerConfig:
        """Read `masked.*`-style keys, snake or camelCase (e.g. from `Settings.extra["masked"]`), ignoring
        unknown ones. `model_defaults` (`model_sampler_defaults`) sit under the user's options and `steps`."""
        from dg_lsp.settings import _snake

        raw = dict((options or {}).get("masked", options or {}))
        opts = {_snake(k): v for k, v in raw.items()}  # editors send camelCase (`blockLength`)
        defaults = {_snake(k): v for k, v in (model_defaults or {}).items()}
        if steps:
            defaults.pop("steps", None)
        opts = {**defaults, **opts}
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in opts.items() if k in known}
        if "buckets" in kwargs:
            kwargs["buckets"] = tuple(int(b) for b in kwargs["buckets"])
        if kwargs.get("commit") is not None:
            raw_rules = kwargs["commit"]
            if isinstance(raw_rules, str):  # "threshold,copy:2", as the setting may spell it
                raw_rules = [r.strip() for r in raw_rules.split(",") if r.strip()]
            kwargs["commit"] = tuple(raw_rules)
            commit_rules.parse_rules(kwargs["commit"])  # a clear error for a bad rule, at load
        if steps and "steps" not in kwargs:
            kwargs["steps"] = int(steps)
        cfg = cls(**kwargs)
        if cfg.schedule not in ("even", "dream", "one"):
            raise ValueError("masked.schedule must be 'even', 'dream' or 'one'")
        if cfg.format not in infill_format.FORMATS:
            raise ValueError(f"masked.format must be one of {infill_format.FORMATS}")
        if cfg.native_family is not None and cfg.native_family not in native.FAMILIES:
            raise ValueError(f"masked.nativeFamily must be one of {sorted(native.FAMILIES)}")
        if cfg.confidence not in sampler.CONFIDENCE_KINDS:
            raise ValueError(f"masked.confidence must be one of {sampler.CONFIDENCE_KINDS}")
        return cfg


SAMPLER_DEFAULTS_KEY = "dg_lsp_sampler"


def model_sampler_defaults(config: dict) -> dict[str, Any]:
    """The sampler options a checkpoint's config.json recommends under `dg_lsp_sampler` (the embedded
    model decodes best left to right: `{"confidence": "leftmost"}`), checked against the same bounds as the
    user's `masked` setting; an invalid entry is logged and left out, never a reason not to load."""
    from dg_lsp.settings import _masked

    value = config.get(SAMPLER_DEFAULTS_KEY)
    if value is None:
        return {}
    try:
        kept, problems = _masked(value, {})
    except ValueError as exc:
        log.warning("config.json %s ignored: %s", SAMPLER_DEFAULTS_KEY, exc)
        return {}
    for problem in problems:
        log.warning("config.json %s: %s (left out)", SAMPLER_DEFAULTS_KEY, problem)
    return kept


def detect_logits_shift(config: dict) -> bool:
    if "dg_lsp_logits_shift" in config:
        return bool(config["dg_lsp_logits_shift"])
    names = [str(a).lower() for a in config.get("architectures") or []] + [
        str(config.get("model_type", "")).lower()
    ]
    return any(h in n for n in names for h in SHIFTED_HINTS)


class MaskedDiffusionEngine(LocalEngine):
    name = "masked"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        max_prompt_tokens: int = 1024,
        quantization: str = "none",
        trust_remote_code: bool = False,
        sampler: MaskedSamplerConfig | None = None,
        use_continuation_cache: bool = True,
        dtype: str = "auto",
    ):
        super().__init__(use_continuation_cache=use_continuation_cache, use_prompt_cache=True)
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

        from dg_lsp.engine import quantization as quant

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        raw = json.loads((self.model_dir / "config.json").read_text())
        self.cfg = sampler or MaskedSamplerConfig()
        self.quantization = quant.resolve_kind(quantization, self.device)
        self.layout = layouts.layout_of(raw)
        tok_cfg = native.tokenizer_config(self.model_dir)
        gen_cfg = infill_format.read_json(self.model_dir / "generation_config.json")
        # Dream family / LLaDA: built-in layers, no code from the model directory (dg_lsp/models/native.py)
        self.family = None
        if self.layout == "native":
            self.family = self.cfg.native_family or native.family_of(self.model_dir, raw)
        self.variant = native.variant_from_config(raw, tok_cfg) if self.family else None
        shift = native.FAMILIES[self.family].logits_shift if self.family else detect_logits_shift(raw)
        self.shift = self.cfg.logits_shift if self.cfg.logits_shift is not None else shift
        kwargs: dict[str, Any] = {
            "trust_remote_code": trust_remote_code,
            "dtype": quant.resolve_dtype(dtype, self.device, self.model_dir),
        }
        if self.quantization in ("8bit", "nf4"):
            kwargs["quantization_config"] = quant.bnb_config(self.quantization, skip=["lm_head", "decoder"])
            kwargs["device_map"] = str(self.device)
        trust = trust_remote_code
        if self.family:
            self.tokenizer = native.load_tokenizer(self.model_dir)  # never the directory's code
        elif self.layout in layouts.PACKED_LAYOUTS:
            self.tokenizer = layouts.load_packed_tokenizer(self.model_dir)
        else:
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=trust)
            except Exception as exc:
                _remote_failure(exc, raw, trust)
                raise
        archs = [str(a) for a in raw.get("architectures") or []]
        loader = AutoModel  # LLaDA/Dream remote code maps AutoModel to their LM class
        if any(a.endswith("ForMaskedLM") for a in archs):
            loader = AutoModelForMaskedLM
        elif any(a.endswith("ForCausalLM") for a in archs):  # a decoder class run bidirectionally
            loader = AutoModelForCausalLM
        if self.layout in layouts.PACKED_LAYOUTS:
            self.model = layouts.load_packed_model(
                self.model_dir, layouts.packed_dtype(self.device) if dtype == "auto" else kwargs["dtype"]
            )
        elif self.family:
            if self.quantization in ("8bit", "nf4"):
                raise ValueError(f"quantization {self.quantization!r} is not available for native models")
            self.model = native.load_native(self.model_dir, dtype=kwargs["dtype"], family=self.family)
        else:
            try:
                self.model = loader.from_pretrained(self.model_dir, **kwargs).eval()
            except Exception as exc:
                _remote_failure(exc, raw, trust)
                raise
        lean_int8 = lean.int8_capable(self.model, self.quantization, self.device)
        if self.quantization == "int8" and not lean_int8:
            quant.quantize_linears_int8_(self.model, skip=["decoder", "lm_head"])
        if self.quantization not in ("8bit", "nf4"):
            self.model.to(self.device)
        self.model, self.forward_kind = lean.adopt(self.model, self.tokenizer, int8=lean_int8)
        self.forward_kind = lean.adopt_int4(
            self.model, self.tokenizer, quantization, self.forward_kind, by_default=False
        )
        if getattr(self.model, "int4", None) is not None:
            self.quantization = "int4"  # what `describe()` reports: `auto` took it
        self.logits_vocab = int(getattr(self.model.config, "vocab_size", None) or len(self.tokenizer))
        """Width of the logits (a packed model scores its base vocabulary, not its added tokens)."""
        self.token_healing = True
        mask_id = self.tokenizer.mask_token_id
        if mask_id is None:
            mask_id = raw.get("mask_token_id")
        if mask_id is None and self.family:
            mask_id = native.FAMILIES[self.family].mask_token_id
        if mask_id is None:
            raise ValueError("masked backend: the tokenizer/config defines no mask token")
        self.mask_id = int(mask_id)
        self.edits = infill_format.edit_tokens(self.tokenizer, gen_cfg) if self.family else None
        fmt = self.cfg.format
        if fmt == "auto":
            fmt = infill_format.detect_format(self.family, self.variant, self.edits)
        if fmt == "dreamon" and self.edits is None:
            raise ValueError("masked.format 'dreamon' needs <|expand|> and <|delete|> in the tokenizer")
        self.format = fmt
        self.variable = fmt == "dreamon"
        """The canvas grows and shrinks (DreamOn's expand/delete tokens)."""
        bos = self.tokenizer.bos_token_id
        self.bos = [int(bos)] if bos is not None and fmt in ("bos", "dreamon") else []
        if self.layout == "block":
            self.bos = []
        exclude = {self.mask_id, *(self.edits or ())}
        self.stop_ids = infill_format.stop_ids(self.tokenizer, raw, gen_cfg, bool(self.family), exclude)
        eos = self.tokenizer.eos_token_id
        self.fill_id = int(eos if eos is not None else min(self.stop_ids, default=self.mask_id))
        self.dual_error: str | None = None
        """Why the model's forward rejected the KV cache, once it has."""
        self.max_prompt_tokens = prompt_budget(self.tokenizer, max_prompt_tokens)
        quiet_long_input_warning(self.tokenizer)
        self.cache_arg = cache_kwarg(self.model.forward)
        self.supports_kv = self.cache_arg is not None
        params = inspect.signature(self.model.forward).parameters
        self.slices_logits = "logits_to_keep" in params
        open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if self.supports_kv and "position_ids" not in params and not open_kwargs:
            # LLaDA's own code: a KV cache, but positions always counted from the cache's length, so the
            # canvas-only pass (between prefix and suffix) would get the suffix's positions
            self.supports_kv = False
            self.dual_error = f"{type(self.model).__name__}.forward takes a KV cache but no position_ids"
        self.prompt_cache: LRU[KVSnapshot] = LRU(8)
        self._last_full = None
        self._last_cached = None
        """The cache of the last canvas-only pass: its context, then the rows it computed."""
        self.ms_per_step: float | None = None
        self.last_commits: list[int] = []
        """Positions committed per step in the last request (row 0), for tests and benchmarks."""
        self.last_windows: list[int] = []
        """Canvas positions each pass of the last request recomputed (fewer than the canvas when trimmed)."""
        self.last_lengths: list[int] = []
        """`dreamon` format: the canvas length before the first step and after each (row 0)."""
        self.step_observer: Callable[[StepTrace], None] | None = None
        """Called after every step of the fixed-canvas loop with what the sampler saw and did: for tools
        that study the sampler (`benchmarks/commit_oracle.py`) without copying its loop. The
        self-speculative path (`masked.speculate`) does not report."""

    def rule_specs(self) -> list[tuple[str, float]]:
        cfg = self.cfg
        if cfg.commit is None:
            return [] if cfg.threshold is None else [("threshold", float(cfg.threshold))]
        specs = commit_rules.parse_rules(cfg.commit)
        bare = {s for s in cfg.commit if ":" not in str(s)}  # "threshold" alone reads `threshold`
        own = cfg.threshold is not None and "threshold" in bare
        return [(n, float(cfg.threshold)) if n == "threshold" and own else (n, v) for n, v in specs]

    def surroundings(self, ids: list[int], start: int, length: int) -> commit_rules.Surroundings | None:
        """The prompt's text tokens around a canvas at `start`, for the `copy` commit rule; None when no
        configured rule reads them (most requests: the walk costs nothing then)."""
        if not any(name == "copy" for name, _ in self.rule_specs()):
            return None
        special = self._special_ids
        head = [t for t in ids[:start] if t not in special and t < self.logits_vocab]
        tail = [t for t in ids[start + length :] if t not in special and t < self.logits_vocab]
        return commit_rules.Surroundings(tuple(head + tail), tuple(head[-16:]))

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(int(i) for i in self.tokenizer.all_special_ids) | {self.mask_id}

    def describe(self) -> dict[str, str]:
        return {
            **super().describe(),
            "commit": ",".join(f"{n}:{v:g}" for n, v in self.rule_specs()) or "quota only",
            "layout": self.layout,
            "logits_shift": str(self.shift),
            "confidence": self.cfg.confidence,
            "threshold": str(self.cfg.threshold),
            "dual_cache": str(self.dual_on()),
            "format": self.format,
            **({"native_family": self.family} if self.family else {}),
            **({"variant": self.variant} if self.variant else {}),
            **({"speculate": str(self.cfg.speculate)} if self.cfg.speculate > 1 else {}),
            **({"freeze_front": str(self.freezes_front())} if self.cfg.freeze_front else {}),
            **({"window_ahead": str(self.cfg.window_ahead)} if self.cfg.window_ahead else {}),
            **({} if self.dual_on() else {"dual_cache_off": self.dual_cache_off()}),
        }

    def freezes_front(self) -> bool:
        """`freeze_front` applies: asked for, with tail trimming (whose windows it narrows) and the dual
        cache, and the forward is the lean one of a block model, whose canvas-only pass attends to the
        whole context without a mask (so frozen rows may join it in any order; a causal canvas pass would
        read their order)."""
        from dg_lsp.engine.lean_llama import LeanLlama

        block_model = isinstance(self.model, LeanLlama) and self.model.block_id is not None
        return self.cfg.freeze_front and self.cfg.trim_tail and self.dual_on() and block_model

    def dual_on(self) -> bool:
        return self.cfg.dual_cache and self.supports_kv and not self.variable

    def dual_cache_off(self) -> str:
        """Why the dual cache is off, for `doctor` and the stats."""
        if not self.cfg.dual_cache:
            return "masked.dualCache is false"
        if self.variable:
            return (
                "the dreamon format grows and shrinks the canvas, which moves the suffix's positions "
                "(its cached keys would be wrong); every step is a full pass"
            )
        if self.dual_error:
            return f"the canvas-only pass cannot run here ({self.dual_error}); each step is a full pass"
        return "this model's forward takes no KV cache; every step is a full pass"

    def warmup(self) -> None:
        self.newline_ids()  # per-model tables, built here rather than on the first keystroke
        self.blank_start_ids()
        self.infill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n", max_tokens=8))
        self.reset_caches()

    def reset_caches(self) -> None:
        super().reset_caches()
        self.prompt_cache.clear()

    def canvas(self, request: InfillRequest, length: int) -> tuple[list[int], int]:
        """Token ids in the checkpoint's format (`[bos] prefix [MASK]*length suffix`, see
        `infill_format`; block layout: the SPM prompt, then the masks) and the index of the first mask."""
        pre = self.tokenizer.encode(request.prefix, add_special_tokens=False)
        suf = self.tokenizer.encode(request.suffix, add_special_tokens=False)
        pre, suf = budget_prompt(pre, suf, max(8, self.max_prompt_tokens - length))
        if self.layout == "block":
            head = layouts.spm_ids(self.tokenizer, pre, suf)
            return head + [self.mask_id] * length, len(head)
        if self.format == "chat":
            dec = self.tokenizer.decode
            head = infill_format.chat_head(self.tokenizer, dec(pre), dec(suf))
            return head + [self.mask_id] * length, len(head)
        head = self.bos + pre
        tail = [*suf, self.fill_id] if self.format == "dreamon" else suf
        return head + [self.mask_id] * length + tail, len(head)

    def _keep(self, first: int, length: int, total: int) -> dict[str, Any]:
        """`logits_to_keep` for positions first..first+length-1 of a `total`-long chunk: the output head
        is a large share of a pass, and only canvas logits are read."""
        if not self.slices_logits or (first == 0 and length == total):
            return {}
        if first + length == total:
            return {"logits_to_keep": length}
        return {"logits_to_keep": torch.arange(first, first + length, device=self.device)}

    def _canvas_logits(
        self,
        x: torch.Tensor,
        start: int,
        length: int,
        ctx: list | None,
        refresh: bool,
        doc: tuple[KVSnapshot | None, int] = (None, 0),
        window: tuple[int, int] | None = None,
        pad: bool = True,
    ):
        """Logits for the canvas positions; (logits, ctx). A full pass when `ctx` is None or `refresh`
        (returning fresh context KV when the dual cache is on), else a canvas-only pass against `ctx`.
        `doc` = (snapshot, keep): the first `keep` positions' KV from this document's previous request,
        reused instead of recomputed in that full pass (approximate, like the dual cache itself).
        `window` = (a, b), canvas positions of the current block (Fast-dLLM's dual cache with blocks): the
        context KV then holds every other position, later blocks' masks included, and a cached pass
        recomputes only the block; the logits of positions outside it are zero (the sampler never reads
        them: it commits only inside the block), or, when `pad` is off, those past b are left out (a tail
        window (0, b), or (a, b) behind a frozen front: the sampler's step reads the first b positions
        alone, and the frozen ones are committed)."""
        a, b = window or (0, length)
        canvas_lo = start - 1 if self.shift else start  # shifted: the token before predicts the first
        lo, hi = canvas_lo + a, start + b
        dual = self.dual_on()
        if dual and ctx is not None and not refresh:
            cache = new_cache(self.model.config, record=False)
            for layer, (k, v) in zip(cache.layers, ctx, strict=True):
                layer.update(k, v)
            pos = torch.arange(lo, hi, device=self.device).unsqueeze(0)
            keep = self._keep(0, b - a, hi - lo)
            kw = {self.cache_arg: cache, **keep}
            logits = self.model(input_ids=x[:, lo:hi], position_ids=pos, **kw).logits[:, : b - a]
            self._last_cached = cache
            if window is None or (not pad and a == 0):
                return logits, ctx
            out = logits.new_zeros(logits.shape[0], length if pad else b, logits.shape[-1])
            out[:, a:b] = logits
            return out, ctx
        if dual:
            try:
                snap, keep = doc
                keep = min(keep, canvas_lo) if snap is not None else 0
                cache = restore(self.model.config, snap, keep, batch=x.shape[0])
                pos = torch.arange(keep, x.shape[1], device=self.device).unsqueeze(0)
                first = canvas_lo - keep  # the whole canvas's logits, whatever the window
                sliced = self._keep(first, length, x.shape[1] - keep)
                logits = self.model(
                    input_ids=x[:, keep:], position_ids=pos, **{self.cache_arg: cache}, **sliced
                ).logits
                if sliced:
                    first = 0
                self._last_full = cache
                return logits[:, first : first + length], context_outside(cache, lo, hi)
            except Exception as exc:  # remote code with its own cache format: fall back for good
                log.warning("masked: dual cache unsupported by this model (%s); using full passes", exc)
                self.supports_kv = False
                self.dual_error = f"{type(exc).__name__}: {str(exc)[:200]}"
        sliced = self._keep(canvas_lo, length, x.shape[1])
        logits = self.model(input_ids=x, **sliced).logits
        return (logits[:, :length] if sliced else logits[:, canvas_lo : canvas_lo + length]), None

    def _generate(self, request: InfillRequest, check, stats: InfillStats) -> list[Candidate]:
        if self.variable:
            return self._generate_variable(request, check, stats)
        cfg = self.cfg
        full = sampler.bucket(request.max_tokens, cfg.buckets)
        block = cfg.block_length if cfg.block_length and cfg.block_length < full else None
        batch = max(1, request.num_candidates)
        speculating = cfg.speculate > 1 and batch == 1 and not block and not cfg.refresh_every
        speculating = speculating and self.dual_on()
        grow = self.growing(full, request.single_line, block, speculating)
        length = grow.first if grow is not None else full
        ids, start = self.canvas(request, length)
        stats.prompt_tokens = len(ids) - length
        steps = min(max(1, request.steps or cfg.steps), full)
        if request.deadline_ms is not None and self.ms_per_step:
            capped = sampler.cap_steps(steps, 0.0, self.ms_per_step, request.deadline_ms)
            steps = max(capped, min(steps, cfg.min_capped_steps))
        blocks = BlockSchedule.make(steps, length, block) if block else None
        if blocks is not None:
            steps = blocks.steps  # at least one pass per block
        stats.step_cap = steps
        rules = commit_rules.build(self.rule_specs())  # from cfg per request: settings may change it
        gen = torch.Generator(device=self.device).manual_seed(int(request.seed))
        x = torch.tensor([ids] * batch, device=self.device)
        span = slice(start, start + length)
        masked = torch.ones(batch, length, dtype=torch.bool, device=self.device)
        logp_sum = torch.zeros(batch, device=self.device)
        logp_n = torch.zeros(batch, device=self.device)
        self.last_commits, self.last_windows = [], []
        # single-line spans: the caller cuts at the first newline, so masks after one are tail as well
        stops = self.stop_ids | (self.newline_ids() if request.single_line else set())
        stop_tensor = torch.tensor(sorted(stops) or [-1], device=self.device)
        blank_start = self.first_token_bars(request, self.logits_vocab)
        healed = self.fragment_ids(request)
        near = self.surroundings(ids, start, length)
        around = None if near is None else [near] * batch
        ctx = None
        tail = (
            TailWindow(cfg.trim_margin, ahead=cfg.window_ahead)
            if cfg.trim_tail and self.dual_on() and not block
            else None
        )
        front = FrozenFront(int(self.shift)) if tail is not None and self.freezes_front() else None
        doc: tuple[KVSnapshot | None, int] = (None, 0)
        reuse = self.use_prompt_cache and self.dual_on()
        if reuse and (snap := self.prompt_cache.get(request.doc_key)) is not None:
            doc = (snap, common_prefix_len(snap.ids, ids))
        again = _Again(self.layout == "block", start - int(self.shift))
        if speculating:
            logp_sum, logp_n = self._speculate(
                request, check, stats, x, ids, start, length, masked, steps, rules, stops, stop_tensor,
                blank_start, healed, tail, doc, reuse, around, again,
            )  # fmt: skip
            steps = 0  # decoded: the step-by-step loop below has nothing left to do
        t_start = time.perf_counter()
        with torch.inference_mode():
            step = -1
            while (step := step + 1) < steps:
                check()
                t0 = time.perf_counter()
                refresh = bool(cfg.refresh_every) and step % cfg.refresh_every == 0
                window = None
                if blocks is not None and cfg.refresh_blocks:
                    refresh = refresh or blocks.moved(step, masked)
                    if self.layout != "block":  # a block model's canvas is one bidirectional chunk
                        window = blocks.window(masked)
                if window is None and tail is not None and ctx is not None and not refresh:
                    window = tail.window()
                    if front is not None and 0 < front.rows < (length if window is None else window[1]):
                        window = (front.rows, length if window is None else window[1])
                self._last_full = None
                logits, ctx = self._canvas_logits(
                    x, start, length, ctx, refresh, doc if step == 0 else again.doc, window, pad=bool(block)
                )
                full_pass = self._last_full is not None
                seen = masked.clone() if front is not None else None
                self.last_windows.append(length if full_pass or window is None else window[1] - window[0])
                if step == 0 and full_pass:
                    self._after_first_pass(stats, request, ids, start, doc, reuse, again)
                stats.forward_passes += 1
                plan, region = StepPlan(step, steps, steps - step), None
                if blocks is not None:
                    plan, region = blocks.plan(masked)
                canvas = x[:, span]
                before = masked.clone() if self.step_observer is not None else None
                scored = logits.float()
                done = denoise_step(
                    cfg,
                    rules,
                    scored,
                    canvas,
                    masked,
                    stops,
                    stop_tensor,
                    self.fill_id,
                    plan,
                    gen=gen,
                    blank_start=blank_start,
                    window_end=window[1] if window is not None and not block else None,
                    region=region,
                    healed=healed,
                    around=around,
                    pending=tail.pending(masked) if tail is not None and window is not None else None,
                )
                pred = done.pred
                if before is not None:
                    self.step_observer(StepTrace(step, scored, before, done))
                logp_sum += done.logp_gain
                logp_n += done.commit.sum(dim=-1)
                self.last_commits.append(int(done.commit[0].sum()))
                x[:, span] = canvas
                frozen = front.rows if front is not None else 0
                if front is not None:
                    a, b = (0, length) if full_pass or window is None else window
                    front.after_pass(seen, masked, (a, b + int(self.shift)))
                if tail is not None and full_pass:
                    end = tail.after_full_pass(canvas, masked, pred, stop_tensor)
                    if end is not None or (front is not None and front.rows):
                        # the context: everything but the positions later passes recompute
                        lo = start - int(self.shift) + (front.rows if front is not None else 0)
                        ctx = context_outside(self._last_full, lo, start + (length if end is None else end))
                elif tail is not None and tail.outgrew(masked):
                    ctx = None  # a full pass next, then a new window
                elif front is not None and front.rows > frozen and ctx is not None:
                    joined = context_joined(self._last_cached, ctx, front.rows - frozen)
                    if joined is None:
                        front.rows = frozen  # this cache cannot take them: keep recomputing those rows
                    else:
                        ctx = joined
                self._note_step_ms((time.perf_counter() - t0) * 1000)
                if grow is not None and grow.needed(canvas, masked, stop_tensor):
                    elapsed = (time.perf_counter() - t_start) * 1000
                    more = grow.extra_steps(steps, length, elapsed, self.ms_per_step, request.deadline_ms)
                    grown, masked = grow.extend(x[:, span], masked, self.mask_id, stops, self.fill_id)
                    x, length = torch.cat([x[:, :start], grown], dim=1), grow.full  # the canvas comes last
                    span = slice(start, start + length)
                    steps, stats.step_cap = step + 1 + more, stats.step_cap + more
                    ctx = None  # the next pass computes the grown canvas against the prompt's KV
                    if tail is not None:
                        tail = TailWindow(cfg.trim_margin, ahead=cfg.window_ahead)
                    continue
                if not masked.any():
                    stats.early_exit = step + 1 < steps
                    break
        cands = []
        for b in range(batch):
            row = x[b, span].tolist()
            new = sampler.trim_at_stop(row, self.stop_ids | {self.mask_id})[: request.max_tokens]
            stopped = sampler.stopped_at(row, len(new), self.stop_ids)
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            score = float(logp_sum[b] / logp_n[b]) if logp_n[b] > 0 else 0.0
            cands.append(Candidate(text=text, mean_logprob=score, token_ids=new, stopped=stopped))
            stats.generated_tokens = max(stats.generated_tokens, len(new))
        return cands

    def growing(
        self, length: int, single_line: bool, block: int | None = None, speculating: bool = False
    ) -> GrowingCanvas | None:
        """A request's canvas growth (`grow_from`, `grow_from_multiline`): only where masks can be appended
        and the pass after recomputes the canvas alone against exact prompt keys and values (block layout,
        one block, the dual cache), and not under self-speculation, which plans its passes on a fixed
        canvas."""
        if self.layout != "block" or block is not None or speculating or not self.dual_on():
            return None
        first = self.cfg.grow_from if single_line else self.cfg.grow_from_multiline
        return GrowingCanvas.make(first, length)

    def _after_first_pass(
        self, stats, request, ids: list[int], start: int, doc, reuse: bool, again: _Again
    ) -> None:
        """A request's first full pass: count the prompt KV it took from the document's previous request,
        and keep this prompt's KV (one snapshot) for the next request and for this one's later full passes."""
        stats.reused_prompt_tokens = min(doc[1], start - 1 if self.shift else start)
        keep_doc = reuse and request.doc_key is not None
        if not (keep_doc or again.exact_prompt):
            return
        snap = _row0_snapshot(self._last_full, ids)
        if keep_doc:
            self.prompt_cache.put(request.doc_key, snap)
        again.keep(snap)

    def _note_step_ms(self, ms: float) -> None:
        """The running ms per denoising step that the latency budget's step cap reads."""
        self.ms_per_step = ms if self.ms_per_step is None else 0.7 * self.ms_per_step + 0.3 * ms

    def _speculate(
        self, request, check, stats, x, ids, start, length, masked, steps, rules, stops, stop_tensor,
        blank_start, healed, tail, doc, reuse, around, again,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`_generate`'s step loop for one row, several steps per pass (`speculative.py`): passes are
        planned as that loop plans them (a full pass first and whenever the tail window is outgrown,
        windowed passes against the cached context otherwise), so every state it keeps is one that loop
        reaches. Writes the result into `x`; returns (summed log-probability, tokens committed)."""
        cfg = self.cfg
        span = slice(start, start + length)
        shift = int(self.shift)

        def advance(logits: torch.Tensor, st: speculative.State):
            canvas, left = st.canvas.clone(), st.masked.clone()
            w = logits.shape[-2]
            done = denoise_step(
                cfg, rules, logits.clone(), canvas, left, stops, stop_tensor, self.fill_id,
                StepPlan(st.step, steps, steps - st.step), blank_start=blank_start,
                window_end=w if w < length else None, healed=healed, around=around,
                pending=tail.pending(left) if tail is not None and w < length else None,
            )  # fmt: skip
            return speculative.State(canvas, left, st.step + 1), done

        def needs_full_pass(st: speculative.State) -> bool:
            return tail is not None and tail.end is not None and sampler.outgrown(st.masked, tail.end)

        logp_sum = torch.zeros(1, device=self.device)
        logp_n = torch.zeros(1, device=self.device)
        st = speculative.State(x[:, span].clone(), masked.clone(), 0)
        ctx, src = None, None
        with torch.inference_mode():
            while not st.finished and st.step < steps:
                check()
                t0 = time.perf_counter()
                full = ctx is None
                if full:
                    x[:, span] = st.canvas
                    self._last_full = None
                    first_doc = doc if st.step == 0 else again.doc
                    lg, ctx = self._canvas_logits(x, start, length, None, False, first_doc)
                    if st.step == 0 and self._last_full is not None:
                        self._after_first_pass(stats, request, ids, start, doc, reuse, again)
                    chain, rows = [], [st]
                    self.last_windows.append(length)
                else:
                    chain = speculative.draft(advance, src, st, cfg.speculate - 1, steps, needs_full_pass)
                    # finished states and those at the step cap take no step, so need no logits
                    rows = [st, *(c for c in chain if not c.finished and c.step < steps)]
                    xb = x[:1].repeat(len(rows), 1)
                    for i, row in enumerate(rows):
                        xb[i, span] = row.canvas[0]
                    n = len(rows)
                    ctx_b = [(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in ctx]
                    window = tail.window() if tail is not None else None
                    lg, _ = self._canvas_logits(xb, start, length, ctx_b, False, (None, 0), window, pad=False)
                    self.last_windows.append(lg.shape[1])
                stats.forward_passes += 1
                per_row = [lg[i : i + 1].float() for i in range(len(rows))]
                taken, src = speculative.walk(advance, st, per_row, chain)
                for _, done in taken:
                    logp_sum += done.logp_gain
                    logp_n += done.commit.sum(dim=-1)
                self.last_commits.append(sum(int(done.commit[0].sum()) for _, done in taken))
                if full and tail is not None:
                    first, done = taken[0]
                    if tail.after_full_pass(first.canvas, first.masked, done.pred, stop_tensor) is not None:
                        ctx = context_outside(self._last_full, start - shift, start + tail.end)
                st = taken[-1][0]
                if not full and tail is not None and tail.outgrew(st.masked):
                    ctx = None  # a full pass next, then a new window
                self._note_step_ms((time.perf_counter() - t0) * 1000 / len(taken))
        x[:, span] = st.canvas
        masked.copy_(st.masked)
        stats.early_exit = st.finished and st.step < steps
        return logp_sum, logp_n

    def _generate_variable(self, request: InfillRequest, check, stats: InfillStats) -> list[Candidate]:
        """The `dreamon` format: the canvas starts at `expand_start` masks and each step's commits may grow
        it (`<|expand|>` -> two masks, up to the request's length) or end it (`<|delete|>`, or a stop).
        One row at a time, each a full pass per step: rows would differ in length, and a moved suffix
        invalidates any cached keys. The quota, commit rules and stop rules are the fixed canvas's."""
        cfg = self.cfg
        assert self.edits is not None
        expand_id, delete_id = self.edits
        max_len = sampler.bucket(request.max_tokens, cfg.buckets)
        length = max(1, min(cfg.expand_start, max_len))
        ids, start = self.canvas(request, length)
        head, tail = ids[:start], ids[start + length :]
        stats.prompt_tokens = len(ids) - length
        steps = min(max(1, request.steps or cfg.steps), max_len)
        if request.deadline_ms is not None and self.ms_per_step:
            capped = sampler.cap_steps(steps, 0.0, self.ms_per_step, request.deadline_ms)
            steps = max(capped, min(steps, cfg.min_capped_steps))
        stats.step_cap = steps
        rules = commit_rules.build(self.rule_specs())
        gen = torch.Generator(device=self.device).manual_seed(int(request.seed))
        stops = self.stop_ids | (self.newline_ids() if request.single_line else set())
        # a delete ends the span like a stop: barred from the first positions, committed at the frontier
        ends = torch.tensor(sorted(stops | {delete_id}), device=self.device)
        blank_start = self.first_token_bars(request, self.logits_vocab)
        self.last_commits, self.last_lengths = [], [length]
        cands = []
        with torch.inference_mode():
            for row in range(max(1, request.num_candidates)):
                canvas, masked = [self.mask_id] * length, [True] * length
                logp_sum, logp_n = 0.0, 0
                # each pass commits at least one mask and the canvas grows only up to max_len: bounded
                for step in range(2 * max_len + steps):
                    if not any(masked):
                        break
                    check()
                    t0 = time.perf_counter()
                    x = torch.tensor([head + canvas + tail], device=self.device)
                    logits, _ = self._canvas_logits(x, start, len(canvas), None, refresh=False)
                    logits = logits.float()
                    if cfg.min_tokens > 0:
                        logits[:, : cfg.min_tokens, ends] = -1e9
                    if blank_start is not None:
                        logits[:, 0, blank_start] = -1e9
                    # the step budget spent (`one` has none: it runs as DreamOn does, until full), the
                    # canvas stops growing and the quota takes every mask left
                    final = cfg.schedule != "one" and step >= steps - 1
                    if len(canvas) >= max_len or final:
                        logits[:, :, expand_id] = -1e9
                    stats.forward_passes += 1
                    logp = torch.log_softmax(logits, dim=-1)
                    scores = logp
                    if row > 0:  # rows after the first draw alternatives (Gumbel-max sampling)
                        u = torch.rand(scores.shape, generator=gen, device=self.device).clamp_(1e-9, 1 - 1e-9)
                        scores = scores / cfg.temperature - torch.log(-torch.log(u))
                    pred = scores.argmax(dim=-1)
                    conf = sampler.confidence(logits, cfg.confidence, logp=logp)
                    m = torch.tensor([masked], device=self.device)
                    active = m
                    if cfg.stop_at_frontier:
                        active = m & (sampler.frontier(m) | ~torch.isin(pred, ends))
                    pool = m if cfg.stops_in_quota else active
                    n_pool = int(pool.sum())
                    if cfg.schedule == "one":  # DreamOn's own decoding: one token per step
                        need = 1
                    elif final:
                        need = n_pool
                    elif cfg.schedule == "dream":
                        need = sampler.dream_quota(n_pool, min(step, steps - 1), steps)
                    else:
                        need = sampler.quota(n_pool, max(1, steps - step))
                    at_quota = sampler.select_commits(conf, active, need, None)
                    view = commit_rules.view(logits, active, logp=logp)
                    commit = commit_rules.select(view, rules, at_quota)[0]
                    picked = logp[0].gather(-1, pred[0][:, None]).squeeze(-1)
                    for i in commit.nonzero().flatten().tolist():
                        canvas[i], masked[i] = int(pred[0, i]), False
                        logp_sum, logp_n = logp_sum + float(picked[i]), logp_n + 1
                    if row == 0:
                        self.last_commits.append(int(commit.sum()))
                    canvas, masked = sampler.apply_edits(
                        canvas, masked, self.mask_id, expand_id, delete_id, max_len, stops
                    )
                    if row == 0:
                        self.last_lengths.append(len(canvas))
                    self._note_step_ms((time.perf_counter() - t0) * 1000)
                out = [t for t, mk in zip(canvas, masked, strict=True) if not mk]
                new = sampler.trim_at_stop(out, stops | {self.mask_id, expand_id, delete_id})
                new = new[: request.max_tokens]
                text = self.tokenizer.decode(new, skip_special_tokens=True)
                score = logp_sum / logp_n if logp_n else 0.0
                cands.append(Candidate(text=text, mean_logprob=score, token_ids=new))
                stats.generated_tokens = max(stats.generated_tokens, len(new))
        return cands


def _remote_failure(exc: BaseException, config: dict, trusted: bool) -> None:
    """Raise the one clear message when a checkpoint's own code failed because it cannot run here."""
    message = native.remote_code_failure(exc, config) if trusted else None
    if message is not None:
        from dg_lsp.engine.loader import ModelLoadError

        raise ModelLoadError(message) from exc


@dataclass
class _Again:
    """What a request's later full passes (its span outgrew the tail window, or a context refresh) may take
    from its first one. A block model reads its prompt causally, so the prompt's keys and values do not
    depend on the canvas: those passes recompute only the block, with the same result as recomputing
    everything (~300 prompt tokens, several canvas passes' worth). Other layouts' prompts attend to the
    canvas, so their full passes stay full."""

    exact_prompt: bool
    prompt_len: int
    """Positions before the first one a pass recomputes (the canvas, or the token before it when shifted)."""
    doc: tuple[KVSnapshot | None, int] = (None, 0)

    def keep(self, snap: KVSnapshot) -> None:
        """`snap`: the first pass's keys and values (row 0)."""
        if self.exact_prompt:
            self.doc = (snap, self.prompt_len)


def _row0_snapshot(cache, ids: list[int]) -> KVSnapshot:
    """Batch row 0 of a full-pass cache (prefix and suffix are the same in every row at the first step)."""
    return KVSnapshot(
        ids=list(ids),
        keys=[layer.keys[:1] for layer in cache.layers],
        values=[layer.values[:1] for layer in cache.layers],
    )
