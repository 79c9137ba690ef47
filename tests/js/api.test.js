// The JS API (wasm/gpumem.js) over the real wasm build: figures, shapes and errors as the page
// sees them. Run from the repository root with `node --test tests/js/`; GPUMEM_WASM_JS names
// another build of gpumem_core.cjs (relative to the working directory).
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
const factory = createRequire(import.meta.url)(wasmJs);
const gpumem = await loadGpumem({ factory });

function quick(parameterCount, precision, optimizer) {
  return {
    model: { kind: 'parameterCount', parameterCount },
    training: { precision, optimizer },
  };
}

function mlpExample() {
  const example = gpumem.options().examples.find((e) => e.id === 'mlp');
  assert.ok(example, 'options().examples has an "mlp" entry');
  return JSON.parse(JSON.stringify(example.setup));
}

// Every number anywhere in the estimate, with its path, so a NaN or Infinity cannot hide.
function* numbersIn(value, where = 'estimate') {
  if (typeof value === 'number') {
    yield [where, value];
  } else if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) yield* numbersIn(value[i], `${where}[${i}]`);
  } else if (value && typeof value === 'object') {
    for (const [key, child] of Object.entries(value)) yield* numbersIn(child, `${where}.${key}`);
  }
}

function assertAllFinite(estimate) {
  let count = 0;
  for (const [where, n] of numbersIn(estimate)) {
    assert.ok(Number.isFinite(n), `${where} is finite (got ${n})`);
    count++;
  }
  assert.ok(count > 0);
}

// The thrown value must be a real Error carrying the core's code and field, never the bare
// number an escaping C++ exception would be.
function assertRejects(setup, code, field) {
  let thrown;
  try {
    gpumem.estimate(setup);
  } catch (error) {
    thrown = error;
  }
  assert.ok(thrown !== undefined, `estimate(${describe(setup)}) throws`);
  assert.ok(thrown instanceof Error, `thrown value is an Error (got ${typeof thrown})`);
  assert.ok(thrown instanceof GpumemError);
  assert.equal(thrown.name, 'GpumemError');
  assert.ok(Array.isArray(thrown.errors) && thrown.errors.length >= 1);
  for (const e of thrown.errors) {
    assert.equal(typeof e.code, 'string');
    assert.equal(typeof e.field, 'string');
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
  }
  assert.equal(thrown.code, thrown.errors[0].code);
  assert.equal(thrown.field, thrown.errors[0].field);
  if (Array.isArray(code)) {
    assert.ok(code.includes(thrown.code), `code ${thrown.code} is one of ${code.join(', ')}`);
  } else {
    assert.equal(thrown.code, code);
  }
  if (field !== undefined) {
    assert.equal(thrown.field, field);
    if (field) assert.ok(thrown.message.includes(field), `message "${thrown.message}" names ${field}`);
  }
  // validate() reports the same problem without throwing.
  const checked = gpumem.validate(setup);
  assert.equal(checked.ok, false);
  assert.deepEqual(checked.errors[0].code, thrown.code);
  assert.deepEqual(checked.errors[0].field, thrown.field);
  return thrown;
}

