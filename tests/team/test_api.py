"""The FIM request schema and answer shape, without a server: what is accepted, what is refused, and how
FIM's fields map onto an infill request."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the team server's HTTP layer needs fastapi: pip install -e '.[test]'")

from pydantic import ValidationError

from dg_lsp.engine.remote import fim_body
from dg_lsp.engine.types import Candidate, InfillRequest, InfillResult, InfillStats
from dg_lsp.team.api import MAX_CANDIDATES, MAX_TOKENS, FimRequest, cut_at_stops, fim_response

GOOD = {"prompt": "def f(x):\n    return ", "suffix": "\n", "max_tokens": 16}


def test_a_plain_fim_body_maps_onto_an_infill_request():
    body = FimRequest.model_validate({**GOOD, "model": "codestral-latest", "temperature": 0.2, "top_p": 1})
    request = body.infill_request()
    assert (request.prefix, request.suffix, request.max_tokens) == (GOOD["prompt"], "\n", 16)
    assert request.num_candidates == 1 and not request.single_line and request.doc_key is None
    one_line = FimRequest.model_validate({**GOOD, "stop": ["\n"], "n": 3, "document": "file:///a.py"})
    request = one_line.infill_request()
    assert request.single_line and request.num_candidates == 3 and request.doc_key == "file:///a.py"
    assert FimRequest.model_validate({**GOOD, "stop": "\n"}).infill_request().single_line


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": 5},
        {"prompt": None},
        {"suffix": ["x"]},
        {"max_tokens": 0},
        {"max_tokens": MAX_TOKENS + 1},
        {"max_tokens": "16"},
        {"max_tokens": True},
        {"max_tokens": 1.5},
        {"n": MAX_CANDIDATES + 1},
        {"n": 10**9},
        {"temperature": -1},
        {"temperature": float("inf")},
        {"seed": 2**70},
        {"seed": -1},
        {"steps": 10**9},
        {"stop": ["x"] * 100},
        {"stop": "x" * 10_000},
        {"document": "d" * 10_000},
        {"request_id": "r" * 1000},
        {"blank_start": "no"},
        {"deadline_ms": -5},
    ],
)
def test_every_field_is_typed_and_bounded(change):
    with pytest.raises(ValidationError):
        FimRequest.model_validate({**GOOD, **change})


def test_the_prompt_is_required_and_unknown_fields_are_ignored():
    with pytest.raises(ValidationError):
        FimRequest.model_validate({"suffix": "x"})
    assert FimRequest.model_validate({**GOOD, "logprobs": 3, "echo": False}).prompt == GOOD["prompt"]


def test_answers_cut_at_stops_and_say_why_they_ended():
    assert cut_at_stops("a = 1\nb = 2", ["\n"]) == ("a = 1", True)
    assert cut_at_stops("abc", ["x", "bc"]) == ("a", True)
    assert cut_at_stops("abc", []) == ("abc", False)
    stats = InfillStats(generated_tokens=16, prompt_tokens=9, forward_passes=4)
    result = InfillResult([Candidate("x + 1\ny", -0.5, list(range(16))), Candidate("x", -0.9, [1])], stats)
    body = FimRequest.model_validate({**GOOD, "stop": ["\n"], "n": 2})
    answer = fim_response(result, body, "dg-lsp", "cmpl-1")
    assert [c["text"] for c in answer["choices"]] == ["x + 1", "x"]
    assert [c["finish_reason"] for c in answer["choices"]] == ["stop", "stop"]
    assert answer["usage"] == {"prompt_tokens": 9, "completion_tokens": 16, "total_tokens": 25}
    full = fim_response(result, FimRequest.model_validate(GOOD), "dg-lsp", "cmpl-2")
    assert full["choices"][0]["finish_reason"] == "length" and full["choices"][0]["text"] == "x + 1\ny"
    # an engine's own word wins over the count: a canvas cut short by a deadline did not stop
    short = Candidate("x", -0.9, [1], stopped=False)
    whole = Candidate("x + 1\ny", 0.0, list(range(16)), stopped=True)
    answer = fim_response(InfillResult([short, whole]), FimRequest.model_validate(GOOD), "m", "c")
    assert [c["finish_reason"] for c in answer["choices"]] == ["length", "stop"]


def test_the_client_sends_extras_only_to_a_dg_lsp_server():
    request = InfillRequest("a", "b", max_tokens=8, single_line=True, steps=3, doc_key="d", seed=2)
    plain = fim_body(request, "codestral-latest", extras=False, request_id="r")
    assert set(plain) == {"model", "prompt", "suffix", "max_tokens", "temperature", "n", "stop"}
    assert plain["stop"] == ["\n"]
    ours = fim_body(request, None, extras=True, request_id="r")
    assert (ours["steps"], ours["document"], ours["request_id"], ours["seed"]) == (3, "d", "r", 2)
    assert FimRequest.model_validate(ours).infill_request() == InfillRequest(
        "a", "b", max_tokens=8, single_line=True, steps=3, doc_key="d", seed=2
    )


def test_a_clients_documents_are_its_own():
    """Two clients with the same path send different document keys, and neither sends the path."""
    request = InfillRequest("a", "b", doc_key="file:///workspace/src/app.py")
    mine = fim_body(request, None, extras=True, scope="client-1")["document"]
    again = fim_body(request, None, extras=True, scope="client-1")["document"]
    theirs = fim_body(request, None, extras=True, scope="client-2")["document"]
    other = fim_body(InfillRequest("a", "b", doc_key="file:///x.py"), None, extras=True, scope="client-1")
    assert mine == again and len({mine, theirs, other["document"]}) == 3
    assert "app.py" not in mine and "workspace" not in mine
    assert "document" not in fim_body(InfillRequest("a", "b"), None, extras=True, scope="client-1")
