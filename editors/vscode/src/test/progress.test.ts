import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ProgressBoard } from '../progress';

test('idle labels follow the server state', () => {
    const board = new ProgressBoard();
    assert.match(board.label('starting'), /starting/);
    assert.equal(board.label('running'), '$(sparkle) dg-lsp');
    assert.equal(board.label('stopped'), '$(circle-slash) dg-lsp');
});

test('a model load shows title, percentage and message until it ends', () => {
    const board = new ProgressBoard();
    board.update('t1', { kind: 'begin', title: 'dg-lsp: loading model' });
    assert.ok(board.busy);
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model');
    board.update('t1', { kind: 'report', message: 'weights', percentage: 42.4 });
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model 42% (weights)');
    board.update('t1', { kind: 'report', percentage: 80 });
    assert.equal(board.label('running'), '$(loading~spin) dg-lsp: loading model 80% (weights)');
    board.update('t1', { kind: 'end', message: 'loaded tiny on cpu' });
    assert.ok(!board.busy);
    assert.equal(board.label('running'), '$(sparkle) dg-lsp');
    assert.match(board.tooltip('running'), /loaded tiny on cpu/);
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
    assert.equal(board.label('stopped'), '$(circle-slash) dg-lsp');
});