function describe(setup) {
  let text;
  try {
    text = typeof setup === 'string' ? setup : JSON.stringify(setup);
  } catch {
    text = String(setup);
  }
  return text && text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

test('version and options come from the core', () => {
  assert.equal(typeof gpumem.version, 'string');
  assert.match(gpumem.version, /^\d+\.\d+\.\d+/);
  const o = gpumem.options();
  assert.equal(o.version, gpumem.version);
  for (const list of ['modelKinds', 'layerTypes', 'losses', 'precisions', 'optimizers',
    'optimizerImplementations', 'phases', 'categories']) {
    assert.ok(Array.isArray(o[list]) && o[list].length > 0, `${list} is a non-empty list`);
    for (const item of o[list]) {
      assert.equal(typeof item.id, 'string', `${list} id`);
      assert.equal(typeof item.label, 'string', `${list} label`);
      assert.ok(item.id.length > 0 && item.label.length > 0);
    }
  }
  const ids = (list) => o[list].map((item) => item.id);
  assert.deepEqual(ids('modelKinds'), ['parameterCount', 'layers', 'transformer']);
  assert.deepEqual(ids('phases'), ['init', 'forward', 'backward', 'optimizerStep']);
  for (const id of ['fp32', 'fp16Mixed', 'bf16Mixed', 'bf16']) assert.ok(ids('precisions').includes(id), id);
  for (const id of ['sgd', 'sgdMomentum', 'adam', 'adamw', 'adafactor']) assert.ok(ids('optimizers').includes(id), id);
  for (const id of ['forEach', 'perParameter', 'fused']) assert.ok(ids('optimizerImplementations').includes(id), id);
  for (const id of ['embedding', 'linear', 'relu', 'gelu', 'tanh', 'sigmoid', 'dropout']) assert.ok(ids('layerTypes').includes(id), id);
  for (const id of ['crossEntropy', 'mse']) assert.ok(ids('losses').includes(id), id);
  for (const id of ['parameters', 'masterWeights', 'gradients', 'optimizerStates',
    'optimizerIntermediates', 'activations', 'activationGradients', 'inputBatch', 'weightCopies']) {
    assert.ok(ids('categories').includes(id), id);
  }
  assert.ok(Array.isArray(o.examples) && o.examples.length > 0);
  for (const e of o.examples) {
    assert.equal(typeof e.id, 'string');
    assert.equal(typeof e.label, 'string');
    assert.equal(typeof e.setup, 'object');
  }
  assert.equal(gpumem.options(), o, 'options() is cached');
});

test('defaultSetup() is a fresh copy and the cached options cannot be edited', () => {
  const a = gpumem.defaultSetup();
  const b = gpumem.defaultSetup();
  assert.notEqual(a, b);
  assert.deepEqual(a, b);
  assert.deepEqual(a, gpumem.options().defaultSetup);
  a.training.batchSize = 12345;
  assert.notEqual(gpumem.defaultSetup().training.batchSize, 12345);
  assert.throws(() => { gpumem.options().defaultSetup.training.batchSize = 7; }, TypeError);
  assert.throws(() => { mlpExampleRaw().setup.model.layers.push({}); }, TypeError);
});

function mlpExampleRaw() {
  return gpumem.options().examples.find((e) => e.id === 'mlp');
}

test('validate() normalises: an empty setup is the default setup', () => {
  const checked = gpumem.validate({});
  assert.equal(checked.ok, true);
  assert.deepEqual(checked.setup, gpumem.defaultSetup());
  assert.deepEqual(gpumem.validate('{}'), checked);
  // A normalised setup estimates exactly as the original does.
  const setup = quick(7e8, 'bf16Mixed', 'adamw');
  const normalised = gpumem.validate(setup);
  assert.equal(normalised.ok, true);
  assert.deepEqual(gpumem.estimate(normalised.setup), gpumem.estimate(setup));
});

test('quick mode, 1.5e9 parameters, fp16Mixed, adam: 24e9 bytes of model states', () => {
  const estimate = gpumem.estimate(quick(1.5e9, 'fp16Mixed', 'adam'));
  const m = estimate.modelStates;
  assert.equal(m.parameterCount, 1.5e9);
  assert.equal(m.parametersBytes, 3e9);
  assert.equal(m.masterWeightsBytes, 6e9);
  assert.equal(m.gradientsBytes, 3e9);
  assert.equal(m.optimizerStatesBytes, 12e9);
  assert.equal(m.totalBytes, 24e9);
  assert.equal(estimate.activationsFromHeuristic, true);
});

test('quick mode fp32: optimizer states are 0, 4N and 8N bytes for sgd, sgdMomentum, adam', () => {
  const N = 123456789;
  const states = (optimizer) => gpumem.estimate(quick(N, 'fp32', optimizer)).modelStates;
  assert.equal(states('sgd').optimizerStatesBytes, 0);
  assert.equal(states('sgdMomentum').optimizerStatesBytes, 4 * N);
  assert.equal(states('adam').optimizerStatesBytes, 8 * N);
  assert.equal(states('adamw').optimizerStatesBytes, 8 * N);
  const adam = states('adam');
  assert.equal(adam.parametersBytes, 4 * N);
  assert.equal(adam.masterWeightsBytes, 0);
  assert.equal(adam.gradientsBytes, 4 * N);
  assert.equal(adam.totalBytes, 16 * N);
});

test('the MLP example: 369,405,824 parameters, 16 B each with fp32 adam', () => {
  const setup = mlpExample();
  assert.equal(setup.model.kind, 'layers');
  const layers = setup.model.layers.map((l) => (l.type === 'linear'
    ? `linear ${l.inFeatures}->${l.outFeatures}${l.bias === false ? ' nobias' : ''}`
    : l.type));
  assert.deepEqual(layers, ['linear 240000->1024', 'relu', 'linear 1024->512', 'relu', 'linear 512->240000']);

  setup.training = { ...setup.training, precision: 'fp32', optimizer: 'adam' };
  const estimate = gpumem.estimate(setup);
  assert.equal(estimate.modelStates.parameterCount, 369405824);
  assert.equal(estimate.modelStates.totalBytes, 16 * 369405824);
  assert.equal(estimate.activationsFromHeuristic, false);
});

test('the timeline is opt-in: none by default, points or labelled on request', () => {
  const setup = { model: { preset: 'gpt2' }, training: { batchSize: 1, sequenceLength: 128 } };
  const plain = gpumem.estimate(setup);
  assert.equal(plain.timeline, null);
  assert.ok(plain.timelineEventCount > 1000);
  const points = gpumem.estimate(setup, { timeline: 'points' });
  const labelled = gpumem.estimate(setup, { timeline: 'labelled' });
  assert.equal(points.timeline.length, labelled.timeline.length);
  assert.ok(points.timeline.every((p) => p.label === undefined));
  assert.ok(labelled.timeline.every((p) => typeof p.label === 'string' && p.label.length > 0));
  assert.deepEqual(labelled.timeline.map(({ label, ...rest }) => rest), points.timeline);
  // The labelled timeline brings the allocator's segments at the reserved peak (docs/schema.md).
  assert.equal(plain.device.segments, null);
  assert.equal(points.device.segments, null);
  assert.equal(labelled.device.segments.reservedBytes, labelled.device.peakReservedBytes);
  // Everything but the timeline and the segments is the same whichever is asked for.
  const withoutTimeline = (e) => ({ ...e, timeline: null, device: { ...e.device, segments: null } });
  assert.deepEqual(withoutTimeline(plain), withoutTimeline(labelled));
});

test('estimate shape: peak, phase peaks, timeline, all numbers finite', () => {
  const setups = [
    quick(1.5e9, 'fp16Mixed', 'adam'),
    gpumem.defaultSetup(),
    ...gpumem.options().examples.map((e) => e.setup),
  ];
  for (const optimizer of ['sgd', 'sgdMomentum', 'adam', 'adamw', 'adafactor']) {
    for (const precision of ['fp32', 'fp16Mixed', 'bf16Mixed', 'bf16']) {
      setups.push(quick(3.5e8, precision, optimizer));
      const mlp = mlpExample();
      mlp.training = { ...mlp.training, precision, optimizer };
      setups.push(mlp);
    }
  }
  for (const setup of setups) {
    const e = gpumem.estimate(setup, { timeline: 'labelled' });
    assertAllFinite(e);
    assert.ok(Number.isFinite(e.peak.totalBytes) && e.peak.totalBytes > 0);
    assert.ok(e.peak.totalBytes >= e.modelStates.totalBytes,
      `peak ${e.peak.totalBytes} >= model states ${e.modelStates.totalBytes}`);
    assert.equal(e.phasePeaks.length, 4);
    assert.deepEqual(e.phasePeaks.map((p) => p.phase), ['init', 'forward', 'backward', 'optimizerStep']);
    assert.equal(Math.max(...e.phasePeaks.map((p) => p.totalBytes)), e.peak.totalBytes,
      'the overall peak is the largest phase peak');
    assert.ok(Array.isArray(e.timeline) && e.timeline.length > 0);
    assert.ok(Math.max(...e.timeline.map((p) => p.totalBytes)) <= e.peak.totalBytes);
    const byCategory = e.peak.byCategory.reduce((sum, c) => sum + c.bytes, 0);
    assert.equal(byCategory, e.peak.totalBytes, 'the peak breakdown adds up to the peak');
    const states = e.modelStates;
    assert.equal(states.totalBytes, states.parametersBytes + states.masterWeightsBytes
      + states.gradientsBytes + states.optimizerStatesBytes);
    for (const n of [states.totalBytes, e.peak.totalBytes, e.gpu.capacityBytes]) {
      assert.ok(Number.isSafeInteger(n), `${n} is a whole number of bytes`);
    }
    // Fits is the device figure's (the caching allocator at capacity − context).
    const d = e.device;
    assert.equal(e.gpu.fits, d.fits);
    assert.equal(e.gpu.headroomBytes, d.headroomBytes);
    assert.equal(d.headroomBytes, d.capacityBytes - d.peakDeviceBytes);
    assert.equal(d.peakDeviceBytes, d.peakReservedBytes + d.contextBytes + d.communicationBytes);
    assert.equal(d.fits, d.peakDeviceBytes <= d.capacityBytes);
    assert.ok(d.peakReservedBytes >= d.peakAllocatedBytes && d.peakAllocatedBytes >= e.peak.totalBytes);
    assert.ok(['fits', 'tight', 'doesNotFit'].includes(d.verdict) && d.why.length > 0);
    assert.equal(d.oom === null, d.fits);
    for (const p of e.timeline) assert.ok(p.reservedBytes >= p.totalBytes);
  }
});

test('a setup given as JSON text estimates as the same object does', () => {
  const setup = quick(1.5e9, 'fp16Mixed', 'adam');
  assert.deepEqual(gpumem.estimate(JSON.stringify(setup)), gpumem.estimate(setup));
  assert.deepEqual(gpumem.estimate(), gpumem.estimate(gpumem.defaultSetup()));
});

test('malformed JSON text: malformedJson', () => {
  assertRejects('{"training": {', 'malformedJson', '');
  assertRejects('', 'malformedJson', '');
  assertRejects('not json', 'malformedJson', '');
  assertRejects('{"training":{"batchSize":NaN}}', 'malformedJson', '');
});

test('batchSize -1: invalidField training.batchSize', () => {
  assertRejects({ training: { batchSize: -1 } }, 'invalidField', 'training.batchSize');
  assertRejects('{"training":{"batchSize":-1}}', 'invalidField', 'training.batchSize');
});

test('batchSize of the wrong kind: invalidField training.batchSize', () => {
  assertRejects({ training: { batchSize: 'abc' } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: 1.5 } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: true } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: [1] } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: 0 } }, 'invalidField', 'training.batchSize');
});

