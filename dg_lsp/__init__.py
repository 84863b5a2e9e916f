"""dg-lsp: code infill from diffusion language models, served over LSP."""

__version__ = "0.1.0"
