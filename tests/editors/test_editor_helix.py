"""Helix: editors/helix/languages.toml validated, then replayed against the real server.

Helix is not packaged for Debian bookworm, PyPI or npm, so it cannot run here. Instead this test
(1) checks the file against Helix's config schema (the keys and feature names Helix accepts) and the
server's own Settings parser, and (2) starts the server with the command, args and `config` from the
file and plays Helix's part of the protocol: initializationOptions = `config`, the
didChangeConfiguration Helix sends after `initialized`, progress, completion with a textEdit at the
cursor, and a code action resolved to an edit. When `hx` is on PATH, `hx --health` is checked too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from editor_support import EDITORS, SAMPLE_TEXT
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from dg_lsp.settings import Settings

TOML = EDITORS / "helix" / "languages.toml"
SERVER = "dg-lsp"
# Helix's LanguageServerFeature names (helix-core, serde kebab-case), for `only-features`.
HELIX_FEATURES = {
    "format",
    "goto-declaration",
    "goto-definition",
    "goto-type-definition",
    "goto-reference",
    "goto-implementation",
    "signature-help",
    "hover",
    "document-highlight",
    "completion",
    "code-action",
    "workspace-command",
    "document-symbols",
    "workspace-symbols",
    "diagnostics",
    "rename-symbol",
    "inlay-hints",
    "document-colors",
}
# Keys Helix accepts in a [language-server.NAME] table.
HELIX_SERVER_KEYS = {"command", "args", "config", "timeout", "environment", "required-root-patterns"}


def _config() -> dict:
    return tomllib.loads(TOML.read_text(encoding="utf-8"))


def test_languages_toml_matches_helix_schema() -> None:
    config = _config()
    assert set(config) == {"language-server", "language"}
    server = config["language-server"][SERVER]
    assert set(server) <= HELIX_SERVER_KEYS
    assert server["command"] == "dg-lsp"
    assert isinstance(server["args"], list) and all(isinstance(a, str) for a in server["args"])
    assert isinstance(server["timeout"], int) and server["timeout"] > 0

    names = [lang["name"] for lang in config["language"]]
    assert len(names) == len(set(names)), "a language listed twice would override itself"
    for lang in config["language"]:
        assert set(lang) == {"name", "language-servers"}, lang["name"]
        entries = lang["language-servers"]
        ours = [e for e in entries if isinstance(e, dict) and e.get("name") == SERVER]
        assert len(ours) == 1, f"{lang['name']}: dg-lsp must be listed once"
        features = set(ours[0]["only-features"])
        assert features <= HELIX_FEATURES, features - HELIX_FEATURES
        assert {"completion", "code-action"} <= features
        # dg-lsp is appended, so the language's own servers keep priority for everything else.
        assert entries[-1] is ours[0]
        assert all(isinstance(e, str) for e in entries[:-1])


def test_config_block_is_what_the_server_parses() -> None:
    options = _config()["language-server"][SERVER]["config"]
    assert set(options) == {"dgLsp"}
    parsed = Settings.from_dict(options)
    assert parsed.extra == {}, f"keys the server does not know: {sorted(parsed.extra)}"
    # Every value in the file reached its field unchanged (camelCase -> snake_case).
    assert parsed.model == options["dgLsp"]["model"]
    assert parsed.max_tokens == options["dgLsp"]["maxTokens"]
    assert parsed.denoising_steps == options["dgLsp"]["denoisingSteps"]
    assert parsed.latency_budget_ms == options["dgLsp"]["latencyBudgetMs"]
    assert list(parsed.enabled_languages) == options["dgLsp"]["enabledLanguages"]


@pytest.mark.skipif(
    shutil.which("hx") is None, reason="Helix (hx) is not installable from this machine's registries"
)
def test_hx_health_finds_dg_lsp(tmp_path: Path) -> None:
    config_dir = tmp_path / "helix"
    config_dir.mkdir()
    shutil.copy(TOML, config_dir / "languages.toml")
    out = subprocess.run(
        ["hx", "--health", "python"],
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "dg-lsp" in out


def _apply(text: str, edit: types.TextEdit) -> str:
    lines = text.splitlines(keepends=True)

    def offset(pos: types.Position) -> int:
        return sum(len(line) for line in lines[: pos.line]) + pos.character

    return text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]


async def _helix_session(cmd: list[str], options: dict, uri: str, text: str) -> dict:
    client = LanguageClient("helix", "25.07")
    loaded = asyncio.Event()
    progress: list[str] = []

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def _create(params: types.WorkDoneProgressCreateParams) -> None:
        return None

    @client.feature(types.PROGRESS)
    def _progress(params: types.ProgressParams) -> None:
        kind = (
            params.value.get("kind")
            if isinstance(params.value, dict)
            else getattr(params.value, "kind", None)
        )
        progress.append(str(kind))
        if kind == "end":
            loaded.set()

    await client.start_io(*cmd)
    try:
        # The capabilities Helix sends for what dg-lsp uses (helix-lsp client.rs).
        caps = types.ClientCapabilities(
            window=types.WindowClientCapabilities(work_done_progress=True),
            workspace=types.WorkspaceClientCapabilities(apply_edit=True, configuration=True),
            text_document=types.TextDocumentClientCapabilities(
                completion=types.CompletionClientCapabilities(
                    completion_item=types.ClientCompletionItemOptions(snippet_support=True)
                ),
                code_action=types.CodeActionClientCapabilities(
                    code_action_literal_support=types.ClientCodeActionLiteralOptions(
                        code_action_kind=types.ClientCodeActionKindOptions(
                            value_set=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite]
                        )
                    ),
                    data_support=True,
                    resolve_support=types.ClientCodeActionResolveOptions(properties=["edit", "command"]),
                ),
            ),
        )
        init = await client.initialize_async(
            types.InitializeParams(capabilities=caps, initialization_options=options, process_id=None)
        )
        client.initialized(types.InitializedParams())
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=options))
        await asyncio.wait_for(loaded.wait(), timeout=180)

        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="markdown", version=1, text=text)
            )
        )
        cursor = types.Position(line=0, character=len(text.splitlines()[0]))
        completion = await asyncio.wait_for(
            client.text_document_completion_async(
                types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=cursor)
            ),
            timeout=120,
        )
        items = completion.items if isinstance(completion, types.CompletionList) else completion
        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=types.Range(start=cursor, end=cursor),
                context=types.CodeActionContext(diagnostics=[]),
            )
        )
        fill = next(a for a in actions if a.title.startswith("Fill in here (dg-lsp)"))
        resolved = await asyncio.wait_for(client.code_action_resolve_async(fill), timeout=120)
        await client.shutdown_async(None)
        client.exit(None)
        return {
            "init": init,
            "progress": progress,
            "cursor": cursor,
            "items": items,
            "titles": [a.title for a in actions],
            "fill": fill,
            "resolved": resolved,
        }
    finally:
        await client.stop()


@pytest.mark.timeout(300)
def test_helix_session_against_real_server(
    tmp_path: Path, server_cmd: list[str], server_settings: dict
) -> None:
    server = _config()["language-server"][SERVER]
    # The file's command; the console script is what `pip install` provides, else the same module.
    cmd = [
        shutil.which(server["command"]) or server_cmd[0],
        *([] if shutil.which(server["command"]) else server_cmd[1:]),
    ]
    cmd += [*server["args"], "--log-file", str(tmp_path / "server.log")]
    options = {"dgLsp": {**server["config"]["dgLsp"], **server_settings}}
    path = tmp_path / "notes.md"
    path.write_text(SAMPLE_TEXT, encoding="utf-8")

    r = asyncio.run(_helix_session(cmd, options, path.as_uri(), SAMPLE_TEXT))

    caps = r["init"].capabilities
    assert caps.completion_provider is not None
    assert caps.code_action_provider is not None
    assert r["progress"][0] == "begin" and r["progress"][-1] == "end"

    # Completion fallback: an item whose textEdit inserts at the cursor, as Helix applies it.
    assert r["items"], "no completion item after the model loaded"
    edit = r["items"][0].text_edit
    assert edit is not None and edit.range.start == r["cursor"] == edit.range.end
    assert edit.new_text
    cursor = len(SAMPLE_TEXT.splitlines()[0])
    assert _apply(SAMPLE_TEXT, edit) == SAMPLE_TEXT[:cursor] + edit.new_text + SAMPLE_TEXT[cursor:]

    # Code action: offered lazily (no edit, no command: Helix resolves), resolved to a document edit.
    assert r["fill"].edit is None and r["fill"].command is None
    changes = r["resolved"].edit.document_changes
    assert len(changes) == 1 and changes[0].text_document.uri == path.as_uri()
    new_text = SAMPLE_TEXT
    for text_edit in changes[0].edits:
        new_text = _apply(new_text, text_edit)
    assert new_text != SAMPLE_TEXT and new_text.startswith(SAMPLE_TEXT[:cursor])
