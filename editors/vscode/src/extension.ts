/**
 * VS Code client for dg-lsp: starts the server over stdio, forwards `dgLsp.*` settings, and shows
 * model-loading progress. Ghost text, completion and code actions come from vscode-languageclient's
 * standard features (inline completion is LSP 3.18, supported by the client since 10.x).
 */
import * as vscode from 'vscode';
import {
    ClientCapabilities,
    CloseAction,
    DidChangeConfigurationNotification,
    ErrorHandler,
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

import { extendSelection } from './inline';
import { ProgressBoard, ProgressValue, ServerState } from './progress';
import { ConfigReader, describeStartFailure, RESTART_KEYS, serverCommand, serverPayload } from './settings';

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

/**
 * The client's default restart policy, plus a status-bar "crashed" once it gives up: otherwise the
 * only trace of a server that keeps dying is a toast the user may have dismissed.
 */
class ReportingErrorHandler implements ErrorHandler {
    private fallback?: ErrorHandler;

    constructor(private readonly lc: () => LanguageClient | undefined) {}

    private get inner(): ErrorHandler {
        this.fallback ??= this.lc()!.createDefaultErrorHandler();
        return this.fallback;
    }

    error(...args: Parameters<ErrorHandler['error']>): ReturnType<ErrorHandler['error']> {
        return this.inner.error(...args);
    }

    async closed(): Promise<Awaited<ReturnType<ErrorHandler['closed']>>> {
        const result = await this.inner.closed();
        if (result.action === CloseAction.DoNotRestart) {
            board.fail({ label: 'crashed', detail: result.message ?? 'dg-lsp: the server exited and was not restarted' });
            renderStatus();
        }
        return result;
    }
}

function createClient(): LanguageClient {
    const { command, args } = serverCommand((key) => vscode.workspace.getConfiguration(SECTION).get(key));
    // TransportKind.stdio makes the client append `--stdio`, which dg-lsp accepts.
    const serverOptions: ServerOptions = { command, args, transport: TransportKind.stdio };
    let lc: LanguageClient | undefined;
    const clientOptions: LanguageClientOptions = {
        documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
        initializationOptions: payload(),
        outputChannel: output,
        errorHandler: new ReportingErrorHandler(() => lc),
        middleware: {
            provideInlineCompletionItems: async (document, position, context, token, next) => {
                if (!inlineEnabled()) {
                    return undefined;
                }
                const selected = context.selectedCompletionInfo;
                if (selected === undefined) {
                    return next(document, position, context, token);
                }
                // The server infills the document as it is: ask without the selection, then keep what
                // extends the selected suggestion (src/inline.ts).
                const result = await next(document, position, { ...context, selectedCompletionInfo: undefined }, token);
                const items = result === undefined || result === null ? [] : Array.isArray(result) ? result : result.items;
                const start = selected.range.start;
                const out: vscode.InlineCompletionItem[] = [];
                for (const item of items) {
                    const from = item.range?.start ?? position;
                    const to = item.range?.end ?? position;
                    if (typeof item.insertText !== 'string' || from.isBefore(start)) {
                        continue;
                    }
                    const text = extendSelection(
                        document.getText(new vscode.Range(start, from)),
                        item.insertText,
                        selected.text,
                    );
                    if (text !== undefined) {
                        const end = to.isAfter(selected.range.end) ? to : selected.range.end;
                        out.push(new vscode.InlineCompletionItem(text, new vscode.Range(start, end), item.command));
                    }
                }
                return out;
            },
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
    lc = new LanguageClient('dgLsp', 'dg-lsp', serverOptions, clientOptions);
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
    board.reset();
    renderStatus();
    client = createClient();
    try {
        await client.start();
    } catch (err) {
        const { command } = serverCommand((key) => vscode.workspace.getConfiguration(SECTION).get(key));
        const failure = describeStartFailure(command, err instanceof Error ? err.message : String(err));
        board.fail({ label: failure.label, detail: failure.message });
        renderStatus();
        output?.error(failure.message);
        const choice = await vscode.window.showErrorMessage(failure.message, 'Open Settings', 'Show Output');
        if (choice === 'Open Settings') {
            void vscode.commands.executeCommand('workbench.action.openSettings', 'dgLsp.server.path');
        } else if (choice === 'Show Output') {
            output?.show(true);
        }
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