test('NaN-like values: NaN and Infinity become null in JSON; 1e400 is not a JSON number', () => {
  assertRejects({ training: { batchSize: NaN } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: Infinity } }, 'invalidField', 'training.batchSize');
  assertRejects({ training: { batchSize: null } }, 'invalidField', 'training.batchSize');
  // The JSON parser refuses numbers beyond a double's range as it reads them.
  assertRejects('{"training":{"batchSize":1e400}}', 'malformedJson', '');
  assertRejects('{"training":{"batchSize":-1e400}}', 'malformedJson', '');
  assertRejects('{"training":{"batchSize":1e300}}', 'invalidField', 'training.batchSize');
  assertRejects({ model: { kind: 'parameterCount', parameterCount: NaN } }, 'invalidField', 'model.parameterCount');
  assertRejects({ gpu: { memoryGiB: NaN } }, 'invalidField', 'gpu.memoryGiB');
  assertRejects('{"gpu":{"memoryGiB":1e300}}', 'invalidField', 'gpu.memoryGiB');
  assertRejects({ gpu: { memoryGiB: -1 } }, 'invalidField', 'gpu.memoryGiB');
});

test('a huge parameterCount is refused, not overflowed', () => {
  assertRejects({ model: { kind: 'parameterCount', parameterCount: 1e30 } }, ['invalidField', 'tooLarge'], 'model.parameterCount');
  assertRejects('{"model":{"kind":"parameterCount","parameterCount":1e30}}', ['invalidField', 'tooLarge'], 'model.parameterCount');
  assertRejects({ model: { kind: 'parameterCount', parameterCount: 2 ** 63 } }, ['invalidField', 'tooLarge'], 'model.parameterCount');
  assertRejects('{"model":{"kind":"parameterCount","parameterCount":18446744073709551615}}', ['invalidField', 'tooLarge'], 'model.parameterCount');
  assertRejects({ model: { kind: 'parameterCount', parameterCount: -5 } }, 'invalidField', 'model.parameterCount');
});

