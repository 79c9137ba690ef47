// Setups written as short named parameters, shared by the page (?embed=1&preset=gpt2&…, and
// its #s=…&gpu=…&units=…&compare=… state) and the <gpumem-calculator> element's attributes.
//
// Only the shape of a setup is assembled here; the core validates it and computes every number.
// Kept free of page globals so the page and the embed bundle both use it.

// Attribute / URL-parameter names, in the order they are applied (later ones override earlier
// ones: `setup` is the base, `preset` and `parameter-count` replace its model, the training and
// GPU parameters override its fields).
export const SETUP_PARAMS = [
  'setup', 'preset', 'parameter-count', 'batch-size', 'sequence-length', 'precision', 'optimizer',
  'optimizer-implementation', 'attention', 'checkpointing', 'gpu', 'gpu-memory-gib',
  'data-parallel', 'zero-stage', 'fsdp', 'offload', 'tensor-parallel', 'gradient-accumulation-steps',
  'sequence-parallel', 'pipeline-parallel', 'pipeline-schedule', 'virtual-stages', 'pipeline-stage',
  'pipeline-first-stage-layers', 'pipeline-last-stage-layers', 'context-parallel', 'expert-parallel',
  'expert-tensor-parallel',
];

// Many GPUs (docs/parallel.md): the parallel section's fields by the names of issue 12.
const PARALLEL_PARAMS = {
  'data-parallel': ['dataParallel', 'number'],
  'zero-stage': ['zeroStage', 'number'],
  fsdp: ['fsdp', 'text'],
  offload: ['offload', 'text'],
  'tensor-parallel': ['tensorParallel', 'number'],
  'gradient-accumulation-steps': ['gradientAccumulationSteps', 'number'],
  'sequence-parallel': ['sequenceParallel', 'bool'],
  'pipeline-parallel': ['pipelineParallel', 'number'],
  'pipeline-schedule': ['pipelineSchedule', 'text'],
  'virtual-stages': ['virtualStages', 'number'],
  'pipeline-stage': ['pipelineStage', 'number'],
  'pipeline-first-stage-layers': ['pipelineFirstStageLayers', 'number'],
  'pipeline-last-stage-layers': ['pipelineLastStageLayers', 'number'],
  'context-parallel': ['contextParallel', 'number'],
  'expert-parallel': ['expertParallel', 'number'],
  'expert-tensor-parallel': ['expertTensorParallel', 'number'],
};

// "true" / "1" / "yes" and "false" / "0" / "no"; any other text is passed on as it is, so the
// core's error names the field.
function paramBool(text) {
  const t = String(text).trim().toLowerCase();
  if (['true', '1', 'yes', 'on'].includes(t)) return true;
  if (['false', '0', 'no', 'off'].includes(t)) return false;
  return String(text).trim();
}

const TRAINING_PARAMS = {
  'batch-size': ['batchSize', 'number'],
  'sequence-length': ['sequenceLength', 'number'],
  precision: ['precision', 'text'],
  optimizer: ['optimizer', 'text'],
  'optimizer-implementation': ['optimizerImplementation', 'text'],
  attention: ['attention', 'text'],
  checkpointing: ['checkpointing', 'text'],
};

