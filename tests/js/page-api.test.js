// The JS API as the page's new features use it (GPU list, config.json and safetensors imports,
// solvers), and the page's own parameter module (web/setup-params.js) that turns embed attributes
// and link parameters into setups. Run with `node --test tests/js/` after building the wasm.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError } from '../../wasm/gpumem.js';
import { setupFromParams, decodeSetupParam, encodeSetupParam, calculatorHash, compactCalculatorHash, LONG_SETUP_CHARS, paramNumber, deflateSetupText, inflateSetupText, toBase64Url } from '../../web/setup-params.js';
import { gpt2SafetensorsHeader, llamaIndex } from './fixtures.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });
const options = gpumem.options();
const config = (name) => readFileSync(path.join(repoRoot, 'tests', 'data', 'configs', `${name}.json`), 'utf8');

function merge(base, over) {
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    out[k] = v && typeof v === 'object' && !Array.isArray(v) && base[k] && typeof base[k] === 'object' ? merge(base[k], v) : v;
  }
  return out;
}

test('options.gpus: at least 15 GPUs with id, label, memory, vendor and kind; gpu.id sets the capacity', () => {
  const gpus = options.gpus;
  assert.ok(Array.isArray(gpus) && gpus.length >= 15, `${gpus?.length} GPUs`);
  assert.equal(new Set(gpus.map((g) => g.id)).size, gpus.length, 'ids are unique');
  for (const g of gpus) {
    assert.match(g.id, /^[a-z0-9.-]+$/);
    assert.ok(g.label && g.vendor && g.kind, JSON.stringify(g));
    assert.ok(g.memoryGiB > 0);
  }
  for (const g of [gpus[0], gpus.find((x) => x.kind === 'consumer')]) {
    const estimate = gpumem.estimate({ gpu: { id: g.id } });
    assert.equal(estimate.gpu.capacityBytes, g.memoryGiB * 2 ** 30, `${g.id}: capacity from the list`);
  }
  const checked = gpumem.validate({ gpu: { id: 'nvidia-h100-sxm' } });
  assert.equal(checked.ok, true);
  // The H100 SXM's capacity is CUDA's measured total, 85,017,493,504 B (tests/data/cuda).
  assert.deepEqual(checked.setup.gpu, { memoryGiB: 85017493504 / 2 ** 30, id: 'nvidia-h100-sxm' }, 'the page reads the id and size back from a validated setup');
  assert.throws(() => gpumem.estimate({ gpu: { id: 'no-such-gpu' } }), (e) => e instanceof GpumemError && e.field === 'gpu.id');
});

test('options.presets: at least 25 models, each with a published count the architecture reproduces', () => {
  assert.ok(options.presets.length >= 25, `${options.presets.length} presets`);
  for (const id of ['gpt2', 'llama-2-7b', 'llama-3.2-1b']) {
    const preset = options.presets.find((p) => p.id === id);
    assert.ok(preset, id);
    const estimate = gpumem.estimate({ model: { preset: id }, training: { sequenceLength: 128 } });
    assert.equal(estimate.modelStates.parameterCount, preset.publishedParameters, id);
  }
});

test('importConfig: Llama-2-7B\'s config.json gives the preset\'s architecture and count', () => {
  const result = gpumem.importConfig(config('llama-2-7b'));
  assert.equal(result.modelType, 'llama');
  assert.equal(result.setup.model.kind, 'transformer');
  assert.ok(result.ignoredFields.includes('torch_dtype'), `ignored: ${result.ignoredFields.join(', ')}`);
  assert.ok(Array.isArray(result.notes));
  // What the page does: replace the model of the current setup, keep training and GPU.
  const current = { ...gpumem.defaultSetup(), training: { ...gpumem.defaultSetup().training, sequenceLength: 512 } };
  const merged = { ...current, model: result.setup.model };
  const estimate = gpumem.estimate(merged);
  assert.equal(estimate.modelStates.parameterCount, 6738415616);
  const preset = options.presets.find((p) => p.id === 'llama-2-7b');
  for (const [key, value] of Object.entries(preset.architecture)) {
    assert.equal(result.setup.model.architecture[key], value, `architecture.${key} equals the preset's`);
  }
  assert.equal(gpumem.importConfig(config('gpt2')).setup.model.architecture.family, 'gpt2');
});