test('huge shapes and batches are refused, not overflowed', () => {
  const bigLayers = {
    model: {
      kind: 'layers',
      layers: [{ type: 'linear', inFeatures: 4e9, outFeatures: 4e9, bias: true }],
    },
  };
  assertRejects(bigLayers, ['invalidField', 'tooLarge']);
  const bigBatch = mlpExample();
  bigBatch.training = { ...bigBatch.training, batchSize: 1e6, sequenceLength: 1e8 };
  assertRejects(bigBatch, ['invalidField', 'tooLarge']);
});

test('an unknown field: unknownField', () => {
  assertRejects({ traning: {} }, 'unknownField', 'traning');
  assertRejects('{"traning":{}}', 'unknownField', 'traning');
  assertRejects({ training: { batchSiz: 2 } }, 'unknownField', 'training.batchSiz');
});

test('unknown ids and wrong shapes name their field', () => {
  assertRejects({ training: { precision: 'fp8' } }, 'invalidField', 'training.precision');
  assertRejects({ training: { optimizer: 'sophia' } }, 'invalidField', 'training.optimizer');
  assertRejects({ model: { kind: 'gpt' } }, 'invalidField', 'model.kind');
  assertRejects({ training: 3 }, 'invalidField', 'training');
  assertRejects([], 'invalidField', '');
  assertRejects('null', 'invalidField', '');
  assertRejects('42', 'invalidField', '');
});

