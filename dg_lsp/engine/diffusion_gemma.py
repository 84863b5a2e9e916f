"""DiffusionGemma backend: a causal encoder reads the prompt, a bidirectional decoder denoises one canvas.

Our own denoising loop over the model's forward (instead of `generate`) so that we control:
- the encoder KV cache per document: the encoder is causal, so the KV of the unchanged leading part of
  the prompt is exact and reused; only the changed tail (end of prefix, suffix, `<fim_middle>`) is encoded;
- cooperative cancellation before every decoder pass, early exit, step caps from the latency budget;
- several candidates in one batch (one noise draw per row) ranked by mean log-probability.

Traps handled: the canvas starts from uniform noise over the vocabulary (no mask token), its length is
`config.canvas_length` (one canvas = one block), the output is cut at EOS/pad, and sliding-window
layers see only the last `sliding_window - 1` prompt tokens in the decoder, exactly as in `generate`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dg_lsp.engine import sampler
from dg_lsp.engine.base import LocalEngine, budget_prompt, prompt_budget, quiet_long_input_warning
from dg_lsp.engine.cache import LRU, common_prefix_len
from dg_lsp.engine.infill_format import user_turn_ids
from dg_lsp.engine.kv import KVSnapshot, cache_kwarg, restore, snapshot
from dg_lsp.engine.types import Candidate, InfillRequest, InfillStats
from dg_lsp.models import tokens

log = logging.getLogger(__name__)

CURSOR = "<|cursor|>"
CHAT_INSTRUCTION = (
    "Fill in the code at {cursor}. Reply with only the code that replaces {cursor}, nothing else.\n\n"
)


@dataclass(frozen=True)
class DenoiseConfig:
    """The sampler knobs of DiffusionGemma's `generate`, read from the checkpoint's generation config."""

    steps: int = 12
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    @classmethod
    def from_generation_config(cls, gc, steps: int | None) -> DenoiseConfig:
        """`steps` 0/None: the checkpoint's own `max_denoising_steps` (what `generate()` runs), else 12."""

        def pick(name, default):
            value = getattr(gc, name, None) if gc is not None else None
            return default if value is None else value

        sc = getattr(gc, "sampler_config", None) if gc is not None else None
        bound = getattr(sc, "entropy_bound", None) if sc is not None else None
        if isinstance(sc, dict):
            bound = sc.get("entropy_bound")
        return cls(
            steps=int(steps or pick("max_denoising_steps", cls.steps)),
            t_min=float(pick("t_min", cls.t_min)),
            t_max=float(pick("t_max", cls.t_max)),
            entropy_bound=float(bound if bound is not None else cls.entropy_bound),
            stability_threshold=int(pick("stability_threshold", cls.stability_threshold)),
            confidence_threshold=float(pick("confidence_threshold", cls.confidence_threshold)),
        )


EncoderState = KVSnapshot  # full-length encoder keys/values for the prompt ids


def uses_fim_tokens(tokenizer) -> bool:
    """Models trained on our PSM format carry our special tokens at our ids; others get the chat template."""
    want = {
        tokens.FIM_PREFIX: tokens.FIM_PREFIX_ID,
        tokens.FIM_SUFFIX: tokens.FIM_SUFFIX_ID,
        tokens.FIM_MIDDLE: tokens.FIM_MIDDLE_ID,
    }
    return all(tokenizer.convert_tokens_to_ids(t) == i for t, i in want.items())


def chat_prompt_ids(tokenizer, prefix: str, suffix: str) -> list[int]:
    """Instruction-tuned checkpoint: prefix + cursor marker + suffix as one user turn."""
    content = CHAT_INSTRUCTION.format(cursor=CURSOR) + "```\n" + prefix + CURSOR + suffix + "\n```"
    return user_turn_ids(tokenizer, content)


