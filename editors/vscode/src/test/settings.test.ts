import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import {
    describeStartFailure,
    mapServerSettings,
    RESTART_KEYS,
    SERVER_SETTINGS,
    serverCommand,
    serverPayload,
} from '../settings';

const reader = (values: Record<string, unknown>) => (key: string) => values[key];

test('unset settings are left out so the server defaults apply', () => {
    assert.deepEqual(mapServerSettings(reader({})), { settings: {}, problems: [] });
});

test('every server setting passes through in camelCase', () => {
    const values = {
        model: '/models/dg',
        backend: 'masked',
        device: 'cuda:1',
        quantization: 'int8',
        maxTokens: 16,
        denoisingSteps: 4,
        latencyBudgetMs: 900,
        debounceMs: 0,
        numCandidates: 3,
        enabledLanguages: ['python', 'rust'],
        trustRemoteCode: true,
        seed: 7,
        threads: 2,
    };
    const { settings, problems } = mapServerSettings(reader(values));
    assert.deepEqual(problems, []);
    assert.deepEqual(settings, values);
});

test('invalid values are dropped with one message each, valid ones kept', () => {
    const { settings, problems } = mapServerSettings(
        reader({ maxTokens: -1, seed: 'x', trustRemoteCode: 'yes', enabledLanguages: [1], model: '  ', device: 'cpu' }),
    );
    assert.deepEqual(settings, { device: 'cpu' });
    assert.equal(problems.length, 5);
    for (const key of ['maxTokens', 'seed', 'trustRemoteCode', 'enabledLanguages', 'model']) {
        assert.ok(problems.some((p) => p.startsWith(`dgLsp.${key}:`)), key);
    }
});

test('numbers are truncated to integers, strings trimmed, a single language becomes a list', () => {
    const { settings } = mapServerSettings(reader({ latencyBudgetMs: 250.9, model: ' embedded ', enabledLanguages: 'go' }));
    assert.deepEqual(settings, { latencyBudgetMs: 250, model: 'embedded', enabledLanguages: ['go'] });
});

test('client-only keys never reach the server', () => {
    const { payload } = serverPayload(reader({ 'server.path': '/x', 'completion.enabled': true, maxTokens: 8 }));
    assert.deepEqual(payload, { dgLsp: { maxTokens: 8 } });
});

test('server command: default, explicit executable, python interpreter', () => {
    assert.deepEqual(serverCommand(reader({})), { command: 'dg-lsp', args: [] });
    assert.deepEqual(serverCommand(reader({ 'server.path': '/opt/dg-lsp', 'server.args': ['--log-level', 'debug', 3] })), {
        command: '/opt/dg-lsp',
        args: ['--log-level', 'debug'],
    });
    assert.deepEqual(serverCommand(reader({ 'server.path': '/venv/bin/python3.11' })), {
        command: '/venv/bin/python3.11',
        args: ['-m', 'dg_lsp'],
    });
    assert.deepEqual(serverCommand(reader({ 'server.path': 'C:\\venv\\Scripts\\python.exe' })).args, ['-m', 'dg_lsp']);
});

test('package.json contributes exactly the server settings plus the client-only ones', () => {
    const pkg = JSON.parse(readFileSync(join(__dirname, '..', '..', 'package.json'), 'utf8'));
    const props: Record<string, { type: string; default: unknown }> = pkg.contributes.configuration.properties;
    const contributed = Object.keys(props).map((k) => k.replace(/^dgLsp\./, ''));
    const clientOnly = [...RESTART_KEYS, 'inlineCompletion.enabled', 'completion.enabled', 'trace.server'];
    assert.deepEqual(contributed.sort(), [...Object.keys(SERVER_SETTINGS), ...clientOnly].sort());
    const jsonType = { string: 'string', count: 'integer', boolean: 'boolean', stringList: 'array' } as const;
    for (const [key, kind] of Object.entries(SERVER_SETTINGS)) {
        assert.equal(props[`dgLsp.${key}`].type, jsonType[kind], key);
        // every contributed default must itself be a value the mapping accepts
        assert.deepEqual(mapServerSettings(reader({ [key]: props[`dgLsp.${key}`].default })).problems, [], key);
    }
});

test('a missing server names install commands that work for this project', () => {
    const failure = describeStartFailure('dg-lsp', 'Launching server using command dg-lsp failed. Error: spawn dg-lsp ENOENT');
    assert.equal(failure.label, 'not found');
    assert.match(failure.message, /`dg-lsp` was not found/);
    assert.match(failure.message, /pip install -e \./);
    assert.match(failure.message, /pipx install --preinstall torch==2\.13\.0 \./);
    assert.match(failure.message, /dgLsp\.server\.path/);
    assert.doesNotMatch(failure.message, /pip install dg-lsp/);
    assert.equal(describeStartFailure('/x/dg-lsp', 'spawn /x/dg-lsp EACCES').label, 'not executable');
    assert.equal(describeStartFailure('dg-lsp', 'exited with code 2').label, 'failed to start');
});