test('a linear layer whose inFeatures mismatches the width flowing in names that layer', () => {
  const setup = mlpExample();
  setup.model.layers[2].inFeatures = 999;
  assertRejects(setup, 'invalidField', 'model.layers[2].inFeatures');

  assertRejects({
    model: {
      kind: 'layers',
      layers: [
        { type: 'linear', inFeatures: 10, outFeatures: 20, bias: true },
        { type: 'relu' },
        { type: 'linear', inFeatures: 20, outFeatures: 30, bias: false },
        { type: 'gelu' },
        { type: 'linear', inFeatures: 31, outFeatures: 5, bias: true },
      ],
      loss: 'mse',
    },
  }, 'invalidField', 'model.layers[4].inFeatures');
});

test('odd text does not break the module: deep nesting, long and non-ASCII names', () => {
  const deep = `{"model":{"layers":${'['.repeat(100000)}${']'.repeat(100000)}}}`;
  assertRejects(deep, ['invalidField', 'malformedJson']);
  assertRejects('['.repeat(200000), 'malformedJson', '');
  assertRejects({ ['é'.repeat(5000)]: 1 }, 'unknownField');
  assertRejects({ training: { ['😀'.repeat(1001) + 'x']: 1 } }, 'unknownField');
  assertRejects({ training: { precision: '😀'.repeat(3001) } }, 'invalidField', 'training.precision');
  assertRejects({ training: { precision: 'a\u0000b' } }, 'invalidField', 'training.precision');
  assertRejects('{"training":{"precision":"\\udc00"}}', 'malformedJson', '');
  assertRejects({ training: { precision: '\udc00' } }, ['invalidField', 'malformedJson']);
  assertRejects('{"a":1,"a":2}', 'unknownField');
  assert.equal(gpumem.estimate(quick(1.5e9, 'fp16Mixed', 'adam')).modelStates.totalBytes, 24e9);
});

test('values JSON cannot carry are refused as errors, not thrown as TypeErrors', () => {
  const cyclic = { training: {} };
  cyclic.training.self = cyclic;
  assertRejects(cyclic, 'malformedJson', '');
  assertRejects({ training: { batchSize: 10n } }, 'malformedJson', '');
});

test('1000 failing calls leave the module working', () => {
  const bad = [
    '{"training": {',
    { training: { batchSize: -1 } },
    { training: { batchSize: 'abc' } },
    { traning: {} },
    { model: { kind: 'parameterCount', parameterCount: 1e30 } },
  ];
  for (let i = 0; i < 1000; i++) {
    const setup = bad[i % bad.length];
    assert.throws(() => gpumem.estimate(setup), GpumemError);
  }
  const estimate = gpumem.estimate(quick(1.5e9, 'fp16Mixed', 'adam'));
  assert.equal(estimate.modelStates.totalBytes, 24e9);
  const mlp = mlpExample();
  mlp.training = { ...mlp.training, precision: 'fp32', optimizer: 'adam' };
  assert.equal(gpumem.estimate(mlp).modelStates.totalBytes, 16 * 369405824);
});

