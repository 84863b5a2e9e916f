"""Inference engine: samplers, caches and quantization over a resident model."""

from dg_lsp.engine.types import (
    Cancelled,
    Candidate,
    InfillEngine,
    InfillRequest,
    InfillResult,
    InfillStats,
)

__all__ = ["Cancelled", "Candidate", "InfillEngine", "InfillRequest", "InfillResult", "InfillStats"]
