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

export class ProgressBoard {
    private readonly live = new Map<string, Live>();
    private order: string[] = [];
    private lastEnd?: string;

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
    }

    /** Drop everything, e.g. when the server process exits mid-load. */
    clear(): void {
        this.live.clear();
        this.order = [];
    }

    get busy(): boolean {
        return this.live.size > 0;
    }

    /** Status-bar text (with a codicon); `state` covers the time before and after any progress. */
    label(state: ServerState): string {
        if (state === 'stopped') {
            return '$(circle-slash) dg-lsp';
        }
        const key = this.order[this.order.length - 1];
        const entry = key === undefined ? undefined : this.live.get(key);
        if (entry !== undefined) {
            const pct = entry.percentage === undefined ? '' : ` ${Math.round(entry.percentage)}%`;
            const msg = entry.message ? ` (${entry.message})` : '';
            return `$(loading~spin) ${entry.title}${pct}${msg}`;
        }
        return state === 'starting' ? '$(loading~spin) dg-lsp: starting' : '$(sparkle) dg-lsp';
    }

    /** Tooltip text: the last finished message (e.g. the loaded model) helps tell what is resident. */
    tooltip(state: ServerState): string {
        const base = `dg-lsp server: ${state}`;
        return this.lastEnd ? `${base}\n${this.lastEnd}` : base;
    }
}
