"""Emacs end to end: editors/emacs/dg-lsp.el in batch Emacs with Eglot, against the real server.

emacs_e2e.el does what a user does (dg-lsp-setup, open a file, eglot-ensure, completion-at-point,
dg-lsp-fill) and prints a JSON summary; this test checks that summary.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from editor_support import EDITORS, SAMPLE_TEXT, editor_env

EMACS = shutil.which("emacs")
SCRIPT = Path(__file__).with_name("emacs_e2e.el")


def _has_eglot() -> bool:
    if EMACS is None:
        return False
    probe = subprocess.run(
        [EMACS, "--batch", "--eval", '(kill-emacs (if (locate-library "eglot") 0 1))'],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


pytestmark = [
    pytest.mark.skipif(EMACS is None, reason="emacs not on PATH (editors/install-test-deps.sh installs it)"),
    pytest.mark.skipif(EMACS is not None and not _has_eglot(), reason="eglot not available to batch Emacs"),
    pytest.mark.timeout(420),
]


def test_dg_lsp_el_byte_compiles_without_warnings(tmp_path: Path) -> None:
    assert EMACS is not None
    source = tmp_path / "dg-lsp.el"
    shutil.copy(EDITORS / "emacs" / "dg-lsp.el", source)
    strict = "(setq byte-compile-error-on-warn t)"
    done = subprocess.run(
        [EMACS, "--batch", "--eval", strict, "-f", "batch-byte-compile", str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "dg-lsp.elc").exists()


def test_eglot_completion_progress_and_code_action(
    tmp_path: Path, server_cmd: list[str], server_settings: dict
) -> None:
    assert EMACS is not None
    text_file = tmp_path / "notes.txt"
    text_file.write_text(SAMPLE_TEXT, encoding="utf-8")
    env = editor_env(tmp_path)
    env.update(
        HOME=str(tmp_path),  # batch Emacs skips init files; HOME keeps ~/.emacs.d writes out of the way
        DG_TEST_EMACS_DIR=str(EDITORS / "emacs"),
        DG_TEST_SERVER_CMD=json.dumps(server_cmd),
        DG_TEST_SETTINGS=json.dumps(server_settings),
        DG_TEST_FILE=str(text_file),
    )
    # Plain --batch (not -Q) so Debian's site-start puts the packaged eglot on the load-path.
    done = subprocess.run(
        [EMACS, "--batch", "-l", str(SCRIPT)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=400,
    )
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.startswith("DG-RESULT ")]
    assert done.returncode == 0 and lines, output[-4000:]
    result = json.loads(lines[-1].removeprefix("DG-RESULT "))

    # Progress: our $/progress handler saw the model load end; the buffer is served as plain text.
    assert result["ready"] is True
    assert result["status"] == "dg-lsp: ready"
    assert result["language"] == "text"

    # Completion fallback: completion-at-point inserted the server's infill exactly, at the cursor.
    original = SAMPLE_TEXT
    assert result["before"] == original
    assert result["offered"] >= 1
    expected = result["expected"]
    assert expected
    cursor = len(original.rstrip("\n"))
    assert result["after_completion"] == original[:cursor] + expected + original[cursor:]

    # Code action: "Fill in here (dg-lsp)" went executeCommand -> workspace/applyEdit -> buffer.
    after = result["after_action"]
    assert after != original
    assert after.startswith(original[:cursor]) and after.endswith(original[cursor:])

    # dg-lsp-update-settings merged the change (and notified the server without error).
    assert result["settings"]["maxTokens"] == 4
    assert result["settings"]["model"] == server_settings["model"]


def test_readme_snippet_serves_python_and_says_when_there_is_no_infill(
    tmp_path: Path, server_cmd: list[str], server_settings: dict
) -> None:
    """Eglot's own Python entry (pylsp, pyright, ...) must not win when none of them is installed."""
    assert EMACS is not None
    if any(shutil.which(p) for p in ("pylsp", "pyls", "pyright-langserver", "jedi-language-server")):
        pytest.skip("a Python language server is installed here: Eglot rightly keeps it")
    source = tmp_path / "stack.py"
    source.write_text("def peek(items):\n    return \n", encoding="utf-8")
    env = editor_env(tmp_path)
    env.update(
        HOME=str(tmp_path),
        DG_TEST_EMACS_DIR=str(EDITORS / "emacs"),
        DG_TEST_SERVER_CMD=json.dumps(server_cmd),
        DG_TEST_SETTINGS=json.dumps({**server_settings, "model": str(tmp_path / "no-such-model")}),
        DG_TEST_FILE=str(source),
    )
    done = subprocess.run(
        [EMACS, "--batch", "-l", str(SCRIPT.with_name("emacs_python_e2e.el"))],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.startswith("DG-RESULT ")]
    assert done.returncode == 0 and lines, output[-4000:]
    result = json.loads(lines[-1].removeprefix("DG-RESULT "))
    assert result["mode"] == "python-mode" and result["prefer"] is None
    assert result["server"] == "dg-lsp-server" and result["language"] == "python"
    assert result["status"].startswith("dg-lsp: model failed") and result["ready"] is False
    assert result["unchanged"] is True
    assert result["fill_said"] and result["fill_said"].startswith("dg-lsp: "), result
    assert "no infill" in result["fill_said"], result