class DiffusionGemmaEngine(LocalEngine):
    name = "diffusion-gemma"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        max_prompt_tokens: int = 1024,
        steps: int = 12,
        quantization: str = "none",
        dtype: torch.dtype | None = None,
        use_prompt_cache: bool = True,
        use_continuation_cache: bool = True,
        model=None,
        tokenizer=None,
    ):
        super().__init__(use_continuation_cache=use_continuation_cache, use_prompt_cache=use_prompt_cache)
        from transformers import AutoTokenizer

        from dg_lsp.engine import quantization as quant

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_dir)
        if model is None:
            model, self.quantization = quant.load_diffusion_gemma(
                self.model_dir, self.device, quantization, dtype
            )
        else:
            self.quantization = quantization
        self.model = model.eval()
        self.config = self.model.config
        self.text_config = self.config.get_text_config()
        self.canvas_length = int(self.config.canvas_length)
        self.vocab_size = int(self.text_config.vocab_size)
        self.max_prompt_tokens = prompt_budget(self.tokenizer, max_prompt_tokens)
        quiet_long_input_warning(self.tokenizer)
        self.denoise = DenoiseConfig.from_generation_config(
            getattr(self.model, "generation_config", None), steps
        )
        self.fim = uses_fim_tokens(self.tokenizer)
        self.eos_ids = {tokens.EOS_ID, tokens.PAD_ID} if self.fim else self._stop_ids()
        self.prompt_cache: LRU[EncoderState] = LRU(8)
        self.ms_per_row_step: float | None = None
        """Running estimate used to cap steps and batch size from the latency budget."""

    def _stop_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.config, self.text_config, getattr(self.model, "generation_config", None)):
            for attr in ("eos_token_id", "pad_token_id"):
                value = getattr(source, attr, None) if source is not None else None
                if isinstance(value, int):
                    ids.add(value)
                elif isinstance(value, list | tuple):
                    ids.update(int(v) for v in value)
        for attr in ("eos_token_id", "pad_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if value is not None:
                ids.add(int(value))
        return ids

    def describe(self) -> dict[str, str]:
        return {
            **super().describe(),
            "canvas_length": str(self.canvas_length),
            "prompt_format": "fim" if self.fim else "chat",
        }

    def warmup(self) -> None:
        self.infill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n", max_tokens=8))
        self.reset_caches()

    def reset_caches(self) -> None:
        super().reset_caches()
        self.prompt_cache.clear()

    # -- prompt and encoder ------------------------------------------------------------------------

    def prompt_ids(self, request: InfillRequest) -> list[int]:
        if not self.fim:
            return chat_prompt_ids(self.tokenizer, request.prefix, request.suffix)
        pre = self.tokenizer.encode(request.prefix, add_special_tokens=False)
        suf = self.tokenizer.encode(request.suffix, add_special_tokens=False)
        pre, suf = budget_prompt(pre, suf, self.max_prompt_tokens)
        return tokens.fim_prompt_ids(pre, suf)

    def encode(self, ids: list[int], previous: EncoderState | None) -> tuple[EncoderState, int]:
        """Encode `ids` reusing the KV of the longest common prefix with `previous`; (state, reused)."""
        keep = common_prefix_len(previous.ids, ids) if previous is not None else 0
        keep = min(keep, len(ids) - 1)  # the encoder must see at least one token
        cache = restore(self.text_config, previous, keep)
        new = torch.tensor([ids[keep:]], device=self.device)
        pos = torch.arange(keep, len(ids), device=self.device).unsqueeze(0)
        encoder = self.model.model.encoder
        encoder(input_ids=new, position_ids=pos, **{cache_kwarg(encoder.forward): cache})
        return snapshot(cache, ids), keep

    def _decoder_cache(self, state: EncoderState, batch: int):
        """Read-only cache for the decoder: sliding layers trimmed to their window, like `generate` does."""
        return restore(self.text_config, state, len(state.ids), batch=batch, record=False)

    # -- denoising ---------------------------------------------------------------------------------

    def _denoise(
        self,
        state: EncoderState,
        batch: int,
        steps: int,
        gen: torch.Generator,
        check: Callable[[], None],
        stats: InfillStats,
        deadline_ms: float | None,
        start: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Denoise one canvas; return (argmax canvas (B, C), raw logits of the last pass (B, C, V))."""
        cfg = self.denoise
        cache = self._decoder_cache(state, batch)
        length = len(state.ids)
        pos = torch.arange(length, length + self.canvas_length, device=self.device).unsqueeze(0)
        canvas = torch.randint(
            0, self.vocab_size, (batch, self.canvas_length), device=self.device, generator=gen
        )
        self_cond = None
        history: list[torch.Tensor] = []
        argmax = canvas
        logits = None
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        cache_arg = cache_kwarg(self.model.forward)
        for done in range(steps):
            check()
            t0 = time.perf_counter()
            out = self.model(
                decoder_input_ids=canvas,
                self_conditioning_logits=self_cond,
                decoder_position_ids=pos,
                **{cache_arg: cache},
            )
            stats.forward_passes += 1
            step_logits = out.logits.float()
            temp = sampler.linear_temperature(steps - done, steps, cfg.t_min, cfg.t_max)
            proc = step_logits / temp
            probs = torch.softmax(proc, dim=-1)
            drawn = torch.multinomial(probs.view(-1, self.vocab_size), 1, generator=gen).view(batch, -1)
            new_argmax = proc.argmax(dim=-1)
            token_h = sampler.entropy(proc)
            accept = sampler.entropy_bound_accept(token_h, cfg.entropy_bound)
            noise = torch.randint(0, self.vocab_size, canvas.shape, device=self.device, generator=gen)
            new_canvas = torch.where(accept, drawn, noise)
            # rows that already stopped keep their result; the others move on
            keep = finished[:, None]
            argmax = torch.where(keep, argmax, new_argmax)
            canvas = torch.where(keep, canvas, new_canvas)
            logits = step_logits if logits is None else torch.where(keep[..., None], logits, step_logits)
            self_cond = (
                proc.to(self.model.dtype)
                if self_cond is None
                else torch.where(keep[..., None], self_cond, proc.to(self.model.dtype))
            )
            finished = finished | sampler.stable_and_confident(
                history, new_argmax, token_h, cfg.stability_threshold, cfg.confidence_threshold
            )
            history.append(new_argmax)
            step_ms = (time.perf_counter() - t0) * 1000
            per_row = step_ms / batch
            ema = self.ms_per_row_step
            self.ms_per_row_step = per_row if ema is None else 0.7 * ema + 0.3 * per_row
            if bool(finished.all()):
                stats.early_exit = done + 1 < steps
                break
            elapsed = (time.perf_counter() - start) * 1000
            if deadline_ms is not None and elapsed + step_ms > deadline_ms:
                break  # the argmax canvas so far is the answer; better late-ish than never
        return argmax, logits

    def _plan(self, request: InfillRequest) -> tuple[int, int, int]:
        """(batch, steps per canvas, canvases) that fit the latency budget, from the per-step estimate.

        Extra candidates are dropped before steps are cut; several candidates get a single canvas.
        """
        steps = max(1, request.steps or self.denoise.steps)
        batch = max(1, request.num_candidates)
        canvases = max(1, -(-request.max_tokens // self.canvas_length))
        est = self.ms_per_row_step
        if request.deadline_ms is not None and est:
            while batch > 1 and est * batch * steps > request.deadline_ms:
                batch -= 1
        if batch > 1:
            canvases = 1
        if request.deadline_ms is not None and est:
            steps = sampler.cap_steps(steps, 0.0, est * batch * canvases, request.deadline_ms)
        return batch, steps, canvases

    def _generate(self, request: InfillRequest, check, stats: InfillStats) -> list[Candidate]:
        start = time.perf_counter()
        gen = torch.Generator(device=self.device).manual_seed(int(request.seed))
        ids = self.prompt_ids(request)
        stats.prompt_tokens = len(ids)
        with torch.inference_mode():
            previous = self.prompt_cache.get(request.doc_key) if self.use_prompt_cache else None
            t0 = time.perf_counter()
            state, reused = self.encode(ids, previous)
            stats.encode_ms = (time.perf_counter() - t0) * 1000
            stats.reused_prompt_tokens = reused
            stats.encoder_passes += 1
            if self.use_prompt_cache:
                self.prompt_cache.put(request.doc_key, state)
            check()
            batch, steps, canvases = self._plan(request)
            stats.step_cap = steps
            rows: list[list[int]] = [[] for _ in range(batch)]
            scores: list[list[float]] = [[] for _ in range(batch)]
            done = [False] * batch
            for c in range(canvases):
                argmax, logits = self._denoise(
                    state, batch, steps, gen, check, stats, request.deadline_ms, start
                )
                logp = torch.log_softmax(logits, dim=-1).gather(-1, argmax[..., None]).squeeze(-1)
                for b in range(batch):
                    if done[b]:
                        continue
                    kept = sampler.trim_at_stop(argmax[b].tolist(), self.eos_ids)
                    rows[b].extend(kept)
                    scores[b].extend(logp[b, : len(kept)].tolist())
                    if len(kept) < self.canvas_length or len(rows[b]) >= request.max_tokens:
                        done[b] = True
                if all(done) or c + 1 == canvases:
                    break
                if request.single_line and "\n" in self.tokenizer.decode(rows[0]):
                    break
                check()
                t0 = time.perf_counter()
                state, _ = self.encode(state.ids + argmax[0].tolist(), state)
                stats.encode_ms += (time.perf_counter() - t0) * 1000
                stats.encoder_passes += 1
        cands = []
        for b in range(batch):
            new = rows[b][: request.max_tokens]
            sc = scores[b][: len(new)]
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            cands.append(Candidate(text=text, mean_logprob=sum(sc) / len(sc) if sc else 0.0, token_ids=new))
            stats.generated_tokens = max(stats.generated_tokens, len(new))
        return cands
