from dg_lsp.cli import main

raise SystemExit(main())
