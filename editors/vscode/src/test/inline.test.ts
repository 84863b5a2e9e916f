import assert from 'node:assert/strict';
import { test } from 'node:test';

import { extendSelection } from '../inline';

test('an infill that agrees with the selected suggestion is offered from where the suggestion starts', () => {
    assert.equal(extendSelection('ite', 'ms[-1]', 'items'), 'items[-1]');
    assert.equal(extendSelection('', 'items.pop()', 'items'), 'items.pop()');
});

test('an infill that disagrees, or adds nothing past the suggestion, is dropped', () => {
    assert.equal(extendSelection('ite', 'm', 'items'), undefined);
    assert.equal(extendSelection('ite', 'ms', 'items'), undefined);
    assert.equal(extendSelection('ite', 'get_key(self)', 'items'), undefined);
    assert.equal(extendSelection('ite', '   ', 'items'), undefined);
});
