// The built gpumem_core.cjs itself: that it loads the way the page loads it (a classic script
// that defines GpumemCore), suits a strict Content-Security-Policy, and keeps its memory flat
// over many calls.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';
import { fileURLToPath } from 'node:url';
import { loadGpumem } from '../../wasm/gpumem.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const factory = createRequire(import.meta.url)(wasmJs);
const glue = readFileSync(wasmJs, 'utf8');
// The raw module returns each envelope as a view of its UTF-8 bytes (wasm/bindings.cpp, Out).
const text = (view) => {
  assert.ok(ArrayBuffer.isView(view), 'an envelope comes back as a byte view');
  return new TextDecoder().decode(view);
};

test('the glue suits a strict CSP: no eval, no new Function, the wasm inlined', () => {
  assert.doesNotMatch(glue, /new Function\b/);
  assert.doesNotMatch(glue, /\beval\(/);
  assert.match(glue, /data:application\/octet-stream;base64,/);
  assert.doesNotMatch(glue, /\.wasm["']/, 'no separate .wasm file is referenced');
});

test('as a classic script in a browser-like global, it defines GpumemCore and works', async () => {
  // What a <script> gives it: a window, fetch (for its own data: URI), no module system.
  const sandbox = { console, fetch: globalThis.fetch, setTimeout, clearTimeout };
  sandbox.window = sandbox;
  sandbox.self = sandbox;
  sandbox.globalThis = sandbox;
  vm.createContext(sandbox);
  vm.runInContext(glue, sandbox, { filename: 'gpumem_core.cjs' });
  assert.equal(typeof sandbox.GpumemCore, 'function');
  const core = await sandbox.GpumemCore();
  const options = JSON.parse(text(core.optionsJson()));
  assert.equal(options.version, core.version());
  const envelope = JSON.parse(text(core.estimateJson('{"model":{"kind":"parameterCount","parameterCount":1500000000},"training":{"precision":"fp16Mixed","optimizer":"adam"}}', 'none')));
  assert.equal(envelope.ok, true);
  assert.equal(envelope.estimate.modelStates.totalBytes, 24e9);
});

test('loadGpumem: the global factory by default, one module per factory', async () => {
  const saved = globalThis.GpumemCore;
  try {
    delete globalThis.GpumemCore;
    await assert.rejects(loadGpumem(), (error) => error instanceof Error && /GpumemCore/.test(error.message));
    globalThis.GpumemCore = factory;
    const a = await loadGpumem();
    assert.equal(typeof a.estimate, 'function');
    assert.equal(await loadGpumem({ factory }), a, 'one module per factory');
    assert.equal(await loadGpumem({}), a);
  } finally {
    if (saved === undefined) delete globalThis.GpumemCore;
    else globalThis.GpumemCore = saved;
  }
});

test('a failed load is not cached', async () => {
  let calls = 0;
  const flaky = () => {
    calls++;
    return calls === 1 ? Promise.reject(new Error('no wasm')) : factory();
  };
  await assert.rejects(loadGpumem({ factory: flaky }), /no wasm/);
  await new Promise((resolve) => setTimeout(resolve, 0));
  const gpumem = await loadGpumem({ factory: flaky });
  assert.equal(typeof gpumem.version, 'string');
  assert.equal(calls, 2);
});

// The single-file page's glue carries no wasm (scripts/assemble-web.mjs moves its base64 out):
// a factory of that glue, in a browser-like global of its own.
function glueWithoutWasm() {
  const match = /(wasmBinaryFile\s*=\s*"data:application\/octet-stream;base64,)([A-Za-z0-9+/=]+)(")/.exec(glue);
  assert.ok(match, 'the glue embeds its wasm as base64');
  const sandbox = { console, setTimeout, clearTimeout };
  sandbox.window = sandbox;
  sandbox.self = sandbox;
  sandbox.globalThis = sandbox;
  vm.createContext(sandbox);
  vm.runInContext(glue.replace(match[0], `${match[1]}${match[3]}`), sandbox, { filename: 'gpumem_core.cjs' });
  return { factory: sandbox.GpumemCore, bytes: Buffer.from(match[2], 'base64') };
}

test('loadGpumem({ wasmModule }): a glue without its wasm runs on a module compiled elsewhere', async () => {
  const { factory: bare, bytes } = glueWithoutWasm();
  const gpumem = await loadGpumem({ factory: bare, wasmModule: WebAssembly.compile(bytes) });
  const estimate = gpumem.estimate({ model: { kind: 'parameterCount', parameterCount: 1500000000 }, training: { precision: 'fp16Mixed', optimizer: 'adam' } });
  assert.equal(estimate.modelStates.totalBytes, 24e9);
});

// (A load that waited for ever instead would end at the timeout.)
test('loadGpumem({ wasmModule }): a module that does not compile or instantiate fails the load', { timeout: 30000 }, async () => {
  const { factory: bare } = glueWithoutWasm();
  await assert.rejects(loadGpumem({ factory: bare, wasmModule: WebAssembly.compile(new Uint8Array([0, 97, 115, 109, 9, 9])) }), WebAssembly.CompileError);
  // A valid module that is not the glue's: its imports do not match.
  const other = await WebAssembly.compile(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 4, 1, 96, 0, 0, 2, 7, 1, 1, 120, 1, 121, 0, 0]));
  await assert.rejects(loadGpumem({ factory: glueWithoutWasm().factory, wasmModule: other }), (error) => error instanceof Error);
});

test('memory stays flat over many calls, good and bad', async () => {
  // A fresh instance, so other tests' allocations do not blur the figure. The text going in is
  // large on purpose (1 MB, cheap to reject): leaking it would outgrow the 16 MB heap within
  // these rounds. The layer list gives a long estimate coming out (about 100 KB).
  const core = await factory();
  const layers = [{ type: 'linear', inFeatures: 64, outFeatures: 64, bias: true }];
  for (let i = 0; i < 20; i++) layers.push({ type: 'relu' }, { type: 'linear', inFeatures: 64, outFeatures: 64, bias: true });
  const deep = JSON.stringify({ model: { kind: 'layers', layers, loss: 'mse' }, training: { sequenceLength: 1 } });
  const big = JSON.parse(text(core.estimateJson(deep, 'labelled')));
  assert.equal(big.ok, true);
  assert.ok(JSON.stringify(big).length > 100000);
  const inputs = [deep, '{"training":{"batchSize":-1}}', '{"traning":{}}', '['.repeat(1 << 20)];
  const round = () => {
    for (const text of inputs) {
      core.estimateJson(text, 'labelled');
      core.validateJson(text);
    }
    core.optionsJson();
  };
  for (let i = 0; i < 5; i++) round();
  const before = core.HEAP8.buffer.byteLength;
  for (let i = 0; i < 30; i++) round();
  assert.equal(core.HEAP8.buffer.byteLength, before, 'the wasm memory did not grow');
});
