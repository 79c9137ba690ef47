// The views through the JS API (wasm under node): envelopes become objects, errors GpumemErrors,
// and every figure is the estimate of the same setup.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError, requestText, resultOfEnvelope, CALLS } from '../../wasm/gpumem.js';

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
