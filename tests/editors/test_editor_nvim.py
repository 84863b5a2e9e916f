"""Neovim end to end: editors/nvim loaded by a real headless Neovim, talking to the real server.

The test drives Neovim like a user, through its RPC socket: `--remote-send` types keys and
`--remote-expr` reads state. On Neovim 0.11 this exercises the completion fallback; on >= 0.12 the
same test exercises ghost text (vim.lsp.inline_completion).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from editor_support import EDITORS, SAMPLE_TEXT, editor_env, wait_for

NVIM = shutil.which("nvim")
INIT = Path(__file__).with_name("nvim_init.lua")

# Generous: the first load imports torch and transformers in a fresh process on a shared 2-core box.
READY_TIMEOUT = 180
INFILL_TIMEOUT = 90


def _nvim_version() -> tuple[int, int, int] | None:
    if NVIM is None:
        return None
    out = subprocess.run([NVIM, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"NVIM v(\d+)\.(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


VERSION = _nvim_version()
pytestmark = [
    pytest.mark.skipif(NVIM is None, reason="nvim not on PATH (editors/install-test-deps.sh installs it)"),
    pytest.mark.skipif(
        VERSION is not None and VERSION < (0, 11, 0),
        reason=f"editors/nvim needs Neovim >= 0.11 (vim.lsp.config), found {VERSION}",
    ),
    pytest.mark.timeout(420),
]


class Nvim:
    """A headless Neovim driven through its --listen socket."""

    def __init__(self, sock: Path, proc: subprocess.Popen[bytes]) -> None:
        self.sock = str(sock)
        self.proc = proc

    def _remote(self, *args: str, timeout: float = 30) -> str:
        assert NVIM is not None
        if self.proc.poll() is not None:
            pytest.fail(f"nvim exited with {self.proc.returncode}")
        done = subprocess.run(
            [NVIM, "--headless", "--server", self.sock, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return done.stdout

    def send(self, keys: str) -> None:
        self._remote("--remote-send", keys)

    def state(self) -> dict:
        raw = self._remote("--remote-expr", "luaeval('dg_test.state()')")
        return json.loads(raw) if raw.strip() else {}

    def completion_count(self) -> int:
        """Items the server returns at the cursor now (a synchronous textDocument/completion)."""
        return int(self._remote("--remote-expr", "luaeval('dg_test.completion_count()')", timeout=90))

    def edit(self, path: Path) -> dict:
        """Open `path` in normal mode and wait until the server is attached and its model is loaded."""
        self.send(f"<C-\\><C-n>:edit! {path}<CR>")
        return wait_for(
            self.state,
            lambda s: s.get("attached") and s.get("ready") and s["lines"][:1] == [SAMPLE_TEXT.rstrip("\n")],
            READY_TIMEOUT,
            "dg-lsp to attach and finish loading the model (progress end)",
        )


@contextlib.contextmanager
def start_nvim(tmp: Path, server_cmd: list[str], server_settings: dict) -> Iterator[Nvim]:
    """A headless Neovim with tests/editors/nvim_init.lua, which calls require('dg_lsp').setup()."""
    assert NVIM is not None
    env = editor_env(tmp)
    env.update(
        DG_TEST_NVIM_RTP=str(EDITORS / "nvim"),
        DG_TEST_SERVER_CMD=json.dumps(server_cmd),
        DG_TEST_SETTINGS=json.dumps(server_settings),
    )
    sock = tmp / "nvim.sock"
    log = (tmp / "nvim.stderr").open("wb")
    proc = subprocess.Popen(
        [NVIM, "--headless", "-n", "-i", "NONE", "-u", str(INIT), "--listen", str(sock)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        cwd=tmp,
    )
    try:
        wait_for(sock.exists, bool, 30, "nvim to open its socket")
        yield Nvim(sock, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def nvim(
    tmp_path_factory: pytest.TempPathFactory, server_cmd: list[str], server_settings: dict
) -> Iterator[Nvim]:
    with start_nvim(tmp_path_factory.mktemp("nvim"), server_cmd, server_settings) as editor:
        yield editor


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(SAMPLE_TEXT, encoding="utf-8")
    return path


def test_loads_model_with_progress_and_picks_mode(nvim: Nvim, text_file: Path) -> None:
    state = nvim.edit(text_file)
    assert state["ready"], state  # a window/workDoneProgress `end` from the server was seen
    assert state["status"] == "dg-lsp"
    expected = "inline" if VERSION and VERSION >= (0, 12, 0) else "completion"
    assert state["mode"] == expected


def test_accept_inserts_infill_at_cursor(nvim: Nvim, text_file: Path) -> None:
    before = nvim.edit(text_file)
    line = before["lines"][0]
    nvim.send("A")  # insert at end of line 1: the cursor the infill is for
    if before["mode"] == "completion":
        nvim.send("<C-Space>")  # the module's trigger key (autotrigger covers typed trigger chars)
        shown = wait_for(nvim.state, lambda s: s["pum"], INFILL_TIMEOUT, "the completion menu")
        # noinsert: the first item is selected, not yet inserted. Its whole text, not the menu word
        # (Neovim 0.11 cuts that at the first space), is what accepting must put in the buffer.
        expected = line + shown["pum_texts"][0]
    else:
        nvim.send(" ")  # typing triggers inline completion; wait for the ghost-text extmark
        line += " "
        wait_for(nvim.state, lambda s: s["ghost"] > 0, INFILL_TIMEOUT, "ghost text")
        expected = None  # the candidate text is only visible as an extmark
    nvim.send("<Tab>")  # the module's accept key
    after = wait_for(
        nvim.state, lambda s: "".join(s["lines"]) != line, 30, "the accepted infill to change the buffer"
    )
    nvim.send("<Esc>")
    text = "\n".join(after["lines"])
    assert text.startswith(line), "text before the cursor must be kept"
    assert len(text) > len(line), "accepting must insert the infill"
    if expected is not None:
        assert text == expected, "the accepted item must be inserted whole, at the cursor"
    assert not after["pum"]


def test_accept_inserts_a_multi_line_infill_whole(nvim: Nvim, text_file: Path) -> None:
    """Neovim 0.11's menu word stops at the first space; the buffer must get every line of the item."""
    before = nvim.edit(text_file)
    if before["mode"] != "completion":
        pytest.skip("the completion menu is the fallback for Neovim < 0.12")
    line = before["lines"][0]
    infill = "if value is None:\n    return default"
    # A double-quoted Vim string: `\n` in it is a newline.
    nvim.send('A<C-r>=v:lua.dg_test.offer("' + infill.replace("\n", "\\n") + '")<CR>')
    shown = wait_for(nvim.state, lambda s: s["pum"], 30, "the completion menu")
    assert shown["pum_words"] == ["if"]  # what Neovim alone would have inserted
    nvim.send("<Tab>")
    after = wait_for(nvim.state, lambda s: len(s["lines"]) > len(before["lines"]), 30, "the infill")
    nvim.send("<Esc>")
    assert after["lines"][:2] == [line + "if value is None:", "    return default"], after["lines"]
    assert after["lines"][2:] == before["lines"][1:]
    assert after["cursor"] == [2, len("    return default")]


