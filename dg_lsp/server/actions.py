"""Which infill code actions apply at a range, and the span each one re-denoises.

Pure functions over a document snapshot: offering actions must stay cheap (no model call) because
editors ask for them on every cursor move; the model runs only when one is resolved or executed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lsprotocol import types

from dg_lsp import context

FILL = "fill"
REWRITE = "rewrite"
PLACEHOLDER = "placeholder"
REPAIR = "repair"

TITLES = {
    FILL: "Fill in here (dg-lsp)",
    REWRITE: "Rewrite selection (dg-lsp)",
    PLACEHOLDER: "Fill placeholder (dg-lsp)",
    REPAIR: "Repair syntax error (dg-lsp)",
}
KINDS = {
    FILL: types.CodeActionKind.RefactorRewrite,
    REWRITE: types.CodeActionKind.RefactorRewrite,
    PLACEHOLDER: types.CodeActionKind.RefactorRewrite,
    REPAIR: types.CodeActionKind.QuickFix,
}


@dataclass(frozen=True)
class ActionSpec:
    action: str
    start: int
    end: int
    uri: str = ""
    version: int = 0
    detail: str = ""

    @property
    def title(self) -> str:
        title = TITLES[self.action]
        return f"{title}: {self.detail}" if self.detail else title

    @property
    def kind(self) -> types.CodeActionKind:
        return KINDS[self.action]

    def to_data(self, uri: str, version: int) -> dict[str, Any]:
        data = asdict(self)
        data.update(uri=uri, version=version)
        return data

    @classmethod
    def from_data(cls, data: Any) -> ActionSpec | None:
        """Parse client-echoed data defensively: it crossed the wire and may be anything."""
        if not isinstance(data, dict) or data.get("action") not in TITLES:
            return None
        try:
            spec = cls(
                action=str(data["action"]),
                start=_whole(data["start"]),
                end=_whole(data["end"]),
                uri=str(data["uri"]),
                version=_whole(data["version"]),
                detail=str(data.get("detail", "")),
            )
        except (KeyError, TypeError):
            return None
        if spec.start < 0 or spec.end < spec.start:
            return None
        return spec


def _whole(value: Any) -> int:
    """We sent integers; anything else (1e400, 2.5, "3", true) was not ours."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}"[:80])
    return value


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    return line_start, len(text) if line_end == -1 else line_end


def available(snapshot: context.DocumentSnapshot, start: int, end: int) -> list[ActionSpec]:
    text = snapshot.text
    start, end = max(0, min(start, len(text))), max(0, min(end, len(text)))
    if end < start:
        start, end = end, start
    found: list[ActionSpec] = []
    if start == end:
        found.append(ActionSpec(FILL, start, end))
    else:
        found.append(ActionSpec(REWRITE, start, end))
    lo, hi = _line_bounds(text, start, end)
    for ph in context.find_placeholders(snapshot):
        if ph.start <= hi and ph.end >= lo:
            found.append(
                ActionSpec(PLACEHOLDER, ph.start, ph.end, detail=text[ph.start : ph.end].strip()[:40])
            )
    for issue in context.find_syntax_errors(snapshot, lo, hi):
        s, e = issue.repair_start, issue.repair_end
        found.append(ActionSpec(REPAIR, s, e, detail=f"line {text.count(chr(10), 0, issue.start) + 1}"))
    return _dedupe(found)


def _dedupe(specs: list[ActionSpec]) -> list[ActionSpec]:
    seen: set[tuple[str, int, int]] = set()
    out = []
    for spec in specs:
        key = (spec.action, spec.start, spec.end)
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


def finish_text(spec: ActionSpec, text: str) -> str:
    """The infill replaces the whole span; a repaired line must keep its line structure."""
    if spec.action == REPAIR:
        return text.rstrip("\n")
    return text
