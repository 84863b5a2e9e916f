/**
 * Ghost text while VS Code's suggest widget is open.
 *
 * With the widget open (word suggestions pop up as soon as a word is typed), VS Code shows an inline
 * completion only if it extends the selected suggestion, and asks providers with
 * `context.selectedCompletionInfo` for exactly that. The server infills the document as it is, so its
 * text starts at the cursor; this turns it into one that starts where the selected suggestion starts,
 * when the two agree (typed `ite`, suggestion `items`, infill `ms[-1]` -> `items[-1]`). Copilot does
 * the same, which is why its ghost text survives the widget. Pure, for node's test runner.
 */

/**
 * The ghost text to offer in place of the selected suggestion, or undefined when the infill does not
 * agree with it (VS Code would hide it anyway).
 *
 * @param before  document text from where the selected suggestion's range starts to where the infill starts
 * @param infill  the server's insert text
 * @param selected  the selected suggestion's text
 */
export function extendSelection(before: string, infill: string, selected: string): string | undefined {
    const full = before + infill;
    if (infill.trim() === '' || !full.startsWith(selected) || full.length <= selected.length) {
        return undefined;
    }
    return full;
}