test('importConfig: Gemma 2 9B and Gemma 3 1B configs give their presets\' architectures; soft caps and windows cost memory', () => {
  for (const [name, id, count] of [['gemma-2-9b', 'gemma-2-9b', 9241705984], ['gemma-3-1b', 'gemma-3-1b', 999885952]]) {
    const result = gpumem.importConfig(config(name));
    const preset = options.presets.find((p) => p.id === id);
    for (const [key, value] of Object.entries(preset.architecture)) {
      assert.equal(result.setup.model.architecture[key], value, `${name}: architecture.${key} equals the preset's`);
    }
    const estimate = gpumem.estimate({ ...gpumem.defaultSetup(), model: result.setup.model,
      training: { ...gpumem.defaultSetup().training, sequenceLength: 1024, attention: 'eager' } });
    assert.equal(estimate.modelStates.parameterCount, count, name);
  }
  // Gemma 2's caps keep tanh's outputs: without them the forward ends holding less.
  const gemma2 = gpumem.importConfig(config('gemma-2-9b')).setup.model;
  const training = { ...gpumem.defaultSetup().training, batchSize: 1, sequenceLength: 1024, attention: 'eager' };
  const capped = gpumem.estimate({ ...gpumem.defaultSetup(), model: gemma2, training });
  const uncapped = gpumem.estimate({ ...gpumem.defaultSetup(), training,
    model: { ...gemma2, architecture: { ...gemma2.architecture, attentionLogitSoftcap: 0, finalLogitSoftcap: 0 } } });
  assert.ok(capped.forwardEnd.totalBytes > uncapped.forwardEnd.totalBytes,
    `${capped.forwardEnd.totalBytes} > ${uncapped.forwardEnd.totalBytes}`);
  assert.throws(() => gpumem.importConfig('{"model_type": "gemma3", "text_config": {}}'),
    (e) => e instanceof GpumemError && /gemma3_text/.test(e.message));
});

test('importConfig: an OLMo 2 7B config gives its preset; its fp32 norm rows and rotary tables cost memory', () => {
  const result = gpumem.importConfig(config('olmo-2-1124-7b'));
  const preset = options.presets.find((p) => p.id === 'olmo-2-7b');
  for (const [key, value] of Object.entries(preset.architecture)) {
    assert.equal(result.setup.model.architecture[key], value, `architecture.${key} equals the preset's`);
  }
  const training = { ...gpumem.defaultSetup().training, batchSize: 1, sequenceLength: 1024, precision: 'bf16',
    attention: 'sdpa' };
  const olmo = gpumem.estimate({ ...gpumem.defaultSetup(), model: result.setup.model, training });
  assert.equal(olmo.modelStates.parameterCount, 7298617344);
  // The same shapes in Llama's layout (input norms that save 16-bit casts) end the forward holding less.
  const { olmo2Layout, rotaryFp32, queryKeyNorm, ...shapes } = result.setup.model.architecture;
  const llama = gpumem.estimate({ ...gpumem.defaultSetup(), training,
    model: { ...result.setup.model, architecture: { ...shapes, olmo2Layout: false, rotaryFp32: false, queryKeyNorm: false } } });
  assert.ok(olmo.forwardEnd.totalBytes > llama.forwardEnd.totalBytes,
    `${olmo.forwardEnd.totalBytes} > ${llama.forwardEnd.totalBytes}`);
});

