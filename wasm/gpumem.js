// gpumem's JS API: the one module the page imports. It turns the core's JSON envelopes into
// objects and GpumemErrors; every number comes from the wasm core, none is computed here.
//
// Kept free of host-specific globals so the same file runs in a browser and under node; the
// single-file page's bundler strips import lines and the `export ` keyword, so exports stay
// on declarations and imports on one line each.

// A bad setup, with every problem the core found. `code` and `field` are the first error's,
// so a caller can point at one control; `errors` keeps them all.
export class GpumemError extends Error {
  constructor(errors, options) {
    const list = Array.isArray(errors) && errors.length > 0
      ? errors
      : [{ code: 'internal', field: '', message: 'The estimator reported an error without details.' }];
    const first = list[0];
    const where = first.field ? `${first.field}: ` : '';
    const more = list.length > 1 ? ` (and ${list.length - 1} more)` : '';
    super(`${where}${first.message}${more}`, options);
    this.name = 'GpumemError';
    this.code = first.code;
    this.field = first.field;
    this.errors = list;
  }
}

// The core hands each envelope back as a view of its UTF-8 bytes in wasm memory, valid until its
// next call (wasm/bindings.cpp, Out): decoded here at once. version() stays a plain string.
const utf8 = new TextDecoder();
function envelopeText(result) {
  return ArrayBuffer.isView(result) ? utf8.decode(result) : result;
}

// One promise per factory: instantiating the module again would only duplicate its memory.
const loaded = new Map();

// wasmModule (optional): the compiled WebAssembly.Module, or a promise of it, for a glue whose
// wasm was compiled elsewhere (the single-file page's, web/wasm-preload.js); Emscripten's
// instantiateWasm hook instantiates it instead of the glue's own bytes.
export async function loadGpumem({ factory, wasmModule } = {}) {
  const glueFactory = factory ?? globalThis.GpumemCore;
  if (typeof glueFactory !== 'function') {
    throw new Error('gpumem: the wasm module is not loaded (no GpumemCore factory); load gpumem_core.cjs first or pass { factory }.');
  }
  const make = wasmModule ? withCompiledModule(glueFactory, wasmModule) : glueFactory;
  let promise = loaded.get(glueFactory);
  if (!promise) {
    promise = Promise.resolve(make()).then((core) => wrapModule(core, make));
    // A failed load must not stay cached, or a retry could never succeed.
    promise.catch(() => loaded.delete(glueFactory));
    loaded.set(glueFactory, promise);
  }
  return promise;
}

// A factory that instantiates an already compiled module: the glue calls instantiateWasm and
// waits for receive(instance). A failure to compile or instantiate rejects the factory's promise
// (the glue's own would wait for ever).
function withCompiledModule(glueFactory, wasmModule) {
  return () => new Promise((resolve, reject) => {
    const ready = glueFactory({
      instantiateWasm(imports, receive) {
        Promise.resolve(wasmModule)
          .then((module) => WebAssembly.instantiate(module, imports))
          .then((instance) => receive(instance), reject);
        return {};
      },
    });
    Promise.resolve(ready).then(resolve, reject);
  });
}

// The module's memory ceiling (-sMAXIMUM_MEMORY in wasm/CMakeLists.txt), bytes.
export const MAXIMUM_MEMORY_BYTES = 2 ** 30;

