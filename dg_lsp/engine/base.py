"""What every local backend shares: the suggestion-continuation shortcut, timing, ranking, prompt budget.

Backends implement `_generate(request, should_cancel, stats)` and return unranked candidates; this class
wraps them with the parts that must behave the same whichever model runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from dg_lsp.engine import healing
from dg_lsp.engine.cache import ContinuationCache
from dg_lsp.engine.sampler import rank_candidates
from dg_lsp.engine.types import Cancelled, Candidate, InfillRequest, InfillResult, InfillStats, ShouldCancel


def _never() -> bool:
    return False


def checked(should_cancel: ShouldCancel | None) -> Callable[[], None]:
    """A callable that raises `Cancelled` once `should_cancel()` is true; called between steps."""
    fn = should_cancel or _never

    def check() -> None:
        if fn():
            raise Cancelled()

    return check


def budget_prompt(
    pre: list[int], suf: list[int], budget: int, chunk: int = 64
) -> tuple[list[int], list[int]]:
    """Fit prefix+suffix tokens into `budget`, keeping the suffix short and cutting the prefix's head in
    `chunk`-token steps, so the kept prefix start stays put while the user types and the cache still hits.
    """
    keep_suf = min(len(suf), max(0, budget // 4))
    room = max(0, budget - keep_suf)
    if len(pre) > room:
        drop = len(pre) - room
        drop = min(len(pre), -(-drop // chunk) * chunk)
        pre = pre[drop:]
    return pre, suf[:keep_suf]


def prompt_budget(tokenizer, requested: int) -> int:
    """Never feed a model more prompt than it was trained on: a small model trained on short windows
    degrades sharply past them. HF leaves `model_max_length` huge when the tokenizer does not know it."""
    trained = getattr(tokenizer, "model_max_length", None)
    if isinstance(trained, int) and 0 < trained < 1_000_000:
        return min(requested, trained)
    return requested


LONG_INPUT_WARNING = "sequence-length-is-longer-than-the-specified-maximum"
"""The key under which a transformers tokenizer records that it has warned about a long input."""


def quiet_long_input_warning(tokenizer) -> None:
    """Engines encode a request's whole prefix and suffix, then cut them to the prompt budget
    (`budget_prompt`). The packed models record that budget as `model_max_length`, so transformers warned
    on the first long file that "running this sequence through the model will result in indexing errors":
    false here, and alarming in an editor's server log. Marked as already given; a no-op for tokenizers
    that do not keep this record."""
    given = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(given, dict):
        given[LONG_INPUT_WARNING] = True


class LocalEngine:
    """Base for in-process backends; subclasses set `name` and implement `_generate`."""

    name = "local"

    def __init__(self, use_continuation_cache: bool = True, use_prompt_cache: bool = True):
        self.continuations = ContinuationCache()
        self.use_continuation_cache = use_continuation_cache
        self.use_prompt_cache = use_prompt_cache
        self._newline_ids: set[int] | None = None
        self._blank_start_ids: set[int] | None = None
        self._token_index: healing.TokenIndex | None = None
        self.token_healing = False
        """Backends that can bar tokens at the first position turn it on (`heal`)."""

    def _generate(
        self, request: InfillRequest, check: Callable[[], None], stats: InfillStats
    ) -> list[Candidate]:
        raise NotImplementedError

    def keep_documents(self, n: int) -> None:
        """Size the per-document caches for `n` documents in rotation (a team server's typists): an LRU
        smaller than that evicts every entry before its document comes back, and never hits."""
        self.continuations.resize(n)
        prompts = getattr(self, "prompt_cache", None)
        if prompts is not None:
            prompts.capacity = max(prompts.capacity, n)

    def describe(self) -> dict[str, str]:
        """The facts every local backend reports; subclasses add their sampler's."""
        params = sum(p.numel() for p in self.model.parameters())
        return {
            "backend": self.name,
            "model": str(self.model_dir),
            "device": str(self.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "parameters": f"{params / 1e6:.2f}M",
            # "lean" (dg_lsp/engine/lean.py) or "transformers (why the lean forward was not taken)"
            **({"forward": kind} if (kind := getattr(self, "forward_kind", None)) else {}),
        }

    def reset_caches(self) -> None:
        """Drop every per-document cache (benchmarks and tests compare cold and warm paths)."""
        self.continuations.clear()

    def token_index(self) -> healing.TokenIndex:
        """Every token's text, decoded once (warm-up builds it, not the first keystroke)."""
        if self._token_index is None:
            texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])
            self._token_index = healing.TokenIndex(texts)
        return self._token_index

    def newline_ids(self) -> set[int]:
        """Token ids whose text contains a newline, stops excluded (computed once, on first use): on a
        single-line span they end the line like a stop."""
        if self._newline_ids is None:
            texts = self.token_index().texts
            self._newline_ids = {i for i, t in enumerate(texts) if "\n" in t} - self.stop_ids
        return self._newline_ids

    def blank_start_ids(self) -> set[int]:
        """Token ids whose text starts a blank line (a newline after nothing but spaces), stops excluded."""
        if self._blank_start_ids is None:  # a subset of the newline ids: decode only those again
            ids = sorted(self.newline_ids())
            texts = self.tokenizer.batch_decode([[i] for i in ids])
            self._blank_start_ids = {
                i for i, t in zip(ids, texts, strict=True) if t.lstrip(" \t").startswith("\n")
            }
        return self._blank_start_ids

    def first_token_bars(self, request: InfillRequest, vocab_size: int):
        """Sorted ids (a long tensor on the engine's device) barred from the first generated position:
        tokens that start a blank line when `blank_start` is off, and with `first_text` every token whose
        text does not begin with it. None when nothing is barred."""
        import torch

        if request.blank_start and not request.first_text:  # the common case: no table to build
            return None
        barred = torch.zeros(vocab_size, dtype=torch.bool)
        if not request.blank_start:
            barred[[i for i in self.blank_start_ids() if i < vocab_size]] = True
        if request.first_text:
            allowed = [i for i in self.token_index().starting_with(request.first_text) if i < vocab_size]
            if allowed:  # never bar everything: the fragment's own token always qualifies
                keep = barred[allowed].clone()
                barred[:] = True
                barred[allowed] = keep
        if not barred.any():
            return None
        return barred.nonzero().squeeze(-1).to(self.device)

    def fragment_ids(self, request: InfillRequest):
        """Ids whose text is exactly the healed fragment (a long tensor), or None: a span that starts with
        one of them has only re-typed the user's word, so the rule that a span is never empty moves on by
        one position (`MaskedSamplerConfig.min_tokens`, the AR engine's `min_tokens`)."""
        import torch

        frag = request.first_text
        if not frag:
            return None
        texts = self.token_index().texts
        ids = [i for i in self.token_index().starting_with(frag) if texts[i] == frag]
        return torch.tensor(ids, device=self.device) if ids else None

    def heal(self, request: InfillRequest) -> InfillRequest:
        """The request with the cursor's partial word taken back out of the prefix (`healing.py`), its
        `syntax_ok` reading candidates that start with that word; the request itself when not healed."""
        if not (self.token_healing and request.token_healing) or request.first_text:
            return request
        healed = healing.heal(
            request.prefix, lambda s: self.tokenizer.encode(s, add_special_tokens=False), self.token_index()
        )
        if healed is None:
            return request
        fragment, check = healed.fragment, request.syntax_ok
        syntax_ok = None
        if check is not None:
            syntax_ok = lambda text: text.startswith(fragment) and check(text[len(fragment) :])  # noqa: E731
        return dataclasses.replace(request, prefix=healed.prefix, first_text=fragment, syntax_ok=syntax_ok)

    @staticmethod
    def unheal(request: InfillRequest, candidates: list[Candidate]) -> list[Candidate]:
        """Candidates relative to the user's cursor again: the healed fragment stripped (one that does not
        start with it cannot be placed at the cursor and is dropped)."""
        frag = request.first_text
        if not frag:
            return candidates
        return [
            dataclasses.replace(c, text=c.text[len(frag) :]) for c in candidates if c.text.startswith(frag)
        ]

    def infill(self, request: InfillRequest, should_cancel: ShouldCancel | None = None) -> InfillResult:
        start = time.perf_counter()
        check = checked(should_cancel)
        check()
        n = max(1, request.num_candidates)
        hit = self.continued(request)
        if hit is not None:
            return hit
        stats = InfillStats()
        healed = self.heal(request)
        cands = self._generate(healed, check, stats)
        ranked = self.unheal(healed, rank_candidates(cands, healed.syntax_ok)[:n])
        self.shown(request, ranked)
        stats.total_ms = (time.perf_counter() - start) * 1000
        return InfillResult(ranked, stats)

    def continued(self, request: InfillRequest) -> InfillResult | None:
        """The rest of the suggestion shown for this document, when the user typed its start: no pass."""
        if not self.use_continuation_cache:
            return None
        rest = self.continuations.lookup(request.doc_key, request.prefix, request.suffix)
        if rest is None:
            return None
        # the rest of a shown suggestion ends where that suggestion did
        return InfillResult([Candidate(text=t, stopped=True) for t in rest[: max(1, request.num_candidates)]],
                            InfillStats(cache_hit=True))  # fmt: skip

    def shown(self, request: InfillRequest, candidates: list[Candidate]) -> None:
        """Remember what this request returns, for `continued` (also called by the batched runners)."""
        if self.use_continuation_cache:
            self.continuations.remember(
                request.doc_key, request.prefix, request.suffix, [c.text for c in candidates]
            )