test('validate() never throws', () => {
  const cyclic = {};
  cyclic.self = cyclic;
  const inputs = [
    undefined, null, 0, 42, NaN, true, '', '{', '[]', 'null', '"text"', [], [1, 2], {}, cyclic,
    { training: { batchSize: 10n } }, () => 1, Symbol('s'),
    { training: { batchSize: -1 } }, { traning: {} }, { training: { batchSize: 'abc' } },
    { model: { kind: 'parameterCount', parameterCount: 1e30 } },
    '['.repeat(100000), `"${'x'.repeat(1 << 20)}"`,
    quick(1.5e9, 'fp16Mixed', 'adam'), mlpExample(),
  ];
  for (const input of inputs) {
    let result;
    assert.doesNotThrow(() => { result = gpumem.validate(input); }, `validate(${String(typeof input)})`);
    assert.equal(typeof result.ok, 'boolean');
    if (result.ok) {
      assert.equal(typeof result.setup, 'object');
    } else {
      assert.ok(Array.isArray(result.errors) && result.errors.length > 0);
      for (const e of result.errors) {
        assert.equal(typeof e.code, 'string');
        assert.equal(typeof e.field, 'string');
        assert.equal(typeof e.message, 'string');
      }
    }
  }
  assert.equal(gpumem.validate(quick(1.5e9, 'fp16Mixed', 'adam')).ok, true);
  assert.equal(gpumem.validate(mlpExample()).ok, true);
});

test('GpumemError carries every error and names the first field', () => {
  const error = new GpumemError([
    { code: 'invalidField', field: 'training.batchSize', message: 'Must be at least 1.' },
    { code: 'unknownField', field: 'traning', message: 'Unknown field.' },
  ]);
  assert.ok(error instanceof Error);
  assert.equal(error.code, 'invalidField');
  assert.equal(error.field, 'training.batchSize');
  assert.equal(error.errors.length, 2);
  assert.match(error.message, /training\.batchSize/);
});

test('device: Llama 3.2 1B on an RTX 4090 fits on allocated bytes but not on the device', () => {
  // The known case: the allocated peak leaves tens of MiB (the page used to say "Fits"); the
  // caching allocator's segments and the 574 MiB CUDA context do not fit in the 4090's
  // 23.65 GiB (CUDA's total).
  const setup = {
    model: { preset: 'llama-3.2-1b' },
    training: { batchSize: 1, sequenceLength: 5580, precision: 'ampBf16', attention: 'sdpa', checkpointing: 'everyBlock' },
    gpu: { id: 'nvidia-rtx-4090' },
  };
  const e = gpumem.estimate(setup);
  const d = e.device;
  assert.ok(e.gpu.capacityBytes - e.peak.totalBytes > 0 && e.gpu.capacityBytes - e.peak.totalBytes < 100 * 2 ** 20);
  assert.equal(e.gpu.fits, false);
  assert.equal(d.verdict, 'doesNotFit');
  assert.equal(d.contextBytes, 574 * 2 ** 20);  // 426 at the first call + 148 of a step's kernels
  assert.equal(d.workspaceBytes, 19136512);  // 2 handles × (8,519,680 + 1,048,576) before Hopper
  assert.ok(d.oom && d.oom.requestedBytes > 0 && d.oom.largestFreeBlockBytes < d.oom.requestedBytes);
  assert.match(d.why, /found no free block/);
  // The runtime field reaches the core, and its defaults come from it.
  assert.deepEqual(gpumem.options().defaultSetup.runtime.allocator.expandableSegments, false);
  const expandable = gpumem.estimate({ ...setup, runtime: { allocator: { expandableSegments: true } } }).device;
  assert.ok(expandable.fragmentationBytes < d.fragmentationBytes);
  assert.throws(() => gpumem.estimate({ ...setup, runtime: { allocator: { maxSplitSizeMiB: 5 } } }),
    (err) => err instanceof GpumemError && err.errors.some((x) => x.field === 'runtime.allocator.maxSplitSizeMiB'));
});
