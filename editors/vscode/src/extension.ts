/**
 * VS Code client for dg-lsp: starts the server over stdio, forwards `dgLsp.*` settings, and shows
 * model-loading progress. Ghost text, completion and code actions come from vscode-languageclient's
 * standard features (inline completion is LSP 3.18, supported by the client since 10.x).
 */
import * as vscode from 'vscode';
import {
    ClientCapabilities,
    DidChangeConfigurationNotification,
    FeatureState,
    LanguageClient,
    LanguageClientOptions,
    ServerOptions,
    State,
    StaticFeature,
    TransportKind,
    WorkDoneProgress,
    WorkDoneProgressCreateRequest,
} from 'vscode-languageclient/node';

import { ProgressBoard, ProgressValue, ServerState } from './progress';
import { ConfigReader, RESTART_KEYS, serverCommand, serverPayload } from './settings';

const SECTION = 'dgLsp';

let client: LanguageClient | undefined;
let output: vscode.LogOutputChannel | undefined;
const board = new ProgressBoard();
let status: vscode.StatusBarItem | undefined;
let serverState: ServerState = 'stopped';

/**
 * Reads a setting, treating "equal to the contributed default" as unset so the server's own defaults
 * stay authoritative. `get` (unlike `inspect`) honours restricted settings in untrusted workspaces.
 */
const readSetting: ConfigReader = (key) => {
    const config = vscode.workspace.getConfiguration(SECTION);
    const value = config.get<unknown>(key);
    const info = config.inspect<unknown>(key);
    if (info !== undefined && JSON.stringify(value) === JSON.stringify(info.defaultValue)) {
        return undefined;
    }
    return value;
};

/** Problems already shown: the payload is rebuilt on every change and configuration request. */
const warned = new Set<string>();

function payload(): { dgLsp: Record<string, unknown> } {
    const { payload: p, problems } = serverPayload(readSetting);
    for (const problem of problems.filter((line) => !warned.has(line))) {
        warned.add(problem);
        output?.warn(problem);
        void vscode.window.showWarningMessage(problem);
    }
    return p;
}

function renderStatus(): void {
    if (status === undefined) {
        return;
    }
    status.text = board.label(serverState);
    status.tooltip = board.tooltip(serverState);
    status.show();
}

/**
 * Replaces the client's built-in `window/workDoneProgress/create` handler (the last registered
 * handler wins) so the same reports drive both a notification and the status bar item.
 */
class LoadingProgressFeature implements StaticFeature {
    private readonly pending = new Set<() => void>();

    constructor(private readonly lc: LanguageClient) {}

    fillClientCapabilities(capabilities: ClientCapabilities): void {
        capabilities.window = { ...capabilities.window, workDoneProgress: true };
    }

    getState(): FeatureState {
        return { kind: 'static' };
    }

    initialize(): void {
        this.lc.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => this.track(token));
    }

    clear(): void {
        for (const finish of this.pending) {
            finish();
        }
        this.pending.clear();
        board.clear();
        renderStatus();
    }

    private track(token: string | number): void {
        let finish: () => void = () => undefined;
        const done = new Promise<void>((resolve) => (finish = resolve));
        this.pending.add(finish);
        let reporter: vscode.Progress<{ message?: string; increment?: number }> | undefined;
        let shown = 0;
        const report = (message?: string, percentage?: number) => {
            const increment = percentage === undefined ? undefined : Math.max(0, percentage - shown);
            shown = percentage ?? shown;
            reporter?.report({ message, increment });
        };
        const sub = this.lc.onProgress(WorkDoneProgress.type, token, (value) => {
            board.update(token, value as ProgressValue);
            renderStatus();
            if (value.kind === 'begin') {
                void vscode.window.withProgress(
                    { location: vscode.ProgressLocation.Notification, title: value.title, cancellable: false },
                    (progress) => {
                        reporter = progress;
                        report(value.message, value.percentage);
                        return done;
                    },
                );
            } else if (value.kind === 'report') {
                report(value.message, value.percentage);
            } else {
                if (value.message) {
                    output?.info(value.message);
                }
                finish();
                this.pending.delete(finish);
                sub.dispose();
            }
        });
    }
}

function completionFallbackEnabled(): boolean {
    return vscode.workspace.getConfiguration(SECTION).get<boolean>('completion.enabled', false);
}

function inlineEnabled(): boolean {
    return vscode.workspace.getConfiguration(SECTION).get<boolean>('inlineCompletion.enabled', true);
}

function createClient(): LanguageClient {
    const { command, args } = serverCommand((key) => vscode.workspace.getConfiguration(SECTION).get(key));
    const serverOptions: ServerOptions = { command, args, transport: TransportKind.stdio };
    const clientOptions: LanguageClientOptions = {
        documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
        initializationOptions: payload(),
        outputChannel: output,
        middleware: {
            provideInlineCompletionItems: (document, position, context, token, next) =>
                inlineEnabled() ? next(document, position, context, token) : undefined,
            // Ghost text already shows the same infill; the suggest-widget copy is opt-in.
            provideCompletionItem: (document, position, context, token, next) =>
                completionFallbackEnabled() ? next(document, position, context, token) : undefined,
            workspace: {
                configuration: async (params, token, next) => {
                    const result = await next(params, token);
                    if (!Array.isArray(result)) {
                        return result;
                    }
                    return params.items.map((item, i) => (item.section === SECTION ? payload().dgLsp : result[i]));
                },
            },
        },
    };
    const lc = new LanguageClient('dgLsp', 'dg-lsp', serverOptions, clientOptions);
    lc.registerFeature(new LoadingProgressFeature(lc));
    lc.onDidChangeState(({ newState }) => {
        serverState = newState === State.Running ? 'running' : newState === State.Starting ? 'starting' : 'stopped';
        if (serverState === 'stopped') {
            board.clear();
        }
        renderStatus();
    });
    return lc;
}

async function startClient(): Promise<void> {
    client = createClient();
    try {
        await client.start();
    } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        void vscode.window.showErrorMessage(
            `dg-lsp failed to start (${message}). Install it with \`pip install dg-lsp\` or set dgLsp.server.path.`,
        );
    }
}

async function restartClient(): Promise<void> {
    const old = client;
    client = undefined;
    if (old !== undefined) {
        await old.stop().catch(() => undefined);
    }
    await startClient();
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
    output = vscode.window.createOutputChannel('dg-lsp', { log: true });
    status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    status.command = 'dgLsp.showOutput';
    context.subscriptions.push(
        output,
        status,
        vscode.commands.registerCommand('dgLsp.restartServer', restartClient),
        vscode.commands.registerCommand('dgLsp.showOutput', () => output?.show(true)),
        vscode.workspace.onDidChangeConfiguration((event) => {
            if (!event.affectsConfiguration(SECTION)) {
                return;
            }
            if (RESTART_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
                void restartClient();
            } else if (client?.isRunning()) {
                void client.sendNotification(DidChangeConfigurationNotification.type, { settings: payload() });
            }
        }),
    );
    renderStatus();
    await startClient();
}

export async function deactivate(): Promise<void> {
    await client?.stop();
    client = undefined;
}
