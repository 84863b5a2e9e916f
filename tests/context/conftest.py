from __future__ import annotations

import pytest

from dg_lsp.context import build_context, parse_snapshot

CURSOR = "<|>"


def split_cursor(src: str) -> tuple[str, int]:
    """Text without the `<|>` marker, and the marker's offset."""
    offset = src.index(CURSOR)
    return src.replace(CURSOR, "", 1), offset


@pytest.fixture
def ctx_at():
    def make(src: str, language: str, **kwargs):
        text, offset = split_cursor(src)
        snap = parse_snapshot(text, language)
        return build_context(snap, offset, **kwargs), snap

    return make
