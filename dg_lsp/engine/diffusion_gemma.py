"""DiffusionGemma backend: the encoder reads the FIM prompt, the decoder denoises the middle canvas.

Traps handled here: the canvas starts from uniform noise (there is no mask token), its length comes
from `model.config.canvas_length`, and `eos_token_id`/`pad_token_id` must be passed to `generate`
or the canvas is never cut at EOS.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from dg_lsp.engine.types import Cancelled, Candidate, InfillRequest, InfillResult, InfillStats, ShouldCancel
from dg_lsp.models import tokens

log = logging.getLogger(__name__)


class _StepHook:
    """Streamer whose `put_draft` runs after every denoising step: the only place to cancel cooperatively."""

    def __init__(self, should_cancel: ShouldCancel | None):
        self.should_cancel = should_cancel
        self.steps = 0

    def put(self, value) -> None:
        pass

    def put_draft(self, value=None, logits=None) -> None:
        self.steps += 1
        if self.should_cancel is not None and self.should_cancel():
            raise Cancelled()

    def end(self) -> None:
        pass


class DiffusionGemmaEngine:
    name = "diffusion-gemma"

    def __init__(self, model_dir: str | Path, device: str = "cpu", max_prompt_tokens: int = 1024, steps: int = 12):
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = DiffusionGemmaForBlockDiffusion.from_pretrained(self.model_dir).to(self.device).eval()
        self.canvas_length = int(self.model.config.canvas_length)
        self.max_prompt_tokens = max_prompt_tokens
        self.default_steps = steps

    def describe(self) -> dict[str, str]:
        params = sum(p.numel() for p in self.model.parameters())
        return {
            "backend": self.name,
            "model": str(self.model_dir),
            "device": str(self.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "parameters": f"{params / 1e6:.2f}M",
            "canvas_length": str(self.canvas_length),
        }

    def warmup(self) -> None:
        self.infill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n", max_tokens=8))

    def _prompt(self, request: InfillRequest) -> list[int]:
        budget = self.max_prompt_tokens
        pre = self.tokenizer.encode(request.prefix, add_special_tokens=False)
        suf = self.tokenizer.encode(request.suffix, add_special_tokens=False)
        keep_suf = min(len(suf), budget // 4)
        keep_pre = min(len(pre), budget - keep_suf)
        return tokens.fim_prompt_ids(pre[len(pre) - keep_pre :], suf[:keep_suf])

    @torch.inference_mode()
    def infill(self, request: InfillRequest, should_cancel: ShouldCancel | None = None) -> InfillResult:
        start = time.perf_counter()
        torch.manual_seed(request.seed)
        ids = torch.tensor([self._prompt(request)], device=self.device)
        canvases = max(1, -(-request.max_tokens // self.canvas_length))
        hook = _StepHook(should_cancel)
        out = self.model.generate(
            ids,
            max_new_tokens=canvases * self.canvas_length,
            max_denoising_steps=request.steps or self.default_steps,
            eos_token_id=tokens.EOS_ID,
            pad_token_id=tokens.PAD_ID,
            streamer=hook,
        )
        new = out.sequences[0, ids.shape[1] :].tolist()
        if tokens.EOS_ID in new:
            new = new[: new.index(tokens.EOS_ID)]
        new = [t for t in new if t != tokens.PAD_ID][: request.max_tokens]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        stats = InfillStats(
            forward_passes=hook.steps,
            generated_tokens=len(new),
            total_ms=(time.perf_counter() - start) * 1000,
        )
        return InfillResult([Candidate(text=text)], stats)
