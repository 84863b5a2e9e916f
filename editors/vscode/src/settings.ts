/**
 * Map VS Code's `dgLsp.*` configuration onto what the server reads (dg_lsp/settings.py).
 *
 * Pure (no `vscode` import) so it runs under node's test runner. Invalid values are dropped with a
 * message instead of being sent: the server would reject the whole update with a ValueError, which
 * would also throw away the user's valid settings.
 */

/** How each server setting is validated; mirrors `_coerce` in dg_lsp/settings.py. */
export type SettingKind = 'string' | 'count' | 'boolean' | 'stringList';

/** Server settings in the server's camelCase spelling, with how to validate each. */
export const SERVER_SETTINGS: Readonly<Record<string, SettingKind>> = Object.freeze({
    model: 'string',
    backend: 'string',
    device: 'string',
    quantization: 'string',
    dtype: 'string',
    maxTokens: 'count',
    denoisingSteps: 'count',
    latencyBudgetMs: 'count',
    debounceMs: 'count',
    numCandidates: 'count',
    enabledLanguages: 'stringList',
    trustRemoteCode: 'boolean',
    seed: 'count',
    tokenHealing: 'boolean',
    completeComments: 'boolean',
    threads: 'count',
});

/** Reads one key below the `dgLsp` section, e.g. `read('maxTokens')`; `undefined` when unset. */
export type ConfigReader = (key: string) => unknown;

export interface MappedSettings {
    /** Exactly the mapping sent as `{dgLsp: settings}`; only valid, set keys. */
    settings: Record<string, string | number | boolean | string[]>;
    /** One human-readable line per dropped value. */
    problems: string[];
}

/** Validate and convert one value; returns `undefined` (with a problem) when it cannot be sent. */
function coerce(kind: SettingKind, value: unknown): string | number | boolean | string[] | undefined {
    switch (kind) {
        case 'string':
            return typeof value === 'string' && value.trim() !== '' ? value.trim() : undefined;
        case 'count':
            return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? Math.trunc(value) : undefined;
        case 'boolean':
            return typeof value === 'boolean' ? value : undefined;
        case 'stringList': {
            const list = typeof value === 'string' ? [value] : value;
            if (!Array.isArray(list) || !list.every((v) => typeof v === 'string')) {
                return undefined;
            }
            const cleaned = list.map((v) => v.trim()).filter((v) => v !== '');
            return cleaned.length > 0 ? cleaned : undefined;
        }
    }
}

/** Collect the server settings from `read`; unset keys are left out so the server's defaults apply. */
export function mapServerSettings(read: ConfigReader): MappedSettings {
    const settings: MappedSettings['settings'] = {};
    const problems: string[] = [];
    for (const [key, kind] of Object.entries(SERVER_SETTINGS)) {
        const raw = read(key);
        if (raw === undefined || raw === null) {
            continue;
        }
        const value = coerce(kind, raw);
        if (value === undefined) {
            problems.push(`dgLsp.${key}: ignoring invalid value ${JSON.stringify(raw)} (expected ${describe(kind)})`);
            continue;
        }
        settings[key] = value;
    }
    return { settings, problems };
}

function describe(kind: SettingKind): string {
    switch (kind) {
        case 'string':
            return 'a non-empty string';
        case 'count':
            return 'a non-negative number';
        case 'boolean':
            return 'true or false';
        case 'stringList':
            return 'a non-empty list of strings';
    }
}

/** The payload for both `initializationOptions` and `workspace/didChangeConfiguration`. */
export function serverPayload(read: ConfigReader): { payload: { dgLsp: MappedSettings['settings'] }; problems: string[] } {
    const { settings, problems } = mapServerSettings(read);
    return { payload: { dgLsp: settings }, problems };
}

export interface ServerCommand {
    command: string;
    args: string[];
}

/**
 * The process to start. `dgLsp.server.path` may be a `dg-lsp` executable or a Python interpreter
 * (then `-m dg_lsp` is added), so a virtualenv's python works without the console script on PATH.
 */
export function serverCommand(read: ConfigReader): ServerCommand {
    const rawPath = read('server.path');
    const rawArgs = read('server.args');
    const command = typeof rawPath === 'string' && rawPath.trim() !== '' ? rawPath.trim() : 'dg-lsp';
    const args = Array.isArray(rawArgs) ? rawArgs.filter((a): a is string => typeof a === 'string') : [];
    const base = command.split(/[\\/]/).pop() ?? command;
    if (/^python(\d+(\.\d+)?)?(\.exe)?$/i.test(base)) {
        return { command, args: ['-m', 'dg_lsp', ...args] };
    }
    return { command, args };
}

/** Settings whose change needs a new server process rather than a didChangeConfiguration. */
export const RESTART_KEYS: readonly string[] = ['server.path', 'server.args'];

/**
 * Commands that install the server from a clone of the dg-lsp repository. dg-lsp is not on PyPI, so a
 * bare package name fails; torch is pinned first so pip does not pull a multi-GB CUDA build.
 */
export const INSTALL_HINT =
    'From a clone of the dg-lsp repository: `pip install torch==2.13.0 && pip install -e .` ' +
    '(or `pipx install --preinstall torch==2.13.0 .`)';

export interface StartFailure {
    /** Short status-bar text. */
    label: string;
    /** The message shown to the user, naming a fix that works. */
    message: string;
}

/** What to tell the user when the server process could not be started (`error` from the client). */
export function describeStartFailure(command: string, error: string): StartFailure {
    if (/ENOENT/.test(error)) {
        return {
            label: 'not found',
            message:
                `dg-lsp: the server command \`${command}\` was not found. ${INSTALL_HINT}, then run ` +
                '"dg-lsp: Restart Server"; or set `dgLsp.server.path` to the `dg-lsp` executable or to a ' +
                'Python that has dg_lsp installed.',
        };
    }
    if (/EACCES/.test(error)) {
        return {
            label: 'not executable',
            message: `dg-lsp: \`${command}\` is not executable (${error}). Check \`dgLsp.server.path\`.`,
        };
    }
    return {
        label: 'failed to start',
        message: `dg-lsp: the server \`${command}\` failed to start (${error}). See the dg-lsp output; \`dg-lsp doctor\` says what is wrong.`,
    };
}
