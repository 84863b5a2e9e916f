"""Token healing on real tokenizers and the shipped 5M models: a cursor inside a word is completed from
inside that word, by the masked and AR engines, alone and in a team batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dg_lsp.engine import healing
from dg_lsp.engine.ar import AutoregressiveEngine
from dg_lsp.engine.loader import EMBEDDED_SMOLLM2_DIR, EMBEDDED_TINY_DIR
from dg_lsp.engine.masked import MaskedDiffusionEngine
from dg_lsp.engine.types import InfillRequest, InfillResult

AR_TWIN_DIR = EMBEDDED_TINY_DIR.parent / "ar_twin"
EXAMPLE = (Path(__file__).resolve().parents[2] / "dg_lsp" / "examples" / "stack.py").read_text()
CURSOR = EXAMPLE.index("def peek(self):\n        return ") + len("def peek(self):\n        return ")


def _index(tokenizer) -> healing.TokenIndex:
    return healing.TokenIndex(tokenizer.batch_decode([[i] for i in range(len(tokenizer))]))


def test_token_index_finds_every_text_that_starts_with_a_fragment():
    index = healing.TokenIndex(["item", "items", "iter", " item", "it", "", "x"])
    assert sorted(index.starting_with("ite")) == [0, 1, 2]
    assert sorted(index.starting_with("it")) == [0, 1, 2, 4]
    assert index.starting_with(" it") == [3]
    assert index.starting_with("zz") == []


@pytest.mark.parametrize("model_dir", [EMBEDDED_SMOLLM2_DIR, EMBEDDED_TINY_DIR])
def test_heal_takes_the_partial_word_back_out_of_the_prefix(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    index = _index(tok)

    def encode(s):
        return tok.encode(s, add_special_tokens=False)

    prefix = EXAMPLE[:CURSOR] + "self.ite"
    healed = healing.heal(prefix, encode, index)
    assert healed is not None
    assert healed.prefix + healed.fragment == prefix
    assert healed.fragment == index.texts[encode(prefix)[-1]]
    if model_dir == EMBEDDED_SMOLLM2_DIR:
        assert healed == healing.Healed(EXAMPLE[:CURSOR] + "self.", "ite")
    # a fragment's own token is always allowed, so the constraint can never bar every token
    assert encode(healed.fragment)[-1] in index.starting_with(healed.fragment)
    for ending in ("self.", "return ", "f(", "x = 1 + ", ""):
        assert healing.heal(EXAMPLE[:CURSOR] + ending if ending else "", encode, index) is None


def test_heal_refuses_a_tokenizer_whose_token_texts_do_not_spell_the_text():
    """SentencePiece decodes `▁items` alone as `items`: the texts would not add up to the prefix."""
    texts = ["return", "self", ".", "items"]  # no spaces: "return self.items" is not their concatenation
    index = healing.TokenIndex(texts)
    assert healing.heal("return self.items", lambda s: [0, 1, 2, 3], index) is None
    assert healing.heal("self.items", lambda s: [1, 2, 3], index) == healing.Healed("self.", "items")


@pytest.fixture(scope="module")
def engines():
    return {
        "masked": MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False),
        "ar": AutoregressiveEngine(AR_TWIN_DIR, use_continuation_cache=False),
    }


@pytest.mark.parametrize("kind", ["masked", "ar"])
def test_engines_complete_the_word_at_the_cursor_from_inside_it(engines, kind):
    engine = engines[kind]
    prefix, suffix = EXAMPLE[:CURSOR] + "self.it", EXAMPLE[CURSOR:]
    seen: list[str] = []
    request = InfillRequest(
        prefix, suffix, max_tokens=12, single_line=True, syntax_ok=lambda t: seen.append(t) or True
    )
    healed = engine.heal(request)
    assert healed.first_text and healed.prefix + healed.first_text == prefix
    result = engine.infill(request)
    (cand,) = result.candidates
    first = engine.tokenizer.decode(cand.token_ids[:1])
    assert first.startswith(healed.first_text), (first, healed.first_text)
    # what comes back is relative to the user's cursor: the fragment is not repeated
    assert healed.prefix + engine.tokenizer.decode(cand.token_ids) == prefix + cand.text
    assert cand.text in seen  # the syntax check saw the text as it would go in at the cursor
    engine.token_healing = False
    try:
        assert engine.heal(request) is request
    finally:
        engine.token_healing = True


def test_first_token_bars_join_the_blank_start_rule_and_the_fragment(engines):
    engine = engines["masked"]
    vocab = engine.logits_vocab
    bars = engine.first_token_bars(InfillRequest("x", "", first_text="it"), vocab)
    allowed = set(range(vocab)) - set(bars.tolist())
    assert allowed and all(engine.token_index().texts[i].startswith("it") for i in allowed)
    both = engine.first_token_bars(InfillRequest("x", "", first_text="\n", blank_start=False), vocab)
    assert set(both.tolist()) >= set(engine.blank_start_ids())
    assert engine.first_token_bars(InfillRequest("x", ""), vocab) is None


def test_a_team_batch_heals_as_a_lone_request_does(engines):
    from dg_lsp.team.local import EngineRunner

    engine = engines["masked"]
    runner = EngineRunner(engine)
    prefix, suffix = EXAMPLE[:CURSOR] + "self.it", EXAMPLE[CURSOR:]
    requests = [InfillRequest(prefix, suffix, max_tokens=12, single_line=True, doc_key=k) for k in "ab"]
    out = runner.run(requests, [lambda: False, lambda: False])
    alone = engine.infill(InfillRequest(prefix, suffix, max_tokens=12, single_line=True))
    fragment = engine.heal(requests[0]).first_text
    for result in out:
        assert isinstance(result, InfillResult)
        (cand,) = result.candidates
        assert engine.tokenizer.decode(cand.token_ids[:1]).startswith(fragment)
        assert cand.text == alone.candidates[0].text


def test_the_token_healing_setting_reaches_local_and_remote_engines(engines):
    """`tokenHealing: false` in the editor turns healing off for that request, locally and through a team
    server's API; it is on by default."""
    from dg_lsp import context, pipeline
    from dg_lsp.engine.remote import fim_body
    from dg_lsp.settings import Settings
    from dg_lsp.team.api import FimRequest

    text = EXAMPLE[:CURSOR] + "self.it" + EXAMPLE[CURSOR:]
    snapshot = context.as_snapshot(text, "python")
    offset = CURSOR + len("self.it")
    engine = engines["masked"]
    _, on = pipeline.plan(snapshot, offset, Settings())
    _, off = pipeline.plan(snapshot, offset, Settings.from_dict({"tokenHealing": False}))
    assert on.token_healing and engine.heal(on).first_text == "it"
    assert not off.token_healing and engine.heal(off) is off
    assert "token_healing" not in fim_body(on, None, extras=True)
    body = fim_body(off, None, extras=True)
    assert body["token_healing"] is False
    assert FimRequest.model_validate(body).infill_request().token_healing is False
    assert FimRequest.model_validate(fim_body(on, None, extras=True)).infill_request().token_healing
