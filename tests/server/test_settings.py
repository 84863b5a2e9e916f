"""Settings from an untrusted peer: any JSON value for any setting leaves settings within their bounds.

And what only the user may allow (`LocalPolicy`) comes from the command line, the environment or the
user's config file, read safely.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dg_lsp.settings import MASKED_CHECKS, NUMBER_BOUNDS, LocalPolicy, Settings

NUMBER_KEYS = {
    "maxTokens": "max_tokens",
    "denoisingSteps": "denoising_steps",
    "latencyBudgetMs": "latency_budget_ms",
    "debounceMs": "debounce_ms",
    "numCandidates": "num_candidates",
    "seed": "seed",
}
numbers = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 2**70, 10**9, -1, 1e400, 0.5, True, None, "5", [], {}]),
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
masked_keys = st.sampled_from(
    [
        "buckets",
        "threshold",
        "minTokens",
        "blockLength",
        "confidence",
        "steps",
        "temperature",
        "dualCache",
        "speculate",
    ]
)


def _within_bounds(s: Settings) -> None:
    for name, (lo, hi) in NUMBER_BOUNDS.items():
        value = getattr(s, name)
        assert type(value) is int and lo <= value <= hi, (name, value)
    assert isinstance(s.trust_remote_code, bool)
    for key, value in (s.extra.get("masked") or {}).items():
        from dg_lsp.settings import _snake

        assert MASKED_CHECKS[_snake(key)](value) == value


@settings(max_examples=300, deadline=None)
@given(
    data=st.dictionaries(st.sampled_from([*NUMBER_KEYS, "trustRemoteCode", "model", "x"]), json_values),
    masked=st.dictionaries(masked_keys, json_values) | json_values,
)
def test_any_json_leaves_every_setting_within_bounds(data, masked):
    merged, errors = Settings.merge({"dgLsp": {**data, "masked": masked}})
    _within_bounds(merged)
    assert all(e.startswith("invalid setting ") for e in errors)
    again, _ = Settings.merge(data, merged)  # merging onto non-defaults keeps them within bounds too
    _within_bounds(again)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("maxTokens", math.inf, "finite"),
        ("seed", 2**70, "from 0 to"),
        ("debounceMs", 1e9, "from 0 to 10000"),
        ("numCandidates", 0, "from 1 to 32"),
        ("latencyBudgetMs", math.nan, "finite"),
        ("denoisingSteps", 2.5, "whole number"),
        ("seed", True, "must be a number"),
    ],
)
def test_one_message_names_the_setting_and_the_old_value_is_kept(key, value, why):
    base = Settings(seed=7, debounce_ms=5)
    merged, errors = Settings.merge(
        {key: value, "maxTokens": 16} if key != "maxTokens" else {key: value}, base
    )
    assert len(errors) == 1 and errors[0].startswith(f"invalid setting {key}: ") and why in errors[0]
    assert getattr(merged, NUMBER_KEYS[key]) == getattr(base, NUMBER_KEYS[key])


def test_masked_options_are_checked_one_by_one():
    base, _ = Settings.merge({"masked": {"buckets": [8, 16], "threshold": 0.8}})
    merged, errors = Settings.merge({"masked": {"buckets": [10**9], "threshold": 0.5, "minTokens": -1}}, base)
    assert sorted(errors) == [
        "invalid setting masked.buckets: must be from 1 to 1024, got 1000000000",
        "invalid setting masked.minTokens: must be from 0 to 1024, got -1",
    ]
    assert merged.extra["masked"] == {"buckets": [8, 16], "threshold": 0.5}


def test_a_misspelled_masked_option_is_named_with_the_one_meant():
    """Unknown sampler options were dropped without a word, so a typo passed for a setting."""
    merged, errors = Settings.merge({"masked": {"freezFront": True, "window_ahed": 4, "zzz": 1, "steps": 6}})
    assert merged.extra["masked"] == {"steps": 6}
    assert sorted(errors) == [
        "invalid setting masked.freezFront: not a masked sampler option; did you mean freezeFront?",
        "invalid setting masked.window_ahed: not a masked sampler option; did you mean windowAhead?",
        "invalid setting masked.zzz: not a masked sampler option",
    ]


def test_masked_checks_cover_every_sampler_option():
    from dataclasses import fields

    from dg_lsp.engine.masked import MaskedSamplerConfig

    assert set(MASKED_CHECKS) == {f.name for f in fields(MaskedSamplerConfig)}
    from dg_lsp.engine.sampler import CONFIDENCE_KINDS
    from dg_lsp.settings import CONFIDENCE_KINDS as MIRRORED

    assert MIRRORED == CONFIDENCE_KINDS


# -- LocalPolicy ------------------------------------------------------------------------------------


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"DG_LSP_CONFIG": str(tmp_path / "absent.toml"), **extra}


def test_policy_defaults_to_nothing_allowed(tmp_path):
    policy = LocalPolicy.load(environ=_env(tmp_path))
    assert not policy.trust_remote_code and not policy.remote_engines and not policy.problems
    applied, note, refusal = policy.apply(Settings(trust_remote_code=True, model="remote:http://h:1"))
    assert not applied.trust_remote_code and "--trust-remote-code" in note
    assert "refused" in refusal


def test_policy_from_flag_environment_and_config(tmp_path):
    assert LocalPolicy.load(trust_flag=True, environ=_env(tmp_path)).trust_remote_code
    assert LocalPolicy.load(environ=_env(tmp_path, DG_LSP_TRUST_REMOTE_CODE="1")).trust_remote_code
    config = tmp_path / "config.toml"
    config.write_text('trust_remote_code = true\nremote_engines = ["http://team:8765/"]\n')
    policy = LocalPolicy.load(model="remote:http://me:1", environ={"DG_LSP_CONFIG": str(config)})
    assert policy.trust_remote_code and policy.remote_engines == {"http://team:8765", "http://me:1"}
    settings, note, refusal = policy.apply(Settings(model="remote:http://team:8765", trust_remote_code=True))
    assert settings.trust_remote_code and note is None and refusal is None
    xdg = tmp_path / "xdg" / "dg-lsp"
    xdg.mkdir(parents=True)
    (xdg / "config.toml").write_text("trust_remote_code = true\n")
    assert LocalPolicy.load(environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}).trust_remote_code


@pytest.mark.parametrize(
    "make",
    [
        lambda p: os.mkfifo(p),
        lambda p: p.symlink_to("/dev/zero"),
        lambda p: p.write_text("trust_remote_code = [\n"),
        lambda p: p.write_text("x = 1\n" * 300_000),
        lambda p: p.write_text('trust_remote_code = "yes"\nremote_engines = 5\n'),
    ],
    ids=["fifo", "dev-zero", "bad-toml", "huge", "wrong-types"],
)
def test_a_bad_config_file_allows_nothing_and_says_why(tmp_path, make):
    path = tmp_path / "config.toml"
    make(path)
    policy = LocalPolicy.load(environ={"DG_LSP_CONFIG": str(path)})  # returns at once, even for a FIFO
    assert not policy.trust_remote_code and not policy.remote_engines
    assert policy.problems and all(p for p in policy.problems)


def test_only_the_checked_masked_setting_reaches_the_sampler():
    from dg_lsp.engine.loader import masked_options
    from dg_lsp.engine.masked import MaskedSamplerConfig

    merged, errors = Settings.merge({"buckets": [10**9], "threshold": 5, "masked": {"minTokens": 2}})
    assert errors == []  # unknown top-level keys are kept for newer editors, not checked...
    config = MaskedSamplerConfig.from_options(masked_options(merged))
    assert config.buckets == MaskedSamplerConfig().buckets and config.threshold == 0.9  # ...nor used
    assert config.min_tokens == 2
    assert MaskedSamplerConfig.from_options(masked_options(Settings.merge({"buckets": [9]})[0])).buckets != (
        9,
    )


def test_complete_comments_lets_the_model_write_inside_a_comment(tiny_model_dir):
    """Off by default: a cursor inside a comment runs no model. `completeComments` runs it there."""
    from dg_lsp import context, pipeline
    from dg_lsp.engine.loader import load_engine

    source = "def area(r):\n    # the area of a circle of radi\n    return 3.14159 * r * r\n"
    offset = source.index("radi") + len("radi")
    snapshot = context.as_snapshot(source, "python")
    merged, errors = Settings.merge({"dgLsp": {"model": str(tiny_model_dir), "completeComments": True}})
    assert errors == [] and merged.complete_comments
    engine = load_engine(merged)
    off = pipeline.complete(engine, snapshot, offset, Settings(model=str(tiny_model_dir), denoising_steps=2))
    assert off.span_kind == "comment" and off.skipped == "span kind 'comment' is off"
    assert off.stats.forward_passes == 0
    on = pipeline.complete(engine, snapshot, offset, dataclasses.replace(merged, denoising_steps=2))
    assert on.span_kind == "comment" and on.skipped != off.skipped  # shown, or every candidate rejected
    assert on.stats.forward_passes >= 1
