/**
 * Turn the server's `$/progress` reports into one status-bar line.
 *
 * Pure so it can be unit-tested; extension.ts feeds it WorkDoneProgress values and renders `label()`.
 * Several tokens can be live at once (e.g. a reload while an old load still reports); the most
 * recently begun one is shown.
 */

export interface ProgressBegin {
    kind: 'begin';
    title: string;
    message?: string;
    percentage?: number;
}
export interface ProgressReport {
    kind: 'report';
    message?: string;
    percentage?: number;
}
export interface ProgressEnd {
    kind: 'end';
    message?: string;
}
export type ProgressValue = ProgressBegin | ProgressReport | ProgressEnd;

interface Live {
    title: string;
    message?: string;
    percentage?: number;
}

export type ServerState = 'starting' | 'running' | 'stopped';

/** Why the server is not serving, when the extension knows: shown instead of the idle label. */
export interface Failure {
    /** Short status-bar text, e.g. "not found". */
    label: string;
    /** Full text for the tooltip. */
    detail: string;
}

/** The server ends its load progress with this message prefix when the model could not load. */
const LOAD_FAILED = /^failed\b/i;

export class ProgressBoard {
    private readonly live = new Map<string, Live>();
    private order: string[] = [];
    private lastEnd?: string;
    private failure?: Failure;

    update(token: string | number, value: ProgressValue): void {
        const key = String(token);
        if (value.kind === 'begin') {
            this.live.set(key, { title: value.title, message: value.message, percentage: value.percentage });
            this.order = [...this.order.filter((k) => k !== key), key];
            return;
        }
        const entry = this.live.get(key);
        if (entry === undefined) {
            return; // report/end for a token we never saw begin: nothing to show
        }
        if (value.kind === 'report') {
            if (value.message !== undefined) {
                entry.message = value.message;
            }
            if (value.percentage !== undefined) {
                entry.percentage = value.percentage;
            }
            return;
        }
        this.live.delete(key);
        this.order = this.order.filter((k) => k !== key);
        this.lastEnd = value.message;
        // A new load that ends well clears an older failure; one that fails replaces it.
        this.failure = value.message !== undefined && LOAD_FAILED.test(value.message)
            ? { label: 'model failed', detail: `dg-lsp: model ${value.message}` }
            : undefined;
    }

    /** The server could not start or stopped for good (e.g. the executable is missing). */
    fail(failure: Failure): void {
        this.failure = failure;
    }

    /** Drop everything, e.g. when the server process exits mid-load. */
    clear(): void {
        this.live.clear();
        this.order = [];
    }

    /** Forget a failure, e.g. before a restart. */
    reset(): void {
        this.clear();
        this.failure = undefined;
        this.lastEnd = undefined;
    }

    get busy(): boolean {
        return this.live.size > 0;
    }

    get failed(): boolean {
        return this.failure !== undefined;
    }

    /** Status-bar text (with a codicon): loading, ready or failed; `state` covers the time around them. */
    label(state: ServerState): string {
        const key = this.order[this.order.length - 1];
        const entry = key === undefined ? undefined : this.live.get(key);
        if (state !== 'stopped' && entry !== undefined) {
            const pct = entry.percentage === undefined ? '' : ` ${Math.round(entry.percentage)}%`;
            const msg = entry.message ? ` (${entry.message})` : '';
            return `$(loading~spin) ${entry.title}${pct}${msg}`;
        }
        if (this.failure !== undefined) {
            return `$(error) dg-lsp: ${this.failure.label}`;
        }
        if (state === 'stopped') {
            return '$(circle-slash) dg-lsp: stopped';
        }
        if (state === 'starting') {
            return '$(loading~spin) dg-lsp: starting';
        }
        return this.lastEnd === undefined ? '$(loading~spin) dg-lsp: starting' : '$(sparkle) dg-lsp: ready';
    }

    /** Tooltip text: the failure, or the last finished message (e.g. the loaded model). */
    tooltip(state: ServerState): string {
        if (this.failure !== undefined) {
            return `${this.failure.detail}\nClick for the dg-lsp output.`;
        }
        const base = `dg-lsp server: ${state}`;
        return this.lastEnd ? `${base}\n${this.lastEnd}` : base;
    }
}
