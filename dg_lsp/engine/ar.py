"""Autoregressive baseline (the AR twin): PSM prompt, greedy decoding until EOS, one forward per token.

The per-document KV cache keeps the prompt's KV (full length, sliding layers included); the next
request restores its longest common token prefix and prefills only the rest (exact for causal models).
"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import torch

from dg_lsp.engine import layouts, lean
from dg_lsp.engine.base import LocalEngine, budget_prompt, prompt_budget, quiet_long_input_warning
from dg_lsp.engine.cache import LRU, common_prefix_len
from dg_lsp.engine.kv import KVSnapshot, cache_kwarg, restore, snapshot
from dg_lsp.engine.sampler import mean_logprob
from dg_lsp.engine.types import Candidate, InfillRequest, InfillStats
from dg_lsp.models import native, tokens


class AutoregressiveEngine(LocalEngine):
    name = "ar"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        max_prompt_tokens: int = 1024,
        quantization: str = "none",
        trust_remote_code: bool = False,
        use_prompt_cache: bool = True,
        use_continuation_cache: bool = True,
        min_tokens: int = 1,
        dtype: str = "auto",
    ):
        """`min_tokens`: stops (and, on a single line, newlines) are barred from the first this-many
        tokens, the rule the masked sampler follows: an empty answer shows the user nothing."""
        super().__init__(use_continuation_cache=use_continuation_cache, use_prompt_cache=use_prompt_cache)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from dg_lsp.engine import quantization as quant

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.quantization = quant.resolve_kind(quantization, self.device)
        kwargs = {
            "trust_remote_code": trust_remote_code,
            "dtype": quant.resolve_dtype(dtype, self.device, self.model_dir),
        }
        if self.quantization in ("8bit", "nf4"):
            kwargs["quantization_config"] = quant.bnb_config(self.quantization, skip=["lm_head"])
            kwargs["device_map"] = str(self.device)
        raw = json.loads((self.model_dir / "config.json").read_text())
        try:  # a checkpoint's own code written for transformers 4.4x fails deep inside transformers 5
            trust = trust_remote_code
            self.layout = layouts.layout_of(raw)
            if self.layout in layouts.PACKED_LAYOUTS:
                self.tokenizer = layouts.load_packed_tokenizer(self.model_dir)
                packed = layouts.packed_dtype(self.device) if dtype == "auto" else kwargs["dtype"]
                self.model = layouts.load_packed_model(self.model_dir, packed)
            else:
                self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=trust)
                self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, **kwargs).eval()
        except Exception as exc:
            message = native.remote_code_failure(exc, raw, suggest=False) if trust_remote_code else None
            if message is None:
                raise
            from dg_lsp.engine.loader import ModelLoadError

            raise ModelLoadError(message) from exc
        lean_int8 = lean.int8_capable(self.model, self.quantization, self.device)
        if self.quantization == "int8" and not lean_int8:
            quant.quantize_linears_int8_(self.model, skip=["lm_head"])
        if self.quantization not in ("8bit", "nf4"):
            self.model.to(self.device)
        self.model, self.forward_kind = lean.adopt(self.model, self.tokenizer, int8=lean_int8)
        self.forward_kind = lean.adopt_int4(
            self.model, self.tokenizer, quantization, self.forward_kind, by_default=True
        )
        if getattr(self.model, "int4", None) is not None:
            self.quantization = "int4"  # what `describe()` reports: `auto` took it
        self.max_prompt_tokens = prompt_budget(self.tokenizer, max_prompt_tokens)
        quiet_long_input_warning(self.tokenizer)
        self.cache_arg = cache_kwarg(self.model.forward) or "past_key_values"
        # dg-lsp's own tokenizer fixes its stop ids; other tokenizers (and chat-tuned bases) name theirs
        eos = {tokens.EOS_ID, tokens.PAD_ID} if self.layout == "native" else set()
        for t in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, raw.get("eos_token_id")):
            if isinstance(t, int):
                eos.add(int(t))
        if self.layout != "native":
            vocab = self.tokenizer.get_vocab()
            eos |= {vocab[t] for t in ("<|endoftext|>", "<|im_end|>") if t in vocab}
        self.stop_ids = eos
        self.min_tokens = min_tokens
        self.token_healing = True
        self.prompt_cache: LRU[KVSnapshot] = LRU(8)
        # only the last position's logits are read: skip the output head for the rest of the prompt
        sliceable = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._last = {"logits_to_keep": 1} if sliceable else {}

    def warmup(self) -> None:
        self.newline_ids()  # per-model tables, built here rather than on the first keystroke
        self.blank_start_ids()
        self.infill(InfillRequest(prefix="def f(x):\n    return ", suffix="\n", max_tokens=4))
        self.reset_caches()

    def reset_caches(self) -> None:
        super().reset_caches()
        self.prompt_cache.clear()

    def retyped(self, request: InfillRequest, new: list[int]) -> int:
        """1 when the first token only re-typed the healed fragment (`LocalEngine.fragment_ids`): the
        rule that an answer is never empty then counts from the token after it."""
        if not self.min_tokens or not request.first_text or not new:
            return 0
        return int(self.token_index().texts[new[0]] == request.first_text)

    def prompt_ids(self, request: InfillRequest) -> list[int]:
        pre = self.tokenizer.encode(request.prefix, add_special_tokens=False)
        suf = self.tokenizer.encode(request.suffix, add_special_tokens=False)
        if self.layout == "prefix":  # a base with no FIM tokens sees only what comes before the cursor
            return budget_prompt(pre, [], self.max_prompt_tokens)[0] or [int(next(iter(self.stop_ids)))]
        pre, suf = budget_prompt(pre, suf, self.max_prompt_tokens)
        if self.layout == "spm":
            return layouts.spm_ids(self.tokenizer, pre, suf)
        return tokens.fim_prompt_ids(pre, suf)

    def _prefill(self, ids: list[int], doc_key: str | None, stats: InfillStats):
        previous = self.prompt_cache.get(doc_key) if self.use_prompt_cache else None
        keep = min(common_prefix_len(previous.ids, ids), len(ids) - 1) if previous is not None else 0
        cache = restore(self.model.config, previous, keep)
        inp = torch.tensor([ids[keep:]], device=self.device)
        pos = torch.arange(keep, len(ids), device=self.device).unsqueeze(0)
        kw = {self.cache_arg: cache, **self._last}
        out = self.model(input_ids=inp, position_ids=pos, use_cache=True, **kw)
        stats.reused_prompt_tokens = keep
        stats.encoder_passes += 1
        if self.use_prompt_cache and doc_key is not None:
            self.prompt_cache.put(doc_key, snapshot(cache, ids))  # the prompt only, before our guesses
        return out.logits[:, -1, :], cache

    def _generate(self, request: InfillRequest, check, stats: InfillStats) -> list[Candidate]:
        ids = self.prompt_ids(request)
        stats.prompt_tokens = len(ids)
        new: list[int] = []
        picked_logits: list[torch.Tensor] = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits, cache = self._prefill(ids, request.doc_key, stats)
            stats.encode_ms = (time.perf_counter() - t0) * 1000
            stats.forward_passes += 1
            first = self.first_token_bars(request, logits.shape[-1])
            while True:
                barred: set[int] = set()
                if len(new) < self.min_tokens + self.retyped(request, new):
                    barred = self.stop_ids | (self.newline_ids() if request.single_line else set())
                if barred or (not new and first is not None):
                    logits = logits.clone()
                if barred:
                    logits[0, sorted(barred)] = float("-inf")
                if not new and first is not None:
                    logits[0, first] = float("-inf")
                tok = int(logits[0].argmax())
                if tok in self.stop_ids:
                    break
                new.append(tok)
                picked_logits.append(logits[0])
                if len(new) >= request.max_tokens:
                    break
                if request.single_line and "\n" in self.tokenizer.decode(new[-1:]):
                    break
                check()
                step = torch.tensor([[tok]], device=self.device)
                # the DynamicCache grows in place
                out = self.model(input_ids=step, **{self.cache_arg: cache}, **self._last)
                stats.forward_passes += 1
                logits = out.logits[:, -1, :]
        stats.generated_tokens = len(new)
        score = mean_logprob(torch.stack(picked_logits), torch.tensor(new)) if new else 0.0
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return [Candidate(text=text, mean_logprob=score, token_ids=new)]