test('importConfig: a Granite 3.1 config gives its preset; its multipliers add tensors but save none', () => {
  const text = JSON.stringify({ model_type: 'granite', hidden_size: 2048, intermediate_size: 8192,
    num_hidden_layers: 40, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 49155,
    tie_word_embeddings: true, embedding_multiplier: 12.0, residual_multiplier: 0.22,
    attention_multiplier: 0.015625, logits_scaling: 8.0 });
  const model = gpumem.importConfig(text).setup.model;
  const preset = options.presets.find((p) => p.id === 'granite-3.1-2b');
  for (const [key, value] of Object.entries(preset.architecture)) {
    assert.equal(model.architecture[key], value, `architecture.${key} equals the preset's`);
  }
  const training = { ...gpumem.defaultSetup().training, batchSize: 1, sequenceLength: 512, precision: 'bf16' };
  const granite = gpumem.estimate({ ...gpumem.defaultSetup(), model, training });
  const plain = gpumem.estimate({ ...gpumem.defaultSetup(), training,
    model: { ...model, architecture: { ...model.architecture, graniteMultipliers: false } } });
  assert.equal(granite.modelStates.parameterCount, 2533531648);
  assert.equal(granite.forwardEnd.totalBytes, plain.forwardEnd.totalBytes);
  assert.ok(granite.timelineEventCount > plain.timelineEventCount);
});

test('importConfig: missing fields are named as config.<key>; malformed JSON is a GpumemError', () => {
  assert.throws(() => gpumem.importConfig('{"model_type": "llama", "hidden_size": 4096}'),
    (e) => e instanceof GpumemError && /^config\./.test(e.field) && e.errors.length >= 2);
  assert.throws(() => gpumem.importConfig('{"model_type": "llama",'), (e) => e instanceof GpumemError);
  const bad = JSON.parse(config('llama-2-7b'));
  bad.num_attention_heads = 'many';
  assert.throws(() => gpumem.importConfig(JSON.stringify(bad)), (e) => e instanceof GpumemError && e.field === 'config.num_attention_heads');
});

test('importSafetensors: a GPT-2 header is counted exactly and equals the architecture\'s count; an index has no count', () => {
  const { text, parameterCount, tensorCount, dataBytes } = gpt2SafetensorsHeader();
  assert.equal(parameterCount, 124439808);
  const header = gpumem.importSafetensors(text);
  assert.equal(header.source, 'header');
  assert.equal(header.parameterCount, parameterCount);
  assert.equal(header.tensorCount, tensorCount);
  assert.equal(header.totalSizeBytes, dataBytes);
  // header.numLayers is not checked: GPT-2's own names ("h.11.…", no prefix) are not read as
  // blocks by the core yet (it looks for ".h."); the index below checks numLayers.
  assert.deepEqual(header.largestMatrices[0], { rows: 50257, cols: 768, name: 'wte.weight' });
  assert.equal(header.setup.model.kind, 'parameterCount');
  assert.equal(header.setup.model.parameterCount, parameterCount);
  const arch = gpumem.estimate({ model: { preset: 'gpt2' }, training: { sequenceLength: 128 } });
  assert.equal(header.parameterCount, arch.modelStates.parameterCount, 'the check the page shows in architecture mode');
  // The quick-mode setup it offers estimates.
  assert.equal(gpumem.estimate({ ...gpumem.defaultSetup(), model: header.setup.model }).modelStates.parameterCount, parameterCount);

  const index = gpumem.importSafetensors(JSON.stringify(llamaIndex()));
  assert.equal(index.source, 'index');
  assert.equal(index.parameterCount, null);
  assert.equal(index.totalSizeBytes, 13476839424);
  assert.equal(index.numLayers, 32);
  assert.equal(index.setup, null);

  const broken = JSON.parse(text);
  broken['wte.weight'].data_offsets = [0, 10];
  assert.throws(() => gpumem.importSafetensors(JSON.stringify(broken)), (e) => e instanceof GpumemError && /data_offsets/.test(e.field));
});

