"""User-facing settings, shared by the server, the CLI and the engine, and what only the user may allow.

One flat dataclass so that `initializationOptions`, `workspace/didChangeConfiguration`, CLI flags and
editor configuration all map onto the same names. Defaults must work with no settings at all.

Settings arrive over a socket, so they are data from an untrusted peer: every number is checked to
be finite and within the documented bounds (a seed of 2^70 or a 10^9 ms debounce used to break every
later request), and a bad value is reported by name and ignored instead of failing a request.

Two things are never decided by a setting: running code shipped in a model directory
(`trust_remote_code`) and talking to a remote engine. Only `LocalPolicy` (the command line, the
environment, a user-level config file) allows them; the LSP setting can only narrow that.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dg_lsp.files import FileRefused, read_regular_file

log = logging.getLogger(__name__)

# Settings whose change requires the resident model to be reloaded.
RELOAD_KEYS = frozenset({"model", "backend", "device", "quantization", "dtype", "trust_remote_code"})

NUMBER_BOUNDS: dict[str, tuple[int, int]] = {
    "max_tokens": (1, 1024),
    "denoising_steps": (0, 512),
    "latency_budget_ms": (0, 600_000),
    "debounce_ms": (0, 10_000),
    "num_candidates": (1, 32),
    "seed": (0, 2**63 - 1),
    "threads": (1, 256),
}
"""Inclusive bounds of every numeric setting (README, Settings). 0 steps or budget means no cap."""

MAX_STRING = 4096
MAX_LANGUAGES = 256
CONFIDENCE_KINDS = ("max_prob", "margin", "entropy", "leftmost")
"""Mirrors `dg_lsp.engine.sampler.CONFIDENCE_KINDS` without importing torch into settings."""


@dataclass(frozen=True)
class Settings:
    model: str = "embedded"
    """`embedded` (ships with dg-lsp: SmolLM2-135M adapted into a diffusion infill model; `embedded-smollm2`
    is the same), `embedded-tiny` (ships too: the 5M model, several times faster, rarely right), a local
    model directory, or `remote:http://host:port`."""
    backend: str = "auto"
    """`auto` (read from the model's config), `diffusion-gemma`, `masked`, `ar` or `remote`."""
    device: str = "auto"
    """`auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`."""
    quantization: str = "auto"
    """`auto`, `none`, `int4`, `int8`, `8bit` or `nf4` (bitsandbytes on CUDA). `int4` on a CPU with native
    bf16: the packed SmolLM2 models run their narrow passes (canvas passes of up to 6 rows, AR steps) over
    their own 4-bit base plus the unmerged adapter (`engine/cpu_int4.py`: the same weights, not a
    quantization; ~120 MiB more memory); `auto` does that for the AR twin, whose steps it makes 1.8x cheaper,
    and quantizes nothing else; `none` turns it off. `int4` on CUDA is `nf4`. `int8` on the CPU:
    the packed SmolLM2 models run passes in dynamic int8 (`engine/cpu_int8.py`: every pass over fp32 weights,
    passes of up to 64 rows over bf16 ones), other models hold int8 weights dequantized per call (smaller,
    not faster)."""
    dtype: str = "auto"
    """`auto` (`quantization.default_dtype`: bf16 on CUDA, and on native-bf16 CPUs for checkpoints of 50 MB
    or more; else fp32), `float32`, `bfloat16` or `float16`."""
    max_tokens: int = 48
    """Upper bound on generated tokens per completion; span kinds may choose fewer."""
    denoising_steps: int = 12
    """Upper bound on denoising passes per canvas; early exit may use fewer."""
    latency_budget_ms: int = 1500
    """Soft deadline per request; the engine caps steps to stay within it."""
    debounce_ms: int = 0
    """Wait this long after the last keystroke before running the model for inline completion. 0: a newer
    keystroke already cancels the running request between denoising steps (the worker's newest-per-document
    rule), and over replayed typing no wait gave twice the non-empty answers of 60 ms at about half the
    median latency, for 1.7x the model work (benchmarks/results/lsp_latency_variants/)."""
    num_candidates: int = 1
    enabled_languages: tuple[str, ...] = ("*",)
    """Language ids to serve; `*` means every language."""
    trust_remote_code: bool = False
    """Asks for a model's own code; it runs only if `LocalPolicy` allows it too."""
    seed: int = 0
    token_healing: bool = True
    """Complete a partially typed word from its start: the engine takes the word back out of the prompt, so
    the model is not stuck on a token boundary mid-word (`self.ite` gave `self.ites[-1]`). Off saves about
    one pass per mid-word request (benchmarks/results/embedded_smollm2/token_healing/)."""
    complete_comments: bool = False
    """Complete inside comments too (the rest of the comment's line, as prose). Off by default: at 33
    cursors inside comments of held-out files the embedded model finished the line as its author did twice
    and its twin 3 times, about half as often as at code cursors (benchmarks/results/pipeline_ceiling/)."""
    threads: int = 1
    """torch threads for the model. One by default: on a busy machine (an editor, a build, the language
    servers) a second intra-op thread made a pass 3-7 times slower than one thread did."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, base: Settings | None = None) -> Settings:
        """`merge`, raising `ValueError` on the first invalid value (for the command line)."""
        settings, errors = cls.merge(data, base)
        if errors:
            raise ValueError(errors[0])
        return settings

    @classmethod
    def merge(
        cls, data: Mapping[str, Any] | None, base: Settings | None = None
    ) -> tuple[Settings, list[str]]:
        """Merge a (possibly camelCase, possibly nested under `dgLsp`) mapping onto `base`.

        Returns the new settings and one "invalid setting NAME: why" line per rejected value; a rejected
        value keeps what `base` had. Unknown keys are kept in `extra` rather than rejected, so newer
        editor configs do not break older servers.
        """
        base = base or cls()
        if not data:
            return base, []
        if isinstance(data.get("dgLsp"), dict):
            data = data["dgLsp"]
        elif isinstance(data.get("dg-lsp"), dict):
            data = data["dg-lsp"]
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        updates: dict[str, Any] = {}
        extra = dict(base.extra)
        errors: list[str] = []
        for raw_key, value in data.items():
            key = _snake(str(raw_key))
            try:
                if key == "masked":
                    extra[raw_key], problems = _masked(value, base.extra.get(raw_key))
                    errors += [f"invalid setting {raw_key}.{p}" for p in problems]
                elif key in known:
                    updates[key] = _coerce(key, getattr(base, key), value)
                else:
                    extra[raw_key] = value
            except (ValueError, TypeError, OverflowError) as exc:
                errors.append(f"invalid setting {raw_key}: {exc}")
        return dataclasses.replace(base, **updates, extra=extra), errors

    def language_enabled(self, language_id: str) -> bool:
        return "*" in self.enabled_languages or language_id in self.enabled_languages

    def needs_reload(self, other: Settings) -> bool:
        return any(getattr(self, k) != getattr(other, k) for k in RELOAD_KEYS)


def _snake(name: str) -> str:
    out = []
    for ch in name.replace("-", "_"):
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).lstrip("_")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def whole_number(value: Any, lo: int, hi: int) -> int:
    """A JSON number that is a whole number within [lo, hi] (48.0 is 48); `ValueError` says why not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {_shown(value)}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"must be a whole number, got {_shown(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"must be from {lo} to {hi}, got {_shown(value)}")
    return int(value)


def real_number(value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):  # (math.isfinite overflows on 10**400)
        raise ValueError(f"must be a finite number, got {_shown(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"must be from {lo} to {hi}, got {_shown(value)}")
    return float(value)


def _coerce(key: str, current: Any, value: Any) -> Any:
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        raise ValueError(f"must be true or false, got {_shown(value)}")
    if isinstance(current, int):
        return whole_number(value, *NUMBER_BOUNDS[key])
    if isinstance(current, tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"must be a list of strings, got {_shown(value)}")
        if len(value) > MAX_LANGUAGES or any(len(v) > MAX_STRING for v in value):
            raise ValueError(f"at most {MAX_LANGUAGES} names")
        return tuple(value)
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {_shown(value)}")
        if len(value) > MAX_STRING or "\x00" in value:
            raise ValueError(f"must be a string of at most {MAX_STRING} characters without NUL")
        return value
    return value


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else check(v)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false, got {_shown(value)}")


def _confidence(value: Any) -> str:
    if value in CONFIDENCE_KINDS:
        return value
    raise ValueError(f"must be one of {', '.join(CONFIDENCE_KINDS)}, got {_shown(value)}")


def _buckets(value: Any) -> list[int]:
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 16:
        raise ValueError(f"must be a list of 1 to 16 canvas lengths, got {_shown(value)}")
    return [whole_number(v, 1, 1024) for v in value]


def _one_of(value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"must be one of {list(choices)}, got {_shown(value)}")
    return value


def _commit_rules(value: Any) -> list[str]:
    """`"factor"`, `"factor:1.5,prophet"` or a list of such names: checked by the sampler's own parser
    (imported lazily: settings stay free of torch)."""
    from dg_lsp.engine.commit import parse_rules

    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 8:
        raise ValueError(f"must be a rule name or a list of up to 8, got {_shown(value)}")
    parse_rules(value)
    return value


MASKED_CHECKS: dict[str, Callable[[Any], Any]] = {
    "steps": lambda v: whole_number(v, 1, 512),
    "confidence": _confidence,
    "threshold": _optional(lambda v: real_number(v, 0.0, 1.0)),
    "temperature": lambda v: real_number(v, 0.0, 10.0),
    "buckets": _buckets,
    "logits_shift": _optional(_boolean),
    "dual_cache": _boolean,
    "refresh_every": lambda v: whole_number(v, 0, 512),
    "refresh_blocks": _boolean,
    "trim_tail": _boolean,
    "trim_margin": lambda v: whole_number(v, 0, 1024),
    "freeze_front": _boolean,
    "window_ahead": lambda v: whole_number(v, 0, 1024),
    "stop_at_frontier": _boolean,
    "min_tokens": lambda v: whole_number(v, 0, 1024),
    "block_length": _optional(lambda v: whole_number(v, 1, 1024)),
    "commit": _optional(lambda v: _commit_rules(v)),
    "stops_in_quota": _boolean,
    "schedule": lambda v: _one_of(v, ("even", "dream", "one")),
    "min_capped_steps": lambda v: whole_number(v, 1, 512),
    "format": lambda v: _one_of(v, ("auto", "bos", "plain", "dreamon", "chat")),
    "native_family": _optional(lambda v: _one_of(v, ("dream", "llada"))),
    "expand_start": lambda v: whole_number(v, 1, 1024),
    "speculate": lambda v: whole_number(v, 0, 16),
    "grow_from": lambda v: whole_number(v, 0, 1024),
    "grow_from_multiline": lambda v: whole_number(v, 0, 1024),
}
"""Bounds of the masked sampler's options (`dg_lsp.engine.masked.MaskedSamplerConfig`)."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _unknown_masked(key: str) -> str:
    """Why an option is left out, with the nearest known name when one is close (`freezFront`)."""
    import difflib

    near = difflib.get_close_matches(_snake(key[:40]), list(MASKED_CHECKS), n=1, cutoff=0.75)
    hint = f"; did you mean {_camel(near[0])}?" if near else ""
    return f"not a masked sampler option{hint}"


def _masked(value: Any, previous: Any) -> tuple[dict[str, Any], list[str]]:
    """The masked sampler options with every invalid one replaced by its previous value (or dropped)."""
    if not isinstance(value, dict):
        raise ValueError(f"must be an object, got {_shown(value)}")
    before = previous if isinstance(previous, dict) else {}
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for raw_key, item in value.items():
        check = MASKED_CHECKS.get(_snake(str(raw_key)))
        if check is None:  # left out, as the sampler would, but said: a typo must not pass for a setting
            problems.append(f"{str(raw_key)[:40]}: {_unknown_masked(str(raw_key))}")
            continue
        try:
            kept[raw_key] = check(item)
        except (ValueError, TypeError, OverflowError) as exc:
            problems.append(f"{raw_key}: {exc}")
            if raw_key in before:
                kept[raw_key] = before[raw_key]
    return kept, problems


# -- what only the person at the keyboard can allow ------------------------------------------------

TRUST_ENV = "DG_LSP_TRUST_REMOTE_CODE"
CONFIG_ENV = "DG_LSP_CONFIG"
CONFIG_CAP = 1024 * 1024
HOW_TO_TRUST = (
    f"To allow it, start dg-lsp with --trust-remote-code, set {TRUST_ENV}=1 in its environment, or put "
    "`trust_remote_code = true` in ~/.config/dg-lsp/config.toml"
)


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """`$DG_LSP_CONFIG`, else `$XDG_CONFIG_HOME/dg-lsp/config.toml`, else `~/.config/dg-lsp/config.toml`."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dg-lsp" / "config.toml"


@dataclass(frozen=True)
class LocalPolicy:
    """Opt-ins only the user at the keyboard can make: a setting that arrives over a socket is no proof.

    `trust_remote_code` lets a model directory's Python run (transformers' `trust_remote_code`);
    `remote_engines` are the engine URLs the server may connect to (`model = remote:URL`).
    """

    trust_remote_code: bool = False
    remote_engines: frozenset[str] = frozenset()
    problems: tuple[str, ...] = ()
    """What was wrong with the config file; shown once, the rest of the policy still applies."""

    @classmethod
    def load(
        cls, trust_flag: bool = False, model: str | None = None, environ: Mapping[str, str] = os.environ
    ) -> LocalPolicy:
        """The command line's `--trust-remote-code` and `--model`, the environment and the config file."""
        config, problems = _read_config(config_path(environ))
        trust = trust_flag or environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")
        value = config.get("trust_remote_code", False)
        if not isinstance(value, bool):
            problems.append("trust_remote_code must be true or false")
        trust = trust or value is True
        engines = config.get("remote_engines", [])
        if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
            problems.append("remote_engines must be a list of URLs")
            engines = []
        urls = {_engine_url(e) for e in engines}
        if model is not None and _is_remote(model, "auto"):
            urls.add(_engine_url(model))
        return cls(trust, frozenset(urls), tuple(problems))

    def apply(self, settings: Settings) -> tuple[Settings, str | None, str | None]:
        """(settings to load with, a note for the user, a refusal): the setting can only narrow."""
        note = None
        if settings.trust_remote_code and not self.trust_remote_code:
            settings = dataclasses.replace(settings, trust_remote_code=False)
            note = f"trustRemoteCode is ignored: the model loads without its own code. {HOW_TO_TRUST}"
        if _is_remote(settings.model, settings.backend):
            url = _engine_url(settings.model)
            if url not in self.remote_engines:
                return (
                    settings,
                    note,
                    (
                        f"remote engine {url!r} refused: name it on the command line (--model remote:{url}) "
                        f"or list it under remote_engines in {config_path()}"
                    ),
                )
        return settings, note, None


def _is_remote(model: str, backend: str) -> bool:
    return model.startswith("remote:") or backend == "remote"


def _engine_url(model: str) -> str:
    return model.removeprefix("remote:").strip().rstrip("/")


def _read_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    try:
        raw = read_regular_file(path, CONFIG_CAP)
    except FileNotFoundError:
        return {}, []
    except (FileRefused, OSError) as exc:
        return {}, [f"{path}: {exc}"]
    try:
        return tomllib.loads(raw.decode("utf-8")), []
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return {}, [f"{path}: not valid TOML: {exc}"]