function wrapModule(firstCore, make) {
  let core = firstCore;
  let options = null;
  // After an abort (out of memory at the ceiling, or a defect) an Emscripten module is unusable:
  // a fresh instance replaces it. Until it is ready, calls answer "restarting"; ready() waits.
  let reloading = Promise.resolve();

  // Runs one call on the core, turning a throw into a GpumemError and a reload.
  function callCore(call, requestText) {
    if (!core) throw new GpumemError([{ code: 'internal', field: '', message: 'The estimator is restarting after a failure; try again in a moment.' }]);
    const current = core;
    try {
      return envelopeText(call(current));
    } catch (error) {
      const heapBytes = current.HEAP8?.length ?? 0;
      core = null;
      reloading = Promise.resolve(make()).then((fresh) => { core = fresh; }, () => {});
      throw new GpumemError([abortError(error, heapBytes, requestText, options?.presets)], { cause: error });
    }
  }
  function viewCall(call, key, text) {
    return resultOfEnvelope(callCore(call, text), key);
  }

  function parallelImport(call, setup) {
    const base = setup === undefined ? '' : setupText(setup);
    const envelope = parseEnvelope(callCore((c) => call(c, base), base));
    if (!envelope.ok) throw new GpumemError(envelope.errors);
    const { ok, ...result } = envelope;
    return result;
  }

  function getOptions() {
    if (!options) options = deepFreeze(parseEnvelope(callCore((c) => c.optionsJson())));
    return options;
  }

  return {
    version: String(core.version()),
    options: getOptions,
    defaultSetup() {
      return JSON.parse(JSON.stringify(getOptions().defaultSetup));
    },
    // options.timeline: 'none' (default: the figures, no timeline), 'points' (running totals
    // of up to 2,000 events, thinned so no peak is lost) or 'labelled' (points with labels).
    estimate(setup, { timeline = 'none' } = {}) {
      const text = setupText(setup);
      const mode = ['none', 'points', 'labelled'].includes(timeline) ? timeline : 'none';
      const envelope = parseEnvelope(callCore((c) => c.estimateJson(text, mode), text));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      return envelope.estimate;
    },
    // A Hugging Face config.json (text) → { setup, modelType, ignoredFields, notes }.
    importConfig(text) {
      const envelope = parseEnvelope(callCore((c) => c.importConfigJson(String(text))));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      const { ok, ...result } = envelope;
      return result;
    },
    // A safetensors header (the JSON after its 8-byte length) or model.safetensors.index.json;
    // with a transformer setup, also its count against the architecture's.
    importSafetensors(text, setup) {
      const compareWith = setup === undefined ? '' : setupText(setup);
      const envelope = parseEnvelope(callCore((c) => c.importSafetensorsJson(String(text), compareWith), compareWith));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      const { ok, ...result } = envelope;
      return result;
    },
    // A Python script that measures `setup` on a GPU (PyTorch, transformers; docs/device.md,
    // "Measure it on your GPU") → { fileName, modelType, script }; what it cannot run throws,
    // naming the field.
    measureScript(setup) {
      const text = setupText(setup);
      const envelope = parseEnvelope(callCore((c) => c.measureScriptJson(text), text));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      const { ok, ...result } = envelope;
      return result;
    },
    // The largest micro-batch and sequence that fit, and the changes that would make it fit.
    solve(setup) {
      const text = setupText(setup);
      const envelope = parseEnvelope(callCore((c) => c.solveJson(text), text));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      return envelope.solve;
    },
    // Many GPUs (docs/parallel.md): a DeepSpeed config JSON (text) or Megatron-LM's arguments (a
    // command line) read onto `setup` (absent: the defaults; its model gives h for DeepSpeed's
    // "auto" values) → { setup, ignoredFields, notes }.
    importDeepSpeed(text, setup) {
      return parallelImport((c, base) => c.importDeepSpeedJson(String(text), base), setup);
    },
    importMegatron(commandLine, setup) {
      return parallelImport((c, base) => c.importMegatronJson(String(commandLine), base), setup);
    },
    // accelerate's config YAML (FSDP) onto `setup` → { setup, ignoredFields, notes }.
    importAccelerate(text, setup) {
      return parallelImport((c, base) => c.importAccelerateJson(String(text), base), setup);
    },
    // The layouts of `options.gpus` GPUs of the setup's type that fit, ranked → { gpus, rows,
    // candidates, refused, dominated, estimates, notFitting, notEstimated } (docs/schema.md,
    // LayoutsJson). Long: the page runs it in a worker (kind 'layouts').
    layouts(setup, options) {
      const text = layoutsRequest(setup, options);
      return resultOfEnvelope(callCore((c) => c.layoutsJson(text), text), 'layouts');
    },
    // The fewest GPUs of the setup's type that train it → { found, gpus, layout,
    // communicationParameters, offload, peakDeviceBytes, estimatesRun, setup }. Long: the page
    // runs it in a worker (kind 'fewestGpus').
    fewestGpus(setup) {
      const text = setupText(setup);
      return resultOfEnvelope(callCore((c) => c.fewestGpusJson(text), text), 'fewestGpus');
    },
    // A PyTorch memory snapshot (the bytes of a torch.cuda.memory._dump_snapshot() pickle, as a
    // Uint8Array or ArrayBuffer) measured: { measured: {peakAllocatedBytes, peakReservedBytes,
    // timeline, segments, notes, …}, estimate: {peakBytes, timeline} | null, comparison | null }.
    // Without a setup, only the measurement. The pickle is read as data; nothing in it runs.
    compareSnapshot(bytes, setup) {
      const data = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
      if (!(data instanceof Uint8Array)) {
        throw new GpumemError([{ code: 'invalidField', field: 'snapshot', message: 'The snapshot must be given as bytes (a Uint8Array or ArrayBuffer).' }]);
      }
      const compareWith = setup === undefined ? '' : setupText(setup);
      const envelope = parseEnvelope(callCore(() => core.compareSnapshotJson(data, compareWith)));
      if (!envelope.ok) throw new GpumemError(envelope.errors);
      const { ok, ...result } = envelope;
      return result;
    },
    // Views of the design space around a setup (docs/schema.md, "Views"): the heat map of the
    // peak over batch × sequence, the GPU × settings matrix, the peak-vs-batch/sequence curves.
    // `options`: { axisValues, curvePoints }; absent ones take the core's defaults.
    heatMap(setup, options) {
      const request = viewRequest(setup, options);
      return viewCall((c) => c.heatMapJson(request), 'heatMap', request);
    },
    gpuMatrix(setup, options) {
      const request = viewRequest(setup, options);
      return viewCall((c) => c.gpuMatrixJson(request), 'gpuMatrix', request);
    },
    curves(setup, options) {
      const request = viewRequest(setup, options);
      return viewCall((c) => c.curvesJson(request), 'curves', request);
    },
    // One call as envelope text, for text built by requestText(): what a Web Worker runs, and
    // the page's fallback when no worker can start.
    envelope(kind, text) {
      const call = CALLS[kind];
      if (!call) throw new GpumemError([{ code: 'internal', field: '', message: `Unknown call ${kind}.` }]);
      return callCore((c) => c[call](String(text)), String(text));
    },
    // Resolves when the module is usable again after a failure (at once otherwise).
    ready() {
      return reloading;
    },
    validate(setup) {
      try {
        const text = setupText(setup);
        const envelope = parseEnvelope(callCore((c) => c.validateJson(text), text));
        return envelope.ok ? { ok: true, setup: envelope.setup } : { ok: false, errors: envelope.errors };
      } catch (error) {
        if (error instanceof GpumemError) return { ok: false, errors: error.errors };
        return { ok: false, errors: [internalError(error)] };
      }
    },
  };
}