test('solve: the largest batch fits and one more does not; each suggestion\'s change gives its stated peak', () => {
  const setup = merge(gpumem.defaultSetup(), { model: { kind: 'transformer', preset: 'gpt2' }, training: { sequenceLength: 512 }, gpu: { id: 'nvidia-rtx-4090' } });
  delete setup.model.architecture;
  const result = gpumem.solve(setup);
  const largest = result.maxBatchSize;
  assert.ok(largest && largest.value >= 1, JSON.stringify(largest));
  const at = gpumem.estimate(merge(setup, { training: { batchSize: largest.value } }));
  assert.equal(at.device.peakDeviceBytes, largest.peakBytes);
  assert.equal(at.gpu.fits, true);
  assert.equal(gpumem.estimate(merge(setup, { training: { batchSize: largest.value + 1 } })).gpu.fits, false);
  const sequence = result.maxSequenceLength;
  assert.ok(sequence && sequence.value >= 1 && sequence.value <= sequence.limit, JSON.stringify(sequence));
  assert.ok(result.suggestions.length > 0);
  for (const s of result.suggestions) {
    assert.ok(s.id && s.label && s.change && typeof s.fits === 'boolean', JSON.stringify(s));
    const applied = gpumem.estimate(merge(setup, s.change));
    assert.equal(applied.device.peakDeviceBytes, s.peakBytes, `${s.id}: applying its change gives its peak`);
    assert.equal(applied.gpu.fits, s.fits, `${s.id}: fits as stated`);
  }
  // Single changes: those that fit first, then by cost (free, compute, changesResults), then
  // by memory saved.
  const costRank = { free: 0, compute: 1, changesResults: 2 };
  const singles = result.suggestions.filter((s) => !/\+/.test(s.id));
  const key = (s) => [s.fits ? 0 : 1, costRank[s.cost], -s.savedBytes];
  for (let i = 1; i < singles.length; ++i) {
    const [a, b] = [key(singles[i - 1]), key(singles[i])];
    const order = a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
    assert.ok(order <= 0, `${singles[i - 1].id} before ${singles[i].id}: ranked by fit, cost, then memory saved`);
  }

  // Nothing fits: no batch, and the suggestions say what would.
  const big = merge(gpumem.defaultSetup(), { model: { kind: 'transformer', preset: 'llama-2-7b' }, training: { sequenceLength: 2048 }, gpu: { id: 'nvidia-rtx-4090' } });
  delete big.model.architecture;
  const none = gpumem.solve(big);
  assert.equal(none.maxBatchSize, null);
  assert.ok(none.suggestions.length > 0);
});

