"""Install truth: what `pip install .` and `pipx install .` from a clone put on a machine.

Editors start the installed `dg-lsp`; with no model in the wheel it would start and fail to load the
default `embedded` model. The messages the editor integrations show name install commands: they must
be commands that work for this project (it is not on PyPI).
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from editor_support import EDITORS, REPO

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.mark.timeout(300)
def test_the_wheel_carries_the_embedded_model_and_the_example(tmp_path: Path) -> None:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = subprocess.run(
        [*pip_wheel, "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("dg_lsp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for model in ("embedded_tiny", "ar_twin"):
            for name in MODEL_FILES:
                path = f"dg_lsp/models/{model}/{name}"
                assert path in names, path
                local = REPO / path
                assert archive.getinfo(path).file_size == local.stat().st_size, path  # not an LFS pointer
        adapted = ("config.json", "adapter.safetensors", "tokenizer.json", "tokenizer_config.json")
        shipped = [f"dg_lsp/models/{m}/{n}" for m in ("embedded_smollm2", "ar_twin_smollm2") for n in adapted]
        for path in [*shipped, "dg_lsp/models/smollm2_base/base.safetensors"]:  # model = embedded (SmolLM2)
            assert path in names, path
            assert archive.getinfo(path).file_size == (REPO / path).stat().st_size, path
        assert "dg_lsp/examples/stack.py" in names
        assert any(n.endswith("entry_points.txt") for n in names)
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        assert "dg-lsp = dg_lsp.cli:main" in entry_points


def test_editor_messages_and_docs_name_install_commands_that_work() -> None:
    """`pip install dg-lsp` does not exist on PyPI; every install hint is from a clone."""
    sources = [
        *EDITORS.glob("*/README.md"),
        EDITORS / "README.md",
        EDITORS / "vscode" / "src" / "settings.ts",
        EDITORS / "vscode" / "src" / "extension.ts",
        EDITORS / "nvim" / "lua" / "dg_lsp" / "init.lua",
        EDITORS / "emacs" / "dg-lsp.el",
        REPO / "README.md",
    ]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install (-U )?dg-lsp\b(?!\[)", text), path
        assert not re.search(r"pipx install dg-lsp\b", text), path
    for hint_source in ("vscode/src/settings.ts", "nvim/lua/dg_lsp/init.lua"):
        text = (EDITORS / hint_source).read_text(encoding="utf-8")
        assert "pip install torch==2.13.0 && pip install -e ." in text, hint_source
        assert "pipx install --preinstall torch==2.13.0 ." in text, hint_source