// An envelope's text (from the core, or from a worker that ran the core) → its result object,
// or a GpumemError with the core's errors.
export function resultOfEnvelope(text, key) {
  const envelope = parseEnvelope(text);
  if (!envelope.ok) throw new GpumemError(envelope.errors);
  return envelope[key];
}

// The parts of a split view (the results of heatMap or curves asked with part {index, count}
// for every index, in any order) → the whole view's result, as one call without a part returns
// it: each cell or curve from the part that computed it (the others are null there), the
// estimates summed (the work the parts did: each part of the curves estimates the current setup
// for its `current`, one more than a whole call). Throws a GpumemError when the parts are not
// one whole (a part missing, twice, or of another split). Nothing is computed here: every
// number is the core's.
export function mergeViewParts(kind, parts) {
  const fail = (message) => new GpumemError([{ code: 'internal', field: '', message }]);
  if (kind !== 'heatMap' && kind !== 'curves') throw fail(`${kind} is not split into parts.`);
  if (!Array.isArray(parts) || parts.length === 0) throw fail('No parts to merge.');
  const count = parts[0]?.part?.count ?? 1;
  const seen = new Set(parts.map((p) => p?.part?.index ?? 0));
  if (parts.length !== count || seen.size !== count || parts.some((p) => (p?.part?.count ?? 1) !== count)) {
    throw fail(`Expected the ${count} parts of one ${kind}, got ${parts.length}.`);
  }
  const { part, ...whole } = JSON.parse(JSON.stringify(parts[0]));
  whole.estimates = parts.reduce((sum, p) => sum + (p.estimates ?? 0), 0);
  if (kind === 'heatMap') {
    whole.cells = whole.cells.map((row, i) => row.map((cell, j) => parts.map((p) => p.cells?.[i]?.[j]).find((c) => c != null) ?? null));
  } else {
    for (const key of ['batch', 'sequence']) whole[key] = parts.map((p) => p[key]).find((c) => c != null) ?? null;
  }
  return whole;
}

// The core's long calls by kind, and the bound function each one uses (wasm/bindings.cpp).
export const CALLS = Object.freeze({ solve: 'solveJson', heatMap: 'heatMapJson', gpuMatrix: 'gpuMatrixJson', curves: 'curvesJson', fewestGpus: 'fewestGpusJson', layouts: 'layoutsJson' });

