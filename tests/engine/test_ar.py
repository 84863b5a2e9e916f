"""The autoregressive baseline on a tiny real causal LM."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.models import tokens

PREFIX = "class Stack:\n    def push(self, item):\n        self."
SUFFIX = "\n\n    def pop(self):\n        return self.items.pop()\n"


def greedy_reference(engine, request):
    ids = torch.tensor([engine.prompt_ids(request)])
    out = engine.model.generate(
        ids,
        do_sample=False,
        max_new_tokens=request.max_tokens,
        min_new_tokens=engine.min_tokens,
        eos_token_id=[tokens.EOS_ID, tokens.PAD_ID],
        pad_token_id=tokens.PAD_ID,
    )
    new = out[0, ids.shape[1] :].tolist()
    return [t for t in new if t not in (tokens.EOS_ID, tokens.PAD_ID)]


def test_greedy_matches_transformers_generate(ar_engine):
    ar_engine.use_continuation_cache = False
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=12)
    result = ar_engine.infill(request)
    assert result.candidates[0].token_ids == greedy_reference(ar_engine, request)
    assert result.stats.forward_passes == result.stats.generated_tokens == 12  # one pass per token
    assert result.stats.tokens_per_forward == 1.0


def infill_first_shaped(engine, first, request):
    """Infill (caches off) through a model whose surest first token is `first`, with the word `items`
    second, and whose surest token after that is EOS. Returns the generated ids and the word's id."""
    saved = engine.use_continuation_cache, engine.use_prompt_cache
    engine.use_continuation_cache = engine.use_prompt_cache = False
    word = engine.tokenizer.encode("items", add_special_tokens=False)[0]
    calls = []

    def hook(_module, _args, out):
        calls.append(1)
        out.logits[:, -1, :] = -10.0
        out.logits[:, -1, word] = 2.0
        out.logits[:, -1, first if len(calls) == 1 else tokens.EOS_ID] = 10.0
        return out

    handle = engine.model.register_forward_hook(hook)
    try:
        result = engine.infill(request)
    finally:
        handle.remove()
        engine.use_continuation_cache, engine.use_prompt_cache = saved
    return (result.candidates[0].token_ids if result.candidates else []), word


@pytest.mark.parametrize("min_tokens", [0, 1])
@pytest.mark.parametrize("single_line", [False, True])
def test_min_tokens_bars_an_empty_answer(ar_engine, min_tokens, single_line):
    """A model whose surest first token ends the answer (EOS, or a newline on a single line)."""
    first = min(ar_engine.newline_ids()) if single_line else tokens.EOS_ID
    saved, ar_engine.min_tokens = ar_engine.min_tokens, min_tokens
    try:
        request = InfillRequest(PREFIX, SUFFIX, max_tokens=8, single_line=single_line)
        ids, word = infill_first_shaped(ar_engine, first, request)
    finally:
        ar_engine.min_tokens = saved
    if min_tokens:
        assert ids == [word]  # the word, then EOS
    else:
        assert ids == ([first] if single_line else [])  # the newline ends the line: nothing to show


@pytest.mark.parametrize("blank_start", [True, False])
def test_a_blank_first_line_can_be_barred(ar_engine, blank_start):
    """A model whose surest first token starts a blank line."""
    blank = min(ar_engine.blank_start_ids())
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=8, blank_start=blank_start)
    ids, word = infill_first_shaped(ar_engine, blank, request)
    assert ids == ([blank] if blank_start else [word])


def test_prompts_outgrow_the_sliding_window(ar_engine):
    assert len(ar_engine.prompt_ids(InfillRequest(PREFIX, SUFFIX))) > ar_engine.model.config.sliding_window


def test_kv_reuse_is_identical(ar_engine):
    ar_engine.use_continuation_cache = False
    ar_engine.token_healing = False  # the reference below is plain greedy on the prompt as typed
    first = InfillRequest(PREFIX, SUFFIX, max_tokens=10, doc_key="a")
    second = dataclasses.replace(first, prefix=PREFIX + "items")
    try:
        ar_engine.infill(first)
        warm = ar_engine.infill(second)
        assert warm.stats.reused_prompt_tokens > 10
        ar_engine.reset_caches()
        cold = ar_engine.infill(second)
    finally:
        ar_engine.token_healing = True
    assert cold.stats.reused_prompt_tokens == 0
    assert warm.candidates[0].token_ids == cold.candidates[0].token_ids
    assert warm.candidates[0].token_ids == greedy_reference(ar_engine, second)


def test_cancel_stops_within_one_token(ar_engine):
    ar_engine.use_continuation_cache = False
    calls = []
    handle = ar_engine.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(Cancelled):
            ar_engine.infill(
                InfillRequest(PREFIX, SUFFIX, max_tokens=30), should_cancel=lambda: len(calls) >= 4
            )
    finally:
        handle.remove()
    assert len(calls) == 4


def test_cancelled_request_leaves_no_stale_cache(ar_engine):
    ar_engine.use_continuation_cache = False
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=10, doc_key="b")
    calls = []
    handle = ar_engine.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(Cancelled):
            ar_engine.infill(request, should_cancel=lambda: len(calls) >= 3)
    finally:
        handle.remove()
    again = ar_engine.infill(request)
    assert again.candidates[0].token_ids == greedy_reference(ar_engine, request)
