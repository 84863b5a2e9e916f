"""Typed requests and results crossing the context → engine boundary.

The server and the CLI only ever talk to an engine through these types, so every backend
(DiffusionGemma, masked diffusion, autoregressive baseline, remote) is interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Cancelled(Exception):
    """Raised by an engine between denoising steps when the request was superseded or cancelled."""


@dataclass(frozen=True)
class InfillRequest:
    prefix: str
    suffix: str
    max_tokens: int = 48
    single_line: bool = False
    """Stop rule: the caller will cut at the first newline, so the engine may stop early there."""
    language: str | None = None
    blank_start: bool = True
    """False: bar tokens that start a blank line from the first position. At the start of a line the
    caller drops leading blank lines anyway, and a small model's likeliest guess there is one. The masked
    and AR engines honour it; the DiffusionGemma sampler has no per-position bars (nor `min_tokens`)."""
    num_candidates: int = 1
    steps: int | None = None
    """Denoising steps per canvas; None lets the engine choose from its settings and budget."""
    seed: int = 0
    doc_key: str | None = None
    """Stable key (e.g. the document URI) under which an engine may keep reusable caches."""
    deadline_ms: float | None = None
    """Soft latency budget for this request, measured from when the engine starts it."""
    syntax_ok: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)
    """Optional check (e.g. a tree-sitter parse of prefix+text+suffix) for ranking; never sent remotely."""
    token_healing: bool = True
    """Let the engine take the cursor's partial word back out of the prefix and complete it whole
    (`dg_lsp/engine/healing.py`); the user's `tokenHealing` setting. Backends that cannot bar first tokens
    ignore it."""
    first_text: str = ""
    """Token healing (`dg_lsp/engine/healing.py`), set by the engine itself: the completion starts with
    this text, the partial word taken back out of `prefix`; only tokens whose text begins with it may
    come first, and the engine strips it from what it returns."""


@dataclass
class Candidate:
    text: str
    mean_logprob: float = 0.0
    token_ids: list[int] | None = field(default=None, repr=False)
    """The generated ids behind `text`, when the engine has them (tests and debugging)."""
    stopped: bool | None = None
    """The model ended the span itself; None: as the length of `token_ids` says (see `ended_by_model`)."""


def ended_by_model(candidate: Candidate, max_tokens: int) -> bool:
    """Whether the model ended the span with a stop token rather than running out of canvas.

    A model that stops by itself has said where its span ends: post-processing need not guess an end
    where a canvas filled to the brim may run on (a blank line). Without ids or a word from the engine,
    the candidate may have run on."""
    if candidate.stopped is not None:
        return candidate.stopped
    return candidate.token_ids is not None and len(candidate.token_ids) < max_tokens


@dataclass
class InfillStats:
    forward_passes: int = 0
    generated_tokens: int = 0
    total_ms: float = 0.0
    encode_ms: float = 0.0
    cache_hit: bool = False
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    """Prompt tokens whose encoder/KV state came from the per-document cache instead of a forward pass."""
    early_exit: bool = False
    """The canvas became stable and confident (or fully decoded) before the step cap."""
    step_cap: int = 0
    """Denoising steps allowed after the latency budget was applied (0 when not applicable)."""
    encoder_passes: int = 0
    """Prompt-encoding passes (DiffusionGemma encoder, KV prefill); AR counts its prefill as a forward too."""

    @property
    def ms_per_step(self) -> float:
        return self.total_ms / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.forward_passes if self.forward_passes else 0.0

    def as_dict(self) -> dict[str, float | int | bool]:
        return {
            "forward_passes": self.forward_passes,
            "generated_tokens": self.generated_tokens,
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "ms_per_step": round(self.ms_per_step, 2),
            "encode_ms": round(self.encode_ms, 2),
            "total_ms": round(self.total_ms, 2),
            "cache_hit": self.cache_hit,
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "early_exit": self.early_exit,
            "step_cap": self.step_cap,
            "encoder_passes": self.encoder_passes,
        }


@dataclass
class InfillResult:
    candidates: list[Candidate] = field(default_factory=list)
    stats: InfillStats = field(default_factory=InfillStats)

    @property
    def best(self) -> str:
        return self.candidates[0].text if self.candidates else ""


ShouldCancel = Callable[[], bool]


class InfillEngine(Protocol):
    """What the server needs from a backend. Implementations own their model and caches."""

    name: str

    def infill(self, request: InfillRequest, should_cancel: ShouldCancel | None = None) -> InfillResult:
        """Return ranked candidates; raise `Cancelled` between steps once `should_cancel()` is true."""
        ...

    def warmup(self) -> None:
        """Run one small request so the first real completion does not pay one-off costs."""
        ...

    def describe(self) -> dict[str, str]:
        """Facts for `dg-lsp doctor` and logs: model path, device, dtype, quantization, parameters."""
        ...