// The text argument of one long call: the setup for solve and fewestGpus, a views request for
// the others.
export function requestText(kind, setup, options) {
  if (kind === 'layouts') return layoutsRequest(setup, options);
  return kind === 'solve' || kind === 'fewestGpus' ? setupText(setup) : viewRequest(setup, options);
}

// {"setup":{…},"gpus":n,"allowOffload":b,"maxEstimates":n}: absent options take the core's
// defaults; values go as they are, so the core names a bad one ("gpus").
function layoutsRequest(setup, options = {}) {
  const parts = [`"setup":${setup === undefined ? '{}' : setupText(setup)}`];
  for (const key of ['gpus', 'allowOffload', 'maxEstimates']) {
    if (options[key] !== undefined) parts.push(`${JSON.stringify(key)}:${JSON.stringify(options[key]) ?? 'null'}`);
  }
  return `{${parts.join(',')}}`;
}

// One request object: {"setup":{…},"axisValues":n,"curvePoints":n,"part":{"index","count"}}. A
// setup given as text (an imported file) is embedded as it is, so the core reports its parse
// errors as for an estimate.
function viewRequest(setup, options = {}) {
  const parts = [`"setup":${setup === undefined ? '{}' : setupText(setup)}`];
  for (const key of ['axisValues', 'curvePoints', 'part']) {
    if (options[key] !== undefined) parts.push(`${JSON.stringify(key)}:${JSON.stringify(options[key])}`);
  }
  return `{${parts.join(',')}}`;
}

// A setup may arrive as an object (the page's state) or as text (an imported file, the URL).
// An absent setup means the defaults, as an empty document does.
function setupText(setup) {
  if (typeof setup === 'string') return setup;
  if (setup === undefined) return '{}';
  let text;
  try {
    text = JSON.stringify(setup);
  } catch (error) {
    // Cycles and BigInts cannot be written as JSON; report them as the core reports bad text.
    throw new GpumemError([{ code: 'malformedJson', field: '', message: `The setup cannot be written as JSON: ${error.message}` }], { cause: error });
  }
  // Functions and symbols stringify to undefined; let the core reject the resulting document.
  return text === undefined ? 'null' : text;
}

// The core never throws for bad input; anything thrown by it is an abort: running out of
// memory at the module's ceiling (validation's work budget should make that unreachable), or a
// defect. At the ceiling the error is tooLarge on the field most likely to have grown the work,
// from the request's own text (a guess, said as one: the dead module cannot be asked).
function abortError(error, heapBytes, requestText, presets) {
  if (heapBytes < 0.9 * MAXIMUM_MEMORY_BYTES) return internalError(error);
  return {
    code: 'tooLarge',
    field: likelyField(requestText, presets),
    message: `The estimator ran out of memory (its ceiling is ${MAXIMUM_MEMORY_BYTES / 2 ** 30} GiB) and was restarted. ` +
      'This setup is probably too large to simulate here: use fewer layers, experts or list entries.',
  };
}

// The field that most likely drove an estimate's work, as PredictEvents (setup.hpp) names it.
function likelyField(text, presets = []) {
  let doc;
  try {
    doc = JSON.parse(text ?? '');
  } catch {
    return '';
  }
  const model = doc?.setup?.model ?? doc?.model;
  if (!model || typeof model !== 'object') return '';
  if (model.kind === 'layers' || Array.isArray(model.layers)) return 'model.layers';
  if (model.kind === 'parameterCount' || (model.parameterCount !== undefined && !model.architecture && !model.preset)) {
    return 'model.largestMatrices';
  }
  const preset = presets.find((p) => p.id === model.preset);
  const experts = model.architecture?.numExperts ?? preset?.architecture?.numExperts ?? 0;
  return experts > 0 ? 'model.architecture.numExperts' : 'model.architecture.numLayers';
}

function parseEnvelope(text) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new GpumemError([internalError(error)], { cause: error });
  }
}

function internalError(error) {
  const detail = error instanceof Error ? error.message : String(error);
  return { code: 'internal', field: '', message: `The estimator failed: ${detail}` };
}

// The cached options are shared by every caller; freezing turns an accidental edit (say, of an
// example's setup) into an immediate TypeError instead of a silently changed default.
function deepFreeze(value) {
  if (value && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const key of Object.keys(value)) deepFreeze(value[key]);
  }
  return value;
}
