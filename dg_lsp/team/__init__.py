"""The team server: `dg-lsp serve-engine` on Ray Serve (or in-process), speaking the FIM HTTP convention."""
