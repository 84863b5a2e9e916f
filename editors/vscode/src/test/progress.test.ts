import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ProgressBoard } from '../progress';

test('idle labels follow the server state', () => {
    const board = new ProgressBoard();
    assert.match(board.label('starting'), /starting/);
    // Running but no load reported yet: the model is not ready, so it must not read "ready".
    assert.match(board.label('running'), /starting/);
    assert.equal(board.label('stopped'), '$(circle-slash) dg-lsp: stopped');
});

test('a model load shows title, percentage and message, then ready', () => {
    const board = new ProgressBoard();
    board.update('t1', { kind: 'begin', title: 'dg-lsp: loading model' });
    assert.ok(board.busy);
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model');
    board.update('t1', { kind: 'report', message: 'weights', percentage: 42.4 });
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model 42% (weights)');
    board.update('t1', { kind: 'report', percentage: 80 });
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model 80% (weights)');
    board.update('t1', { kind: 'end', message: 'ready' });
    assert.ok(!board.busy && !board.failed);
    assert.equal(board.label('running'), '$(sparkle) dg-lsp: ready');
    assert.match(board.tooltip('running'), /ready/);
});

test('a failed load (the server ends its progress with "failed: ...") shows failed until a good load', () => {
    const board = new ProgressBoard();
    board.update('t1', { kind: 'begin', title: 'dg-lsp: loading model', message: '/no/such/model' });
    board.update('t1', { kind: 'end', message: "failed: model directory '/no/such/model' does not exist" });
    assert.ok(board.failed);
    assert.equal(board.label('running'), '$(error) dg-lsp: model failed');
    assert.match(board.tooltip('running'), /does not exist/);
    board.update('t2', { kind: 'begin', title: 'dg-lsp: loading model' });
    assert.match(board.label('running'), /loading model/);
    board.update('t2', { kind: 'end', message: 'ready' });
    assert.equal(board.label('running'), '$(sparkle) dg-lsp: ready');
});

test('a server that cannot start shows why', () => {
    const board = new ProgressBoard();
    board.fail({ label: 'not found', detail: 'dg-lsp: `dg-lsp` was not found' });
    assert.equal(board.label('stopped'), '$(error) dg-lsp: not found');
    assert.match(board.tooltip('stopped'), /was not found/);
    board.reset();
    assert.equal(board.label('starting'), '$(loading~spin) dg-lsp: starting');
});

test('the newest of several live tokens is shown; unknown tokens are ignored', () => {
    const board = new ProgressBoard();
    board.update(1, { kind: 'begin', title: 'first' });
    board.update(2, { kind: 'begin', title: 'second' });
    board.update(3, { kind: 'report', message: 'never began' });
    assert.match(board.label('running'), /second/);
    board.update(2, { kind: 'end' });
    assert.match(board.label('running'), /first/);
    board.clear();
    assert.ok(!board.busy);
});

test('a stopped server hides a load in progress', () => {
    const board = new ProgressBoard();
    board.update('t', { kind: 'begin', title: 'dg-lsp: loading model', percentage: 10 });
    assert.equal(board.label('stopped'), '$(circle-slash) dg-lsp: stopped');
});
