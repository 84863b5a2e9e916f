#!/usr/bin/env bash
# Install what editors/vscode/e2e/run.mjs needs: real VS Code (code-server 4.100.3 = VS Code 1.100.3,
# the last code-server on node 20) and playwright-core, driving Debian's Chromium headless.
# Idempotent. Run as root: `bash editors/vscode/e2e/setup.sh`. Everything goes to $DG_LSP_E2E_DIR
# (default ~/.cache/dg-lsp-e2e), nothing into the repository.
#
# What a plain `npm install code-server` does not survive without network beyond the registries:
#   - @vscode/ripgrep's postinstall downloads rg from GitHub: Debian's `ripgrep` goes in its bin/
#     instead (its postinstall exits early when bin/ exists);
#   - node-gyp fetches node headers from nodejs.org: npm_config_nodedir=/usr uses Debian's;
#   - node-pty's postinstall runs `npx node-gyp`, which refuses to install without npm_config_yes;
#   - argon2 downloads a prebuilt binary from GitHub: built from source instead.
# So the packages are installed with --ignore-scripts and code-server's postinstall.sh is replayed
# by hand with those fixes.
set -euo pipefail

DIR="${DG_LSP_E2E_DIR:-$HOME/.cache/dg-lsp-e2e}"
CODE_SERVER_VERSION="${DG_LSP_CODE_SERVER_VERSION:-4.100.3}"
PLAYWRIGHT_VERSION="${DG_LSP_PLAYWRIGHT_VERSION:-1.65.1}"
log() { printf '[vscode-e2e setup] %s\n' "$*"; }

need_apt=()
for pkg in chromium ripgrep build-essential libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev pkg-config python3; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
    log "apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

mkdir -p "$DIR"
cd "$DIR"
stamp="code-server@$CODE_SERVER_VERSION playwright-core@$PLAYWRIGHT_VERSION"
if [[ -f .installed ]] && [[ "$(cat .installed)" == "$stamp" ]] && node_modules/.bin/code-server --version >/dev/null 2>&1; then
    log "$stamp present in $DIR"
    exit 0
fi

export npm_config_nodedir=/usr npm_config_yes=true npm_config_unsafe_perm=true
[[ -f package.json ]] || echo '{"name": "dg-lsp-vscode-e2e", "private": true}' > package.json
log "npm install $stamp (scripts off)"
npm install --no-audit --no-fund --loglevel=error --ignore-scripts \
    "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION"

log "argon2 from source"
npm_config_build_from_source=true npm rebuild --loglevel=error argon2

cd node_modules/code-server/lib/vscode
log "VS Code's own dependencies (scripts off)"
npm install --omit=dev --no-audit --no-fund --loglevel=error --ignore-scripts
mkdir -p node_modules/@vscode/ripgrep/bin
ln -sf "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg
log "native modules (node-pty, spdlog, kerberos, ...) against /usr/include/node"
npm rebuild --loglevel=error
# The rest of code-server's postinstall.sh.
rm -rf node_modules.asar && ln -s node_modules node_modules.asar
(cd bin/remote-cli && ln -sf code-linux.sh code-server)
(cd bin/helpers && ln -sf browser-linux.sh browser.sh)
(cd extensions && npm install --omit=dev --no-audit --no-fund --loglevel=error)

cd "$DIR"
node_modules/.bin/code-server --version
echo "$stamp" > .installed
log "done"