def test_typing_a_trigger_character_opens_the_menu(nvim: Nvim, text_file: Path) -> None:
    before = nvim.edit(text_file)
    if before["mode"] != "completion":
        pytest.skip("the completion autotrigger is the fallback for Neovim < 0.12")
    nvim.send("A ")  # space is one of the server's completion trigger characters
    shown = wait_for(nvim.state, lambda s: s["pum"], INFILL_TIMEOUT, "the menu to open by itself")
    nvim.send("<C-]><Esc>")
    assert shown["pum_words"], shown


def test_dismiss_keeps_buffer(nvim: Nvim, text_file: Path) -> None:
    before = nvim.edit(text_file)
    if before["mode"] != "completion":
        pytest.skip("inline dismiss is exercised only where Neovim >= 0.12 can run")
    nvim.send("A<C-Space>")
    wait_for(nvim.state, lambda s: s["pum"], INFILL_TIMEOUT, "the completion menu")
    nvim.send("<C-]>")  # the module's dismiss key
    after = wait_for(nvim.state, lambda s: not s["pum"], 30, "the menu to close")
    nvim.send("<Esc>")
    assert after["lines"] == before["lines"]


def test_fill_code_action_edits_buffer(nvim: Nvim, text_file: Path) -> None:
    before = nvim.edit(text_file)
    nvim.send(":call cursor(1, 999)<CR>:DgLspAction fill<CR>")
    after = wait_for(
        nvim.state,
        lambda s: s["tick"] != before["tick"],
        INFILL_TIMEOUT,
        "the resolved 'Fill in here (dg-lsp)' edit to be applied",
    )
    assert after["lines"] != before["lines"]
    assert after["lines"][0].startswith(before["lines"][0].rstrip())


def test_update_settings_reaches_the_running_server(nvim: Nvim, text_file: Path) -> None:
    nvim.edit(text_file)
    nvim.send(":call cursor(1, 999)<CR>")
    assert nvim.completion_count() > 0
    # Serving only Python: the plain-text buffer must now get nothing (didChangeConfiguration arrived).
    nvim.send(":lua require('dg_lsp').update_settings({ enabledLanguages = { 'python', 'rust' } })<CR>")
    wait_for(nvim.completion_count, lambda n: n == 0, 60, "the server to stop serving plain text", step=1)
    nvim.send(":lua require('dg_lsp').update_settings({ enabledLanguages = { '*' } })<CR>")
    wait_for(nvim.completion_count, lambda n: n > 0, 60, "the server to serve plain text again", step=1)


def _errors(state: dict) -> list[str]:
    return [n["msg"] for n in state.get("notified", []) if n.get("level") == 4]  # vim.log.levels.ERROR


def test_missing_server_is_reported_with_an_install_command(tmp_path: Path, text_file: Path) -> None:
    """Neovim skips a server whose command is not executable without telling the user."""
    missing = str(tmp_path / "not-installed" / "dg-lsp")
    with start_nvim(tmp_path, [missing], {}) as editor:
        editor.send(f"<C-\\><C-n>:edit! {text_file}<CR>")
        state = wait_for(editor.state, lambda s: s.get("lines"), 30, "the file to open")
        errors = _errors(state)
        assert any(f"`{missing}` was not found" in e for e in errors), state
        assert any("pip install -e ." in e and "pipx install" in e for e in errors), errors
        assert not any("pip install dg-lsp" in e for e in errors)
        assert state["status"] == "dg-lsp: not found" and not state["attached"]


def test_failed_model_load_is_reported_and_not_ready(
    tmp_path: Path, text_file: Path, server_cmd: list[str], server_settings: dict
) -> None:
    settings = {**server_settings, "model": str(tmp_path / "no-such-model")}
    with start_nvim(tmp_path, server_cmd, settings) as editor:
        editor.send(f"<C-\\><C-n>:edit! {text_file}<CR>")
        state = wait_for(
            editor.state,
            lambda s: any("model failed" in e for e in _errors(s)),
            READY_TIMEOUT,
            "an error for the failed model load",
        )
        assert state["attached"] and not state["ready"], state
        assert state["status"] == "dg-lsp: model failed"