test('setup-params: embed attributes and link parameters become a partial setup for the core', () => {
  const attrs = {
    preset: 'gpt2', 'batch-size': '8', 'sequence-length': '1,024', precision: 'ampBf16', optimizer: 'adamw',
    checkpointing: 'everyBlock', attention: 'sdpa', gpu: 'nvidia-rtx-4090',
  };
  const { setup, problems, given } = setupFromParams((n) => attrs[n]);
  assert.equal(given, true);
  assert.deepEqual(problems, []);
  assert.deepEqual(setup, {
    model: { preset: 'gpt2' },
    training: { batchSize: 8, sequenceLength: 1024, precision: 'ampBf16', optimizer: 'adamw', attention: 'sdpa', checkpointing: 'everyBlock' },
    gpu: { id: 'nvidia-rtx-4090' },
  });
  const estimate = gpumem.estimate(setup);
  assert.equal(estimate.gpu.capacityBytes, 25393692672);  // the 4090's CUDA total, 23.65 GiB
  assert.equal(estimate.modelStates.parameterCount, 124439808);

  // setup is the base; the other attributes override it; a size drops the GPU id.
  const base = { model: { kind: 'parameterCount', parameterCount: 7e9 }, training: { batchSize: 2 }, gpu: { id: 'nvidia-a100-40' } };
  const second = setupFromParams((n) => ({ setup: JSON.stringify(base), 'sequence-length': '256', 'gpu-memory-gib': '48' })[n]);
  assert.deepEqual(second.setup, { model: base.model, training: { batchSize: 2, sequenceLength: 256 }, gpu: { memoryGiB: 48 } });
  assert.equal(setupFromParams((n) => ({ 'parameter-count': '1.5B' })[n]).setup.model.parameterCount, 1.5e9);

  // What the page cannot read is reported; what the core must judge is passed on as given.
  assert.equal(setupFromParams((n) => ({ setup: '{nope' })[n]).problems[0].field, 'setup');
  const odd = setupFromParams((n) => ({ 'batch-size': 'lots', gpu: 'no-such-gpu' })[n]).setup;
  assert.equal(odd.training.batchSize, 'lots');
  assert.throws(() => gpumem.estimate(odd), (e) => e instanceof GpumemError && e.errors.some((x) => x.field === 'training.batchSize') && e.errors.some((x) => x.field === 'gpu.id'));
  assert.equal(setupFromParams(() => null).given, false);

  assert.equal(paramNumber(' 4 '), 4);
  assert.equal(paramNumber('7B'), 7e9);
  const s = { model: { preset: 'llama-3-8b' }, training: { batchSize: 1 }, note: 'ü ✓' };
  assert.deepEqual(decodeSetupParam(encodeSetupParam(s)), s);
  assert.deepEqual(decodeSetupParam(JSON.stringify(s)), s, 'raw JSON is accepted too');
  assert.match(calculatorHash(s, { units: 'GB' }), /^#s=[A-Za-z0-9_-]+&units=GB$/);
});

test('setup-params: a long setup\'s link parameter (z=) is its JSON compressed, read back exactly; a bad or bomb one is refused', async () => {
  const layers = Array.from({ length: 4000 }, (_, i) => ({ type: 'linear', inFeatures: 64, outFeatures: 64 + (i % 3) }));
  const text = JSON.stringify({ model: { kind: 'layers', layers }, note: 'ü ✓' });
  const z = await deflateSetupText(text);
  assert.match(z, /^[A-Za-z0-9_-]+$/, 'base64url');
  assert.equal(await inflateSetupText(z), text);
  // 4,000 layers: ~200 KB of base64url JSON, a few kilobytes compressed.
  assert.ok(z.length * 50 < toBase64Url(text).length, `${z.length} vs ${toBase64Url(text).length} characters`);
  await assert.rejects(inflateSetupText('not-deflate-data'));
  await assert.rejects(inflateSetupText(await deflateSetupText(text), { maxBytes: 1000 }), /inflates past 1000 bytes/);
  // Bytes that are not UTF-8 are refused, not read as replacement characters.
  const bytes = new Uint8Array(await new Response(new Blob([new Uint8Array([0xff, 0xfe])]).stream().pipeThrough(new CompressionStream('deflate-raw'))).arrayBuffer());
  await assert.rejects(inflateSetupText(Buffer.from(bytes).toString('base64url')), TypeError);
});

test('setup-params: the embed\'s link to the calculator holds a long setup compressed (z=), a short one as s=', async () => {
  const short = { model: { preset: 'gpt2' }, training: { batchSize: 2 } };
  assert.equal(await compactCalculatorHash(short, { units: 'GB' }), calculatorHash(short, { units: 'GB' }));
  const layers = Array.from({ length: 300 }, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 }));
  const long = { model: { kind: 'layers', loss: 'mse', layers }, training: { batchSize: 4, sequenceLength: 1 } };
  assert.ok(toBase64Url(JSON.stringify(long)).length > LONG_SETUP_CHARS, 'past the threshold as s=');
  const hash = await compactCalculatorHash(long, { units: 'GB' });
  const params = new URLSearchParams(hash.slice(1));
  assert.deepEqual([...params.keys()], ['z', 'units']);
  assert.equal(params.get('units'), 'GB');
  assert.deepEqual(JSON.parse(await inflateSetupText(params.get('z'))), long, 'read back exactly');
  assert.ok(hash.length * 10 < calculatorHash(long).length, `${hash.length} against ${calculatorHash(long).length} characters`);
});
