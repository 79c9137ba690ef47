// compareSnapshot() of the JS API (wasm/gpumem.js) over the real wasm build: a PyTorch memory
// snapshot's bytes cross into the core as a Uint8Array, byte for byte, and come back measured.
// Figures: tests/data/snapshots/make_snapshots.py and tests/snapshot_test.cpp.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError } from '../../wasm/gpumem.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });
const snapshot = (name) => new Uint8Array(readFileSync(path.join(repoRoot, 'tests', 'data', 'snapshots', name)));
const MiB = 1024 * 1024;

test('compareSnapshot measures a snapshot given as bytes (bytes above 0x7f intact)', () => {
  const result = gpumem.compareSnapshot(snapshot('simple.pickle'));
  assert.equal(result.measured.peakAllocatedBytes, 21.5 * MiB);
  assert.equal(result.measured.peakReservedBytes, 22 * MiB);
  assert.equal(result.measured.timeline.length, 11);
  assert.equal(result.measured.segments.inactiveBytes, 1.25 * MiB);
  assert.equal(result.estimate, null);
  // An ArrayBuffer works too.
  const buffer = snapshot('two_devices.pickle').buffer;
  const two = gpumem.compareSnapshot(buffer);
  assert.equal(two.measured.device, 1);
  assert.equal(two.measured.segments.fragmentation, 0.25);
});

test('compareSnapshot with a setup puts the estimate beside the measurement', () => {
  const setup = { model: { preset: 'gpt2' } };
  const result = gpumem.compareSnapshot(snapshot('simple.pickle'), setup);
  const estimate = gpumem.estimate(setup);
  assert.equal(result.estimate.peakBytes, estimate.peak.totalBytes);
  assert.ok(result.estimate.timeline.length > 2);
  assert.equal(result.estimate.peakAllocatedBytes, estimate.device.peakAllocatedBytes);
  assert.equal(result.comparison.estimateMinusPeakAllocatedBytes, estimate.device.peakAllocatedBytes - 21.5 * MiB);
  assert.equal(result.comparison.estimateMinusPeakReservedBytes, estimate.device.peakReservedBytes - 22 * MiB);
});

test('compareSnapshot refuses code and non-bytes with GpumemErrors', () => {
  assert.throws(() => gpumem.compareSnapshot(snapshot('hostile_reduce.pickle')),
    (e) => e instanceof GpumemError && e.field === 'snapshot' && /STACK_GLOBAL/.test(e.message));
  assert.throws(() => gpumem.compareSnapshot('not bytes'), (e) => e instanceof GpumemError && e.field === 'snapshot');
  assert.throws(() => gpumem.compareSnapshot(snapshot('simple.pickle'), { training: { batchSize: 0 } }),
    (e) => e instanceof GpumemError && e.field === 'training.batchSize');
});

test('measureScript writes the Python that measures a setup, with the estimate\'s figures', () => {
  const setup = { model: { preset: 'llama-3.2-1b' }, training: { precision: 'ampBf16', attention: 'sdpa', sequenceLength: 512 } };
  const made = gpumem.measureScript(setup);
  assert.equal(made.fileName, 'gpumem_measure_llama.py');
  assert.equal(made.modelType, 'llama');
  assert.match(made.script, /^#!\/usr\/bin\/env python3\n/);
  assert.match(made.script, /ATTENTION = "sdpa"/);
  assert.match(made.script, /BATCH, SEQUENCE = 1, 512/);
  const estimate = gpumem.estimate(setup);
  assert.ok(made.script.includes(`"peakReservedBytes": ${estimate.device.peakReservedBytes},`));
  assert.ok(made.script.includes(`"peakDeviceBytes": ${estimate.device.peakDeviceBytes},`));
  // What it cannot run is refused by field, as a GpumemError.
  assert.throws(() => gpumem.measureScript({ model: { preset: 'gpt2' }, training: { optimizer: 'lion' } }),
    (error) => error instanceof GpumemError && error.errors[0].field === 'training.optimizer');
});