function isPlainObject(x) {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

// A number when the text is one ("4", "1.5e9", "7B"); otherwise the text itself, so the core's
// error names the field instead of the page guessing.
export function paramNumber(text) {
  const t = String(text).trim().replace(/[\s,_']/g, '');
  const m = /^([+-]?(?:\d+\.?\d*|\.\d+))(?:e([+-]?\d+))?([kmbgt])?$/i.exec(t);
  if (!m) return String(text).trim();
  const power = { k: 3, m: 6, b: 9, g: 9, t: 12 }[(m[3] || '').toLowerCase()] || 0;
  return Number(`${m[1]}e${Number(m[2] || 0) + power}`);
}

// UTF-8 text ↔ base64url, as the page's #s= parameter holds its setup.
// Both go through btoa / atob's "binary strings" in chunks: a character per byte, built and read
// without a callback per byte (a 5,000-layer setup is a few hundred kilobytes).
export function toBase64Url(text) {
  return bytesToBase64Url(new TextEncoder().encode(text));
}

export function fromBase64Url(text) {
  return new TextDecoder('utf-8', { fatal: true }).decode(base64UrlToBytes(text));
}

function bytesToBase64Url(bytes) {
  const chunks = [];
  for (let i = 0; i < bytes.length; i += 0x8000) chunks.push(String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000)));
  return btoa(chunks.join('')).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function base64UrlToBytes(text) {
  let b64 = String(text).replace(/-/g, '+').replace(/_/g, '/');
  while (b64.length % 4) b64 += '=';
  const binary = atob(b64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

// A long setup's link parameter (#z=): its JSON compressed (deflate-raw, CompressionStream),
// in base64url. A 4,000-layer list is 267 KB as #s= and 1 KB as #z=; a long address is slow to
// open in itself (docs/budget.md, "The page's time to an answer"), and chat apps cut it.
export async function deflateSetupText(text) {
  const stream = new Blob([new TextEncoder().encode(text)]).stream().pipeThrough(new CompressionStream('deflate-raw'));
  return bytesToBase64Url(new Uint8Array(await new Response(stream).arrayBuffer()));
}

// The JSON text a #z= parameter holds; rejects when it is not base64url of deflate-raw data, or
// when it inflates past maxBytes (a link is a few kilobytes; a hostile one could be a bomb).
export async function inflateSetupText(value, { maxBytes = 16 * 1024 * 1024 } = {}) {
  const stream = new Blob([base64UrlToBytes(value)]).stream().pipeThrough(new DecompressionStream('deflate-raw'));
  const reader = stream.getReader();
  const parts = [];
  let total = 0;
  for (;;) {
    const { done, value: chunk } = await reader.read();
    if (done) break;
    total += chunk.length;
    if (total > maxBytes) {
      await reader.cancel();
      throw new Error(`the link's setup inflates past ${maxBytes} bytes`);
    }
    parts.push(chunk);
  }
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    bytes.set(part, at);
    at += part.length;
  }
  return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
}

// A setup held in a parameter: base64url of its JSON, or the JSON itself (hand-written links,
// the element's `setup` attribute). Throws when it cannot be read.
export function decodeSetupParam(value) {
  const text = String(value).trim();
  return JSON.parse(text.startsWith('{') ? text : fromBase64Url(text));
}

export function encodeSetupParam(setup) {
  return toBase64Url(JSON.stringify(setup));
}

// The partial setup that named parameters describe.
//   get(name) → the parameter's text, or null/undefined when absent.
// Returns { setup, problems, given } — `given` is false when no parameter was present; problems
// are { field, message } for a `setup` the page cannot read as JSON; everything else (an
// unknown preset or GPU id, a bad number) is left to the core's validation, which names the field.
export function setupFromParams(get) {
  const value = (name) => {
    const v = get(name);
    return v === null || v === undefined ? null : String(v);
  };
  const problems = [];
  let given = false;
  let setup = {};

  const text = value('setup');
  if (text !== null && text.trim() !== '') {
    given = true;
    try {
      const parsed = decodeSetupParam(text);
      if (isPlainObject(parsed)) setup = parsed;
      else problems.push({ field: 'setup', message: 'setup must hold a JSON object (a gpumem setup, docs/schema.md).' });
    } catch (error) {
      problems.push({ field: 'setup', message: `setup is not JSON: ${error.message}` });
    }
  }
  setup = JSON.parse(JSON.stringify(setup));

  const preset = value('preset');
  if (preset !== null && preset.trim() !== '') {
    given = true;
    // The core sets the transformer kind and the preset's architecture from the id.
    setup.model = { preset: preset.trim() };
  }
  const count = value('parameter-count');
  if (count !== null && count.trim() !== '') {
    given = true;
    setup.model = { kind: 'parameterCount', parameterCount: paramNumber(count) };
  }
  for (const [name, [field, kind]] of Object.entries(TRAINING_PARAMS)) {
    const v = value(name);
    if (v === null || v.trim() === '') continue;
    given = true;
    setup.training = isPlainObject(setup.training) ? setup.training : {};
    setup.training[field] = kind === 'number' ? paramNumber(v) : v.trim();
  }
  for (const [name, [field, kind]] of Object.entries(PARALLEL_PARAMS)) {
    const v = value(name);
    if (v === null || v.trim() === '') continue;
    given = true;
    setup.parallel = isPlainObject(setup.parallel) ? setup.parallel : {};
    setup.parallel[field] = kind === 'number' ? paramNumber(v) : kind === 'bool' ? paramBool(v) : v.trim();
  }
  // A GPU of the core's list sets the capacity (gpu.id); a size sets it directly and drops the id.
  const id = value('gpu');
  if (id !== null && id.trim() !== '') {
    given = true;
    setup.gpu = { id: id.trim() };
  }
  const memory = value('gpu-memory-gib');
  if (memory !== null && memory.trim() !== '') {
    given = true;
    setup.gpu = { memoryGiB: paramNumber(memory) };
  }
  return { setup, problems, given };
}

// Past this many characters of base64url JSON a setup goes in an address compressed (z=): the
// page's own address (web/link.js) and the embed's link to the calculator.
export const LONG_SETUP_CHARS = 2000;

// The calculator's own address for a setup: "#s=…", plus units=GB for decimal units.
export function calculatorHash(setup, { units = '' } = {}) {
  const params = new URLSearchParams();
  params.set('s', encodeSetupParam(setup));
  if (units === 'GB') params.set('units', 'GB');
  return `#${params.toString()}`;
}

// The same address with a long setup compressed ("#z=…", as the page writes its own; the
// calculator reads both): a promise, since CompressionStream is asynchronous. A short setup, or
// a browser without CompressionStream, gets calculatorHash's "#s=…".
export async function compactCalculatorHash(setup, { units = '' } = {}) {
  const text = JSON.stringify(setup);
  if (toBase64Url(text).length <= LONG_SETUP_CHARS || typeof CompressionStream !== 'function') {
    return calculatorHash(setup, { units });
  }
  const params = new URLSearchParams();
  params.set('z', await deflateSetupText(text));
  if (units === 'GB') params.set('units', 'GB');
  return `#${params.toString()}`;
}
