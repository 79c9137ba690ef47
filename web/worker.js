// gpumem's Web Worker: runs the core's long calls (the views, the solver) away from the page's
// thread, so typing never waits for them. A classic worker script, not a module: served, it
// loads the wasm glue with importScripts; in the single-file page, scripts/assemble-web.mjs
// and web/engine.js build it as a blob: whose text starts with the glue itself (without the
// wasm: the page hands over its compiled module), so no file and no network is needed.
//
// Protocol: the page posts {type: 'init', module, bytes} first (where the wasm comes from; see
// startCore), then {id, kind, text} (kind: solve | heatMap | gpuMatrix | curves | fewestGpus |
// layouts; text: the request web/engine.js built with requestText()); the worker answers
// {type: 'result', id, kind, envelope, ms} with the core's envelope text as it is, or
// {type: 'ready'} once, or {type: 'failed', message} when the module cannot start. The core
// never throws for bad input.
/* global GpumemCore, importScripts */
'use strict';

// The same table as wasm/gpumem.js's CALLS (kind → bound function of wasm/bindings.cpp).
const WORKER_CALLS = { solve: 'solveJson', heatMap: 'heatMapJson', gpuMatrix: 'gpuMatrixJson', curves: 'curvesJson', fewestGpus: 'fewestGpusJson', layouts: 'layoutsJson' };

if (typeof GpumemCore !== 'function') importScripts('gpumem_core.cjs');

let workerCore = null;
// The core hands each envelope back as a view of its UTF-8 bytes in wasm memory, valid until its
// next call (wasm/bindings.cpp, Out): decoded at once, so the text is what is posted.
const workerUtf8 = new TextDecoder();
let workerReady = null;

// The page's first message, {type: 'init', module, bytes}, says where the wasm comes from: the
// page's compiled module (the single-file page, whose glue carries no wasm), its bytes, or (both
// null) the glue's own.
function startCore({ module = null, bytes = null } = {}) {
  const compiled = module ?? (bytes ? WebAssembly.compile(bytes) : null);
  const options = compiled ? {
    instantiateWasm(imports, receive) {
      Promise.resolve(compiled)
        .then((m) => WebAssembly.instantiate(m, imports))
        .then((instance) => receive(instance), (error) => postMessage({ type: 'failed', message: String(error?.message ?? error) }));
      return {};
    },
  } : {};
  workerReady = GpumemCore(options).then(
    (core) => {
      workerCore = core;
      postMessage({ type: 'ready' });
    },
    (error) => postMessage({ type: 'failed', message: String(error?.message ?? error) }),
  );
}

function internalEnvelope(message) {
  return JSON.stringify({ ok: false, errors: [{ code: 'internal', field: '', message }] });
}

self.onmessage = async (event) => {
  if (event.data?.type === 'init') {
    if (!workerReady) startCore(event.data);
    return;
  }
  const { id, kind, text } = event.data ?? {};
  if (!workerReady) startCore();
  await workerReady;
  const started = performance.now();
  let envelope;
  if (!workerCore) envelope = internalEnvelope('The estimator did not start in the worker.');
  else if (!WORKER_CALLS[kind]) envelope = internalEnvelope(`Unknown call ${kind}.`);
  else {
    try {
      envelope = workerUtf8.decode(workerCore[WORKER_CALLS[kind]](String(text)));
    } catch (error) {
      envelope = internalEnvelope(`The estimator failed: ${error?.message ?? error}`);
    }
  }
  postMessage({ type: 'result', id, kind, envelope, ms: performance.now() - started });
};
