// The module's memory ceiling (issue 14): an abort at the ceiling is a clear tooLarge error on
// the likely field, never a crashed page, and the module is reloaded and usable afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError, MAXIMUM_MEMORY_BYTES } from '../../wasm/gpumem.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const factory = createRequire(import.meta.url)(wasmJs);

test('the glue is linked with a 1 GiB ceiling on growing memory', () => {
  const glue = readFileSync(wasmJs, 'utf8');
  // Emscripten 3.1.6 writes the ceiling into its growth check (emscripten_resize_heap).
  assert.match(glue, new RegExp(String(MAXIMUM_MEMORY_BYTES)));
});

test('a setup beyond the work budget is refused before it can take memory', async () => {
  const gpumem = await loadGpumem({ factory });
  assert.throws(() => gpumem.estimate({ model: { preset: 'llama-2-7b', architecture: { numLayers: 20000 } } }),
    (e) => e instanceof GpumemError && e.code === 'tooLarge' && e.field === 'model.architecture.numLayers');
  assert.ok(gpumem.estimate({ model: { preset: 'gpt2' } }).peak.totalBytes > 0);
});

test('a single estimate takes the page\'s budget; a search keeps the smaller one and says so', async () => {
  // Qwen3-30B-A3B (48 layers × 128 experts) with LoRA on the attention, every block checkpointed:
  // 1,258,256 predicted events, past a search's 500,000 and within the page's 1,500,000.
  const gpumem = await loadGpumem({ factory });
  const setup = JSON.parse(readFileSync(path.join(repoRoot, 'tests', 'data', 'qwen3-30b-a3b-lora.json'), 'utf8'));
  const estimate = gpumem.estimate(setup);
  assert.equal(estimate.modelStates.parameterCount, 30545491968);
  assert.ok(estimate.timelineEventCount > 500000, `${estimate.timelineEventCount} events`);
  assert.deepEqual(gpumem.validate(setup).ok, true);
  assert.throws(() => gpumem.solve(setup), (e) => e instanceof GpumemError && e.code === 'tooLarge' &&
    e.field === 'model.architecture.numExperts' && /each estimate of a search may take/.test(e.message) &&
    /a single estimate takes up to 1,500,000 in the page/.test(e.message));
  // Past the page's budget (64 layers: 1.68e6 predicted): refused, the CLI named.
  const deeper = { ...setup, model: { ...setup.model, architecture: { ...setup.model.architecture, numLayers: 64 } } };
  assert.throws(() => gpumem.estimate(deeper), (e) => e instanceof GpumemError && e.code === 'tooLarge' &&
    /more than the 1,500,000 an estimate may take in the page/.test(e.message) && /gpumem SETUP\.json/.test(e.message));
});

test('an abort at the memory ceiling is a tooLarge error and the module is reloaded', async () => {
  // The real module, whose estimate aborts once the way Emscripten does when an allocation
  // finds the heap at its ceiling (the budget keeps real setups from getting there).
  let instances = 0;
  const aborting = async () => {
    const core = await factory();
    instances += 1;
    if (instances > 1) return core;
    return new Proxy(core, {
      get(target, key) {
        if (key === 'HEAP8') return { length: MAXIMUM_MEMORY_BYTES };
        if (key === 'estimateJson') return () => { throw new WebAssembly.RuntimeError('Aborted(native code called abort())'); };
        const value = target[key];
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  };
  const gpumem = await loadGpumem({ factory: aborting });
  gpumem.options();  // as the page does first: the presets say Mixtral has experts
  const moe = { model: { preset: 'mixtral-8x7b' } };
  assert.throws(() => gpumem.estimate(moe), (e) => {
    assert.ok(e instanceof GpumemError);
    assert.equal(e.code, 'tooLarge');
    assert.equal(e.field, 'model.architecture.numExperts');
    assert.match(e.message, /ran out of memory.*restarted/);
    return true;
  });
  await gpumem.ready();
  assert.equal(instances, 2);
  const estimate = gpumem.estimate({ model: { preset: 'gpt2' } });
  assert.ok(estimate.peak.totalBytes > 0);
});

test('an abort below the ceiling is an internal error and the module is reloaded too', async () => {
  let instances = 0;
  const failing = async () => {
    const core = await factory();
    instances += 1;
    if (instances > 1) return core;
    return new Proxy(core, {
      get(target, key) {
        if (key === 'solveJson') return () => { throw 1234; };  // a bare pointer, as embind throws
        const value = target[key];
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  };
  const gpumem = await loadGpumem({ factory: failing });
  assert.throws(() => gpumem.solve({}), (e) => e instanceof GpumemError && e.code === 'internal');
  await gpumem.ready();
  assert.ok(gpumem.solve({ model: { preset: 'gpt2' } }));
});
