"""VS Code: the extension's unit tests (node's test runner), its .vsix packaging, and the contract
between its contributed settings and dg_lsp/settings.py.

VS Code itself cannot run here (its test harness downloads an editor build), so the extension's
wiring to vscode-languageclient is covered by packaging plus the pure mapping it relies on.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import zipfile

import pytest
from editor_support import EDITORS

from dg_lsp.settings import Settings

VSCODE = EDITORS / "vscode"
PACKAGE = json.loads((VSCODE / "package.json").read_text(encoding="utf-8"))
NPM = shutil.which("npm")
needs_npm = pytest.mark.skipif(
    NPM is None or not (VSCODE / "node_modules").is_dir(),
    reason="npm or editors/vscode/node_modules missing (bash editors/install-test-deps.sh runs npm ci)",
)
CLIENT_ONLY = {"server.path", "server.args", "inlineCompletion.enabled", "completion.enabled", "trace.server"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_contributed_settings_mirror_server_settings() -> None:
    props = PACKAGE["contributes"]["configuration"]["properties"]
    contributed = {key.removeprefix("dgLsp.") for key in props}
    fields = [f for f in dataclasses.fields(Settings) if f.name != "extra"]
    assert contributed - CLIENT_ONLY == {_camel(f.name) for f in fields}
    defaults = Settings()
    for f in fields:
        value = getattr(defaults, f.name)
        expected = list(value) if isinstance(value, tuple) else value
        assert props[f"dgLsp.{_camel(f.name)}"]["default"] == expected, f.name
        # The contributed default must round-trip through the server's own parser unchanged.
        parsed = Settings.from_dict({"dgLsp": {_camel(f.name): expected}})
        assert getattr(parsed, f.name) == value and parsed.extra == {}


def test_contributed_bounds_and_order_match_the_server() -> None:
    """VS Code validates a value against the contributed bounds before the server sees it: a looser bound
    (numCandidates 0, maxTokens 0) let the Settings UI accept what the server then refuses with a warning.
    Bounds past what a JavaScript number holds exactly (the seed's) are left to the server."""
    from dg_lsp.settings import NUMBER_BOUNDS

    props = PACKAGE["contributes"]["configuration"]["properties"]
    for name, (low, high) in NUMBER_BOUNDS.items():
        prop = props[f"dgLsp.{_camel(name)}"]
        assert prop["minimum"] == low, name
        assert prop.get("maximum") == (high if high <= 2**53 else None), name
    orders = [prop["order"] for prop in props.values()]
    assert len(orders) == len(set(orders)), "two settings share an order: the Settings UI then sorts by name"


def test_restricted_settings_cannot_come_from_an_untrusted_workspace() -> None:
    props = PACKAGE["contributes"]["configuration"]["properties"]
    restricted = set(PACKAGE["capabilities"]["untrustedWorkspaces"]["restrictedConfigurations"])
    assert {"dgLsp.server.path", "dgLsp.trustRemoteCode", "dgLsp.model"} <= restricted
    for key in ("dgLsp.server.path", "dgLsp.server.args", "dgLsp.trustRemoteCode"):
        assert props[key]["scope"] == "machine", key


@needs_npm
@pytest.mark.timeout(300)
def test_node_unit_tests_pass() -> None:
    assert NPM is not None
    done = subprocess.run([NPM, "test"], cwd=VSCODE, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    passed = re.search(r"^# pass (\d+)$", out, re.M)
    failed = re.search(r"^# fail (\d+)$", out, re.M)
    assert passed and int(passed[1]) > 0 and failed and failed[1] == "0", out[-2000:]


@needs_npm
@pytest.mark.timeout(300)
def test_packages_to_vsix() -> None:
    assert NPM is not None
    vsix = VSCODE / "dist" / "dg-lsp.vsix"
    vsix.unlink(missing_ok=True)
    done = subprocess.run([NPM, "run", "package"], cwd=VSCODE, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
        assert {"extension/package.json", "extension/dist/extension.js", "extension.vsixmanifest"} <= names
        assert not any("node_modules" in n or n.endswith(".ts") for n in names), "bundle only, no sources"
        packed = json.loads(archive.read("extension/package.json"))
        bundle = archive.read("extension/dist/extension.js").decode("utf-8")
    assert packed["contributes"] == PACKAGE["contributes"]
    assert packed["main"] == "./dist/extension.js"
    # The bundle carries the language client and the progress hook, and leaves `vscode` external.
    assert "textDocument/inlineCompletion" in bundle
    assert "window/workDoneProgress/create" in bundle
    assert 'require("vscode")' in bundle


E2E_RESULTS = VSCODE / "e2e" / "results"


def test_latest_real_vscode_run_passed() -> None:
    """The committed record of editors/vscode/e2e/run.mjs (real VS Code through code-server): `.ci/run`
    reruns it; this keeps a failing or half-written record from being committed."""
    record = json.loads((E2E_RESULTS / "last-run.json").read_text(encoding="utf-8"))
    assert record["passed"], record.get("error") or record["checks"]
    assert all(check["ok"] for check in record["checks"].values())
    assert "Code 1.100" in record["versions"]["codeServer"]
    inserted = record["accepted"]["inserted"]
    assert inserted and inserted.strip() == record["ghost"]["text"].strip()
    for png in ("ghost-text.png", "accepted.png", "missing-server.png", "model-failed.png"):
        assert (E2E_RESULTS / png).read_bytes()[:4] == b"\x89PNG", png


def test_word_suggestions_do_not_cover_ghost_text_by_default() -> None:
    """VS Code hides ghost text under an open suggest widget; word suggestions open it on every word
    typed, so the extension turns them off (language-scoped) where dg-lsp serves."""
    defaults = PACKAGE["contributes"]["configurationDefaults"]
    (languages, values), *_ = defaults.items()
    assert "[python]" in languages and values["editor.wordBasedSuggestions"] == "off"
