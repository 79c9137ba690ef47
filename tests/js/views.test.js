// The views through the JS API (wasm under node): envelopes become objects, errors GpumemErrors,
// and every figure is the estimate of the same setup.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError, requestText, resultOfEnvelope, mergeViewParts, CALLS } from '../../wasm/gpumem.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const factory = createRequire(import.meta.url)(process.env.GPUMEM_WASM_JS ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
const api = await loadGpumem({ factory });

const setup = { model: { kind: 'transformer', preset: 'gpt2' }, training: { batchSize: 2, sequenceLength: 128, precision: 'ampBf16' }, gpu: { id: 'nvidia-rtx-3080' } };

test('heat map cells are estimates of the same setups', () => {
  const heat = api.heatMap(setup, { axisValues: 3 });
  assert.ok(heat.batchSizes.includes(2) && heat.sequenceLengths.includes(128));
  for (const [i, batchSize] of heat.batchSizes.entries()) {
    for (const [j, sequenceLength] of heat.sequenceLengths.entries()) {
      const estimate = api.estimate({ ...setup, training: { ...setup.training, batchSize, sequenceLength } });
      assert.equal(heat.cells[i][j].peakBytes, estimate.device.peakDeviceBytes);
      assert.equal(heat.cells[i][j].fits, estimate.gpu.fits);
    }
  }
  assert.equal(heat.estimates, heat.batchSizes.length * heat.sequenceLengths.length);
});

test('GPU matrix verdicts agree with an estimate on each GPU', () => {
  const matrix = api.gpuMatrix(setup);
  assert.equal(matrix.gpus.length, api.options().gpus.length);
  for (const gpu of matrix.gpus.filter((g) => g.fits)) {
    const choice = matrix.candidates[gpu.choice];
    const changed = { ...setup, training: { ...setup.training, ...(choice.change.training ?? {}) }, gpu: { id: gpu.id } };
    const estimate = api.estimate(changed);
    assert.equal(estimate.gpu.fits, true, gpu.id);
    assert.equal(estimate.gpu.headroomBytes, gpu.headroomBytes, gpu.id);
  }
});

test('curves carry the capacity and the largest value that fits', () => {
  const curves = api.curves(setup, { curvePoints: 8 });
  assert.equal(curves.capacityBytes, api.estimate(setup).gpu.capacityBytes);
  const lf = curves.batch.largestFitting;
  assert.ok(lf);
  assert.equal(api.estimate({ ...setup, training: { ...setup.training, batchSize: lf.value } }).device.peakDeviceBytes, lf.peakBytes);
  if (!lf.beyondRange) assert.equal(api.estimate({ ...setup, training: { ...setup.training, batchSize: lf.value + 1 } }).gpu.fits, false);
});

test('errors are GpumemErrors naming the field; the worker path gives the same envelopes', () => {
  assert.throws(() => api.heatMap({ training: { batchSize: 0 } }), (e) => e instanceof GpumemError && e.field === 'training.batchSize');
  assert.throws(() => api.curves(setup, { curvePoints: 99 }), (e) => e instanceof GpumemError && e.field === 'curvePoints');
  // What web/worker.js runs: the bound function on requestText()'s text.
  const text = requestText('gpuMatrix', setup);
  assert.deepEqual(resultOfEnvelope(api.envelope('gpuMatrix', text), 'gpuMatrix'), api.gpuMatrix(setup));
  assert.deepEqual(resultOfEnvelope(api.envelope('solve', requestText('solve', setup)), 'solve'), api.solve(setup));
  assert.deepEqual(Object.keys(CALLS).sort(), ['curves', 'fewestGpus', 'gpuMatrix', 'heatMap', 'layouts', 'solve']);
});

test('a view split into parts merges into the whole view (the page\'s worker pool)', () => {
  const heat = api.heatMap(setup, { axisValues: 3 });
  for (const count of [2, 3, 5]) {
    const parts = Array.from({ length: count }, (_, index) => api.heatMap(setup, { axisValues: 3, part: { index, count } }));
    for (const [index, part] of parts.entries()) {
      assert.deepEqual(part.part, { index, count });
      const mine = part.cells.flat().filter((cell) => cell !== null).length;
      assert.equal(part.estimates, mine);
    }
    // In any order, as the workers answer.
    assert.deepEqual(mergeViewParts('heatMap', parts.reverse()), heat);
  }
  const curves = api.curves(setup, { curvePoints: 4 });
  const halves = [1, 0].map((index) => api.curves(setup, { curvePoints: 4, part: { index, count: 2 } }));
  assert.equal(halves[0].batch, null);
  assert.equal(halves[1].sequence, null);
  const merged = mergeViewParts('curves', halves);
  assert.deepEqual({ ...merged, estimates: 0 }, { ...curves, estimates: 0 });
  assert.equal(merged.estimates, curves.estimates + 1, 'each half estimates the current setup');
  // Parts that are not one whole are refused, not merged into a wrong view.
  const two = [0, 1].map((index) => api.heatMap(setup, { axisValues: 3, part: { index, count: 2 } }));
  assert.throws(() => mergeViewParts('heatMap', [two[0]]), GpumemError);
  assert.throws(() => mergeViewParts('heatMap', [two[0], two[0]]), GpumemError);
  assert.throws(() => mergeViewParts('gpuMatrix', [api.gpuMatrix(setup)]), GpumemError);
  assert.throws(() => api.gpuMatrix(setup, { part: { index: 0, count: 2 } }), (e) => e instanceof GpumemError && e.field === 'part.count');
  assert.throws(() => api.heatMap(setup, { part: { index: 3, count: 2 } }), (e) => e instanceof GpumemError && e.field === 'part.index');
});
