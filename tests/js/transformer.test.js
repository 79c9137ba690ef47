// Transformer architectures through the JS API (wasm/gpumem.js) over the real wasm build, as the
// page's architecture mode uses them: presets, the options the form is built from, and errors
// that name an architecture field. Run from the repository root with `node --test tests/js/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError } from '../../wasm/gpumem.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });

function thrownBy(call) {
  try {
    call();
  } catch (error) {
    return error;
  }
  assert.fail('expected a throw');
}

test('the GPT-2 preset counts 124,439,808 parameters', () => {
  const estimate = gpumem.estimate({ model: { preset: 'gpt2' }, training: { batchSize: 1, sequenceLength: 128 } });
  assert.equal(estimate.modelStates.parameterCount, 124439808);
  assert.equal(estimate.activationsFromHeuristic, false);
  assert.ok(estimate.peak.totalBytes > estimate.modelStates.totalBytes);
});

test('numHeads 7 with hiddenSize 768 throws a GpumemError naming model.architecture.numHeads', () => {
  const error = thrownBy(() => gpumem.estimate({
    model: { kind: 'transformer', architecture: { family: 'gpt2', hiddenSize: 768, numHeads: 7 } },
  }));
  assert.ok(error instanceof GpumemError, `a GpumemError (got ${error?.name})`);
  assert.equal(error.field, 'model.architecture.numHeads');
  assert.equal(error.code, 'invalidField');
  assert.match(error.message, /model\.architecture\.numHeads/);
  // A preset with the same override fails the same way: architecture fields override the preset.
  const overPreset = thrownBy(() => gpumem.estimate({ model: { preset: 'gpt2', architecture: { numHeads: 7 } } }));
  assert.equal(overPreset.field, 'model.architecture.numHeads');
});

test('every preset: its label, source and published count, and the page can name its family', () => {
  const o = gpumem.options();
  assert.ok(Array.isArray(o.presets) && o.presets.length > 0);
  const families = o.families.map((f) => f.id);
  for (const p of o.presets) {
    for (const key of ['id', 'label', 'source', 'countedAs']) assert.equal(typeof p[key], 'string', `${p.id}.${key}`);
    assert.ok(Number.isSafeInteger(p.publishedParameters) && p.publishedParameters > 0, `${p.id} published count`);
    assert.ok(families.includes(p.architecture.family), `${p.id}: family ${p.architecture.family} is listed`);
    // The architecture the page fills in has the fields of its family's defaults, no more.
    assert.deepEqual(Object.keys(p.architecture).sort(), Object.keys(o.familyDefaults[p.architecture.family]).sort(), p.id);
  }
  for (const list of ['families', 'hiddenActs', 'encoderHeads', 'attentions', 'checkpointings']) {
    assert.ok(Array.isArray(o[list]) && o[list].length > 0, list);
  }
  assert.ok(o.precisions.some((p) => p.id === 'ampBf16'));
  assert.ok(o.categories.some((c) => c.id === 'weightCopies'));
});

test('a setup written as the page writes it (preset + full architecture) estimates as the preset alone', () => {
  const preset = gpumem.options().presets.find((p) => p.id === 'qwen2.5-1.5b');
  const training = { batchSize: 1, sequenceLength: 256 };
  const alone = gpumem.estimate({ model: { preset: preset.id }, training });
  const written = gpumem.estimate({ model: { kind: 'transformer', preset: preset.id, architecture: { ...preset.architecture } }, training });
  assert.equal(alone.modelStates.parameterCount, 1543714304);
  assert.deepEqual(written, alone);
});

test('checkpointing every block lowers the GPT-2 peak', () => {
  const peak = (checkpointing) => gpumem.estimate({
    model: { preset: 'gpt2' }, training: { batchSize: 1, sequenceLength: 1024, checkpointing },
  }).peak.totalBytes;
  assert.ok(peak('everyBlock') < peak('none'));
});

test('a long timeline is thinned with each entry\'s index into the full run', () => {
  const e = gpumem.estimate({ model: { preset: 'llama-2-7b' }, training: { batchSize: 1, sequenceLength: 512 } },
    { timeline: 'points' });
  assert.ok(e.timelineEventCount > e.timeline.length, 'thinned');
  let last = -1;
  for (const p of e.timeline) {
    assert.ok(Number.isInteger(p.index) && p.index > last && p.index < e.timelineEventCount);
    last = p.index;
  }
  // The page marks the peak at its event: the peak's event is one of those listed.
  const listed = e.timeline.find((p) => p.index === e.peak.eventIndex);
  assert.ok(listed, 'the peak event is listed');
  assert.equal(listed.totalBytes, e.peak.totalBytes);
});
