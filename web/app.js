// The gpumem page: a form for a training setup, and the core's estimate drawn beside it.
//
// Every byte count shown comes from the core (through ./gpumem.js); this module only parses
// what a person typed, formats numbers and draws. Enum lists, labels, defaults and examples come
// from options(), so nothing here re-types them. The setup (docs/schema.md) is also the URL
// state and the export/import format.

import { loadGpumem, GpumemError } from './gpumem.js';
import { capacityBar, comparisonBars, timelineChart, formatBytes, formatBytesOther, bytesTitle, formatExactBytes, formatInteger, setByteUnits } from './charts.js';
import { setupFromParams, decodeSetupParam, encodeSetupParam, fromBase64Url } from './setup-params.js';
import { downloadBlob, csvText, standaloneSvg, svgToPngBlob } from './exports.js';
import { createEngine } from './engine.js';
import { renderHeatMap, renderGpuMatrix, renderCurves } from './views.js';
import { wireSnapshot } from './snapshot.js';

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

// Per layer type, the schema fields the editor shows: [field, label, kind]. The schema lists
// which fields belong to which type; options() only names the types.
const LAYER_FIELDS = {
  embedding: [['numEmbeddings', 'Vocabulary (rows)', 'count'], ['embeddingDim', 'Width', 'count']],
  linear: [['inFeatures', 'In features', 'count'], ['outFeatures', 'Out features', 'count'], ['bias', 'Bias', 'bool']],
  dropout: [['p', 'Dropout p', 'number']],
};

// The architecture's fields come from the core (options.architectureFields: key, label, kind,
// hint, the families that read it, and a field it depends on). A field whose value differs from
// the family's default is shown anyway, so no setting the core uses is ever invisible.
function archFields() {
  return state.options.architectureFields ?? [];
}

function fieldShown(field, arch) {
  if (!field.families.includes(arch.family)) return false;
  if (!field.when) return true;
  const other = arch[field.when.field];
  return field.when.value === 'positive' ? Number(other) > 0 : other === field.when.value;
}

const TYPING_DELAY_MS = 150;
// An update (estimate + render) slower than this makes the page wait longer after the last
// keystroke, so typing "4096" runs one estimate, not four. A 32-block model traces ~14k events;
// its estimate takes 40–110 ms in headless Chromium, more on a slow machine.
const SLOW_UPDATE_MS = 150;
const MAX_TYPING_DELAY_MS = 600;
const LARGEST_EVENTS = 8;
// The views wait this long after an estimate before asking the worker, so a burst of changes
// (a select scrolled with the keyboard) runs them once.
const VIEWS_DELAY_MS = 120;
const VIEW_KINDS = ['heatMap', 'curves', 'gpuMatrix'];

const state = {
  api: null,
  options: null,
  quickKind: 'parameterCount',
  layersKind: 'layers',
  archKind: 'transformer',
  examples: [],       // [{id, label, setup}] from options()
  presetBase: '',     // the preset the architecture fields were last filled from
  lastGood: null,     // the last estimate rendered
  lastContext: null,  // {kind, presetId, family} of the setup behind lastGood
  lastHash: '',       // the hash this page wrote, to tell it from one a person pasted
  lastCostMs: 0,      // how long the last estimate and render took
  chartWidth: -1,     // the timeline chart's box width when last drawn
  inputAt: 0,         // when the change being estimated was made (performance.now())
  timer: 0,
  units: 'GiB',       // 'GiB' or 'GB': how byte figures are shown (URL: units=GB)
  gpuId: '',          // the GPU chosen from options.gpus (setup's gpu.id), '' for a custom size
  hashSetup: null,    // the setup last written to the URL
  compare: null,      // {setup, shown, estimate, error}: the pinned setup A (URL: compare=)
  explainAll: false,  // every formula expanded
  embed: false,       // ?embed=1: compact layout without the editor
  solvedFor: '',      // the setup (JSON) the solve panel's results belong to
  engine: null,       // web/engine.js: the core's long calls in Web Workers
  views: {},          // {heatMap, curves, gpuMatrix}: the last results of each view
  viewsFor: '',       // the setup (JSON) the views were asked for
  viewsTimer: 0,
  solving: false,
};

// ---------- number input ----------

// Parses what a person types for a count or a size: "1.5e9", "1,500,000,000", "1.5B", "80".
// Returns NaN when it is not a number; the caller then hands the raw text to the core, whose
// error message names the field.
function parseNumberText(text) {
  const t = String(text).trim().replace(/[\s,_']/g, '');
  const m = /^([+-]?(?:\d+\.?\d*|\.\d+))(?:e([+-]?\d+))?([kmbgt])?$/i.exec(t);
  if (!m) return NaN;
  const suffixPower = { k: 3, m: 6, b: 9, g: 9, t: 12 }[(m[3] || '').toLowerCase()] || 0;
  // Build one decimal literal so that "1.1B" parses to exactly 1100000000.
  return Number(`${m[1]}e${Number(m[2] || 0) + suffixPower}`);
}

function numberValue(input) {
  const raw = input.value.trim();
  const n = parseNumberText(raw);
  return Number.isFinite(n) ? n : raw;
}

// "1024×50257, 512x1024" → [{rows, cols}]; an error message when an entry is not rows×cols.
function parseMatrices(text) {
  const entries = text.split(/[,;\n]+/).map((s) => s.trim()).filter(Boolean);
  const matrices = [];
  for (const entry of entries) {
    const parts = entry.split(/\s*[×xX*]\s*/);
    const rows = parts.length === 2 ? parseNumberText(parts[0]) : NaN;
    const cols = parts.length === 2 ? parseNumberText(parts[1]) : NaN;
    if (!Number.isFinite(rows) || !Number.isFinite(cols)) {
      return { error: `"${entry}" is not rows×cols; write each matrix like 1024×50257, separated by commas` };
    }
    matrices.push({ rows, cols });
  }
  return { matrices };
}

function displayNumber(value) {
  if (value === undefined || value === null) return '';
  return String(value);
}

// ---------- setup <-> form ----------

function isPlainObject(x) {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

// Overlays a partial setup on the defaults (arrays replace), as the core does for absent fields.
function mergeSetup(base, over) {
  if (!isPlainObject(over)) return base;
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) out[k] = isPlainObject(v) && isPlainObject(base?.[k]) ? mergeSetup(base[k], v) : v;
  return out;
}

function fillSelect(select, items, placeholder) {
  select.replaceChildren();
  if (placeholder) select.append(new Option(placeholder, ''));
  for (const item of items) select.append(new Option(item.label, item.id));
}

function setSelectValue(select, value) {
  for (const stale of $$('option[data-unknown]', select)) stale.remove();
  select.value = value ?? '';
  // An id this page does not list stays visible, so the core can name it in its error.
  if (select.value !== String(value ?? '') && value !== undefined) {
    const opt = new Option(`${value} (unknown)`, String(value));
    opt.dataset.unknown = 'true';
    select.append(opt);
    select.value = String(value);
  }
}

function currentKind() {
  return $('input[name=modelKind]:checked')?.value ?? state.quickKind;
}

function showKindPanels() {
  const kind = currentKind();
  const layers = kind === state.layersKind;
  const arch = Boolean(state.archKind) && kind === state.archKind;
  $('#quick-panel').hidden = layers || arch;
  $('#layers-panel').hidden = !layers;
  $('#arch-panel').hidden = !arch;
  showTrainingOptions();
}

// Attention and checkpointing only change a traced transformer; k only matters for every-k-th.
function showTrainingOptions() {
  $('#transformer-training').hidden = !state.archKind || currentKind() !== state.archKind;
  $('#checkpointInterval-field').hidden = $('#checkpointing').value !== 'everyKthBlock';
}

// fillForm's presetId is the preset the setup named: a validated setup no longer names it (the
// core has merged it into the architecture).
function fillForm(setup, presetId) {
  const model = setup.model ?? {};
  const training = setup.training ?? {};
  const gpu = setup.gpu ?? {};
  for (const radio of $$('input[name=modelKind]')) radio.checked = radio.value === model.kind;
  if (!$('input[name=modelKind]:checked')) $$('input[name=modelKind]')[0].checked = true;
  showKindPanels();
  $('#parameterCount').value = displayNumber(model.parameterCount);
  $('#largestMatrices').value = Array.isArray(model.largestMatrices)
    ? model.largestMatrices.map((m) => `${m?.rows}×${m?.cols}`).join(', ') : '';
  renderLayers(Array.isArray(model.layers) ? model.layers : []);
  setSelectValue($('#loss'), model.loss);
  fillArchitecture(isPlainObject(model.architecture) ? model.architecture : {}, presetId);
  $('#batchSize').value = displayNumber(training.batchSize);
  $('#sequenceLength').value = displayNumber(training.sequenceLength);
  setSelectValue($('#precision'), training.precision);
  setSelectValue($('#optimizer'), training.optimizer);
  setSelectValue($('#optimizerImplementation'), training.optimizerImplementation);
  $('#adafactorBeta1').checked = Boolean(training.adafactorBeta1);
  $('#zeroGradSetToNone').checked = Boolean(training.zeroGradSetToNone);
  setSelectValue($('#attention'), training.attention);
  setSelectValue($('#checkpointing'), training.checkpointing);
  $('#checkpointInterval').value = displayNumber(training.checkpointInterval);
  $('#memoryGiB').value = displayNumber(gpu.memoryGiB);
  fillRuntime(setup.runtime);
  state.gpuId = gpuById(gpu.id)?.id ?? '';
  showKindPanels();
  showParameterHint();
  syncGpuSelect();
}

// The setup the form describes, in the schema's shape. Only the active model mode's fields are
// written: the other mode's fields would be ignored by the core anyway.
function readForm() {
  const errors = [];
  const kind = currentKind();
  const model = { kind };
  if (kind === state.layersKind) {
    model.layers = readLayers();
    model.loss = $('#loss').value;
  } else if (kind === state.archKind) {
    // The preset is named only while the fields hold exactly its architecture; the full
    // architecture is written too, so a link keeps its numbers even if a preset is revised.
    const preset = $('#preset').value;
    if (preset) model.preset = preset;
    model.architecture = readArchitecture();
  } else {
    model.parameterCount = numberValue($('#parameterCount'));
    const parsed = parseMatrices($('#largestMatrices').value);
    if (parsed.error) errors.push({ code: 'invalidField', field: 'model.largestMatrices', message: parsed.error });
    else model.largestMatrices = parsed.matrices;
  }
  const setup = {
    schemaVersion: state.options.defaultSetup.schemaVersion ?? 1,
    model,
    training: {
      batchSize: numberValue($('#batchSize')),
      sequenceLength: numberValue($('#sequenceLength')),
      precision: $('#precision').value,
      optimizer: $('#optimizer').value,
      optimizerImplementation: $('#optimizerImplementation').value,
      adafactorBeta1: $('#adafactorBeta1').checked,
      zeroGradSetToNone: $('#zeroGradSetToNone').checked,
      attention: $('#attention').value,
      checkpointing: $('#checkpointing').value,
      checkpointInterval: numberValue($('#checkpointInterval')),
    },
    // A GPU of the list is named by its id; its size is written too, so the setup reads the
    // same without the list.
    gpu: state.gpuId ? { id: state.gpuId, memoryGiB: numberValue($('#memoryGiB')) } : { memoryGiB: numberValue($('#memoryGiB')) },
  };
  setup.runtime = readRuntime();
  return { setup, errors };
}

// ---------- runtime: PyTorch's allocator, the CUDA context, cuBLAS ----------

// Labels for the runtime fields, by their path under `runtime`: the names people set in
// PYTORCH_CUDA_ALLOC_CONF and the environment (c10/core/AllocatorConfig.cpp parseArgs;
// aten/src/ATen/cuda/CublasHandlePool.cpp). The fields themselves, their kinds and defaults
// come from the core's defaultSetup.runtime, so a field the core adds appears here by its key.
const RUNTIME_FIELDS = {
  'allocator.expandableSegments': { label: 'expandable_segments:True', hint: 'Segments grow in place instead of new cudaMalloc blocks: fewer stranded fragments.' },
  'allocator.maxSplitSizeMiB': { label: 'max_split_size_mb', unit: 'MiB; 0 = no limit, PyTorch\'s default', hint: 'Cached blocks larger than this are never split.' },
  'allocator.roundupPower2Divisions': { label: 'roundup_power2_divisions', unit: 'divisions; 0 = off, the default', hint: 'Rounds request sizes to steps between powers of two.' },
  'allocator.garbageCollectionThreshold': { label: 'garbage_collection_threshold', unit: 'fraction 0–1; 0 = off', hint: 'Frees old cached blocks above this share of the memory (only with a memory fraction set, as in PyTorch).' },
  cudaContextMiB: { label: 'CUDA context', unit: 'MiB; 0 = gpumem\'s default for this GPU', hint: 'Enter what nvidia-smi shows for a process that only initialised CUDA.' },
  cublasWorkspaceConfig: { label: 'CUBLAS_WORKSPACE_CONFIG', unit: 'e.g. :4096:8; empty = PyTorch\'s default', hint: 'Each :SIZE_KiB:COUNT pair adds SIZE × COUNT KiB per handle and stream.' },
};

// [{path, value}] for every leaf of the core's default runtime, in its order.
function runtimeLeaves(object, prefix = '') {
  return Object.entries(object ?? {}).flatMap(([key, value]) => (isPlainObject(value)
    ? runtimeLeaves(value, `${prefix}${key}.`)
    : [{ path: `${prefix}${key}`, value }]));
}

function runtimeInputId(path) {
  return `runtime-${path.replace(/\./g, '-')}`;
}

function buildRuntimeFields() {
  const box = $('#runtime-fields');
  const allocator = document.createElement('fieldset');
  const allocatorLegend = document.createElement('legend');
  allocatorLegend.textContent = 'PYTORCH_CUDA_ALLOC_CONF';
  allocator.append(allocatorLegend);
  const device = document.createElement('div');
  for (const { path, value } of runtimeLeaves(state.options.defaultSetup.runtime)) {
    const meta = RUNTIME_FIELDS[path] ?? { label: path };
    const id = runtimeInputId(path);
    const wrap = document.createElement('div');
    const input = document.createElement('input');
    input.id = id;
    input.dataset.field = `runtime.${path}`;
    input.dataset.runtime = path;
    const label = document.createElement('label');
    label.htmlFor = id;
    const name = document.createElement('code');
    name.textContent = meta.label;
    label.append(name);
    if (typeof value === 'boolean') {
      wrap.className = 'check';
      input.type = 'checkbox';
      wrap.append(input, label);
    } else {
      wrap.className = 'field';
      input.type = 'text';
      input.spellcheck = false;
      if (typeof value === 'number') input.inputMode = 'decimal';
      if (meta.unit) {
        const unit = document.createElement('span');
        unit.className = 'unit';
        unit.textContent = ` (${meta.unit})`;
        label.append(unit);
      }
      wrap.append(label, input);
    }
    if (meta.hint) {
      const hint = document.createElement('p');
      hint.className = 'hint';
      hint.id = `${id}-hint`;
      hint.textContent = meta.hint;
      input.setAttribute('aria-describedby', hint.id);
      wrap.append(hint);
    }
    (path.startsWith('allocator.') ? allocator : device).append(wrap);
  }
  box.replaceChildren(allocator, device);
}

function readRuntime() {
  const runtime = {};
  for (const input of $$('#runtime-fields [data-runtime]')) {
    const keys = input.dataset.runtime.split('.');
    let at = runtime;
    for (const key of keys.slice(0, -1)) at = (at[key] ??= {});
    const defaultValue = keys.reduce((o, k) => o?.[k], state.options.defaultSetup.runtime);
    at[keys[keys.length - 1]] = input.type === 'checkbox' ? input.checked
      : typeof defaultValue === 'number' ? numberValue(input) : input.value;
  }
  return runtime;
}

function fillRuntime(runtime) {
  const values = mergeSetup(state.options.defaultSetup.runtime, isPlainObject(runtime) ? runtime : {});
  for (const input of $$('#runtime-fields [data-runtime]')) {
    const value = input.dataset.runtime.split('.').reduce((o, k) => o?.[k], values);
    if (input.type === 'checkbox') input.checked = Boolean(value);
    else input.value = displayNumber(value);
  }
  // A setup that changes the runtime opens the fold, so nothing that moves the figure is hidden.
  if (JSON.stringify(values) !== JSON.stringify(state.options.defaultSetup.runtime)) $('#runtime-fold').open = true;
}

function showParameterHint() {
  const hint = $('#parameterCount-hint');
  const n = parseNumberText($('#parameterCount').value);
  hint.textContent = Number.isFinite(n) && n > 0
    ? `= ${formatInteger(n)} parameters`
    : 'Accepts 1.5e9, 1,500,000,000 or 1.5B.';
}

// ---------- architecture editor ----------

function presetById(id) {
  return (state.options.presets ?? []).find((p) => p.id === id);
}

// True when every field of the preset's architecture has the same value in `arch`.
function sameArchitecture(arch, presetArch) {
  return Object.entries(presetArch).every(([key, value]) => arch[key] === value);
}

function matchingPreset(arch) {
  return (state.options.presets ?? []).find((p) => sameArchitecture(arch, p.architecture));
}

function buildArchFields() {
  $('#arch-fields').replaceChildren(...archFields().map(({ key, label, kind, hint, options }) => {
    const id = `arch-${key}`;
    const wrap = document.createElement('div');
    wrap.dataset.archKey = key;
    const lab = document.createElement('label');
    lab.htmlFor = id;
    lab.textContent = label;
    let input;
    if (kind === 'select') {
      input = document.createElement('select');
      fillSelect(input, state.options[options] ?? []);
    } else {
      input = document.createElement('input');
      input.type = kind === 'bool' ? 'checkbox' : 'text';
      if (kind !== 'bool') {
        input.inputMode = kind === 'count' ? 'numeric' : 'decimal';
        input.spellcheck = false;
      }
    }
    input.id = id;
    input.dataset.key = key;
    input.dataset.field = `model.architecture.${key}`;
    if (kind === 'bool') {
      wrap.className = 'check';
      wrap.append(input, lab);
      return wrap;
    }
    wrap.className = kind === 'select' ? 'field wide' : 'field';
    wrap.append(lab, input);
    if (hint) {
      const p = document.createElement('p');
      p.className = 'hint';
      p.id = `${id}-hint`;
      p.textContent = hint;
      input.setAttribute('aria-describedby', p.id);
      wrap.append(p);
    }
    return wrap;
  }));
}

// The architecture as the schema writes it: family first, then every field, shown or not (a
// field hidden for this family holds the family's default, which the core ignores anyway).
function readArchitecture() {
  const arch = { family: $('#arch-family').value };
  for (const { key, kind } of archFields()) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') arch[key] = input.checked;
    else if (kind === 'select') arch[key] = input.value;
    else arch[key] = numberValue(input);
  }
  return arch;
}

function fillArchitecture(arch, presetId) {
  setSelectValue($('#arch-family'), arch.family);
  for (const { key, kind } of archFields()) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') input.checked = Boolean(arch[key]);
    else if (kind === 'select') setSelectValue(input, arch[key]);
    else input.value = displayNumber(arch[key]);
  }
  state.presetBase = presetById(presetId)?.id ?? '';
  syncPreset();
  showArchFields();
}

// The preset select names a preset only while the fields hold exactly its architecture; after
// an edit it says "custom" and the hint remembers which preset the values started from.
function syncPreset() {
  const arch = readArchitecture();
  const base = presetById(state.presetBase);
  const current = base && sameArchitecture(arch, base.architecture) ? base : matchingPreset(arch);
  if (current) state.presetBase = current.id;
  $('#preset').value = current?.id ?? '';
  showPresetHint();
}

function showPresetHint() {
  const hint = $('#preset-hint');
  const current = presetById($('#preset').value);
  const base = presetById(state.presetBase);
  if (current) {
    hint.textContent = `Published: ${formatInteger(current.publishedParameters)} parameters (${current.source}; counted as ${current.countedAs}). The fields below stay editable.`;
  } else if (base) {
    hint.textContent = `Custom: modified from ${base.label}, so its published count no longer applies.`;
  } else {
    hint.textContent = 'Custom architecture. Choose a preset to load a published model\'s sizes.';
  }
}

// Which fields the family uses, plus any whose value is not the family default (so a value
// loaded from a link or file is never hidden while it changes the estimate or an error).
function showArchFields() {
  const arch = readArchitecture();
  const defaults = state.options.familyDefaults?.[arch.family] ?? {};
  for (const field of archFields()) {
    const { key } = field;
    $(`[data-arch-key="${key}"]`).hidden = !(fieldShown(field, arch) || (key in defaults && arch[key] !== defaults[key]));
  }
}

function onPresetChange() {
  const preset = presetById($('#preset').value);
  if (preset) {
    fillArchitecture(preset.architecture, preset.id);
    // The core's length for this preset (its published context, capped for long-context
    // models: options().presets[].defaultSequenceLength), not whatever the field held.
    if (preset.defaultSequenceLength) $('#sequenceLength').value = displayNumber(preset.defaultSequenceLength);
  } else {
    showPresetHint();  // "custom": the values stay as they are
  }
}

function onFamilyChange() {
  const defaults = state.options.familyDefaults?.[$('#arch-family').value];
  if (defaults) fillArchitecture(defaults);
  else showArchFields();
}

function onArchFieldInput() {
  syncPreset();
  showArchFields();
}

// ---------- layer editor ----------

// A new layer's fields come from the first example layer of that type (the core's examples),
// so the page does not invent sizes; a linear layer takes the width flowing into it.
function templateLayer(type, layersBefore) {
  const fromExample = state.examples
    .flatMap((e) => e.setup?.model?.layers ?? [])
    .find((l) => l.type === type);
  const layer = { ...(fromExample ?? {}), type };
  if (type === 'linear') {
    const width = widthAfter(layersBefore);
    if (width !== undefined) {
      layer.inFeatures = width;
      if (layer.outFeatures === undefined) layer.outFeatures = width;
    }
  }
  return layer;
}

// The feature width leaving the last layer that sets one (for pre-filling, not for estimating).
function widthAfter(layers) {
  for (let i = layers.length - 1; i >= 0; i--) {
    const l = layers[i];
    if (l.type === 'linear' && typeof l.outFeatures === 'number') return l.outFeatures;
    if (l.type === 'embedding' && typeof l.embeddingDim === 'number') return l.embeddingDim;
  }
  return undefined;
}

function layerTypeLabel(id) {
  return state.options.layerTypes.find((t) => t.id === id)?.label ?? id;
}

// A row per layer costs the page about 1.5 ms to build; past this many layers the list is
// edited as JSON instead (one layer a line), so any list the core accepts stays quick to show.
const LAYER_ROWS_MAX = 200;

function renderLayers(layers) {
  const list = $('#layer-list');
  const json = $('#layer-json');
  list.replaceChildren();
  const asJson = layers.length > LAYER_ROWS_MAX;
  list.hidden = asJson;
  json.hidden = !asJson;
  $('#layer-json-hint').hidden = !asJson;
  if (asJson) {
    $('#layer-json-hint').textContent = `${formatInteger(layers.length)} layers: more than the ${LAYER_ROWS_MAX} the row editor shows, so they are listed as JSON, one layer a line.`;
    json.value = `[\n${layers.map((layer) => JSON.stringify(layer)).join(',\n')}\n]`;
    return;
  }
  json.value = '';
  layers.forEach((layer, i) => list.append(layerRow(layer, i, layers.length)));
}

function layerRow(layer, i, count) {
  const li = document.createElement('li');
  li.className = 'layer';
  li.dataset.type = layer.type;
  // Errors about the layer as a whole ("model.layers[3]") are shown on its row.
  li.dataset.field = `model.layers[${i}]`;
  const head = document.createElement('div');
  head.className = 'layer-head';
  const index = document.createElement('span');
  index.className = 'layer-index';
  index.textContent = String(i);
  const typeLabel = document.createElement('label');
  typeLabel.className = 'visually-hidden';
  typeLabel.htmlFor = `layer-${i}-type`;
  typeLabel.textContent = `Layer ${i} type`;
  const select = document.createElement('select');
  select.id = `layer-${i}-type`;
  select.dataset.role = 'type';
  select.dataset.field = `model.layers[${i}].type`;
  fillSelect(select, state.options.layerTypes);
  setSelectValue(select, layer.type);
  const button = (action, text, label, disabled) => {
    const b = document.createElement('button');
    b.type = 'button';
    b.dataset.action = action;
    b.textContent = text;
    b.setAttribute('aria-label', label);
    b.title = label;
    b.disabled = disabled;
    return b;
  };
  head.append(index, typeLabel, select,
    button('up', '↑', `Move layer ${i} up`, i === 0),
    button('down', '↓', `Move layer ${i} down`, i === count - 1),
    button('remove', '✕', `Remove layer ${i} (${layerTypeLabel(layer.type)})`, false));
  li.append(head);

  const fields = LAYER_FIELDS[layer.type] ?? [];
  if (fields.length) {
    const box = document.createElement('div');
    box.className = 'layer-fields';
    for (const [key, label, kind] of fields) {
      const id = `layer-${i}-${key}`;
      const wrap = document.createElement('div');
      const input = document.createElement('input');
      input.id = id;
      input.dataset.key = key;
      input.dataset.field = `model.layers[${i}].${key}`;
      const lab = document.createElement('label');
      lab.htmlFor = id;
      lab.textContent = label;
      if (kind === 'bool') {
        wrap.className = 'check';
        input.type = 'checkbox';
        input.checked = layer[key] !== false;
        wrap.append(input, lab);
      } else {
        wrap.className = 'field';
        input.type = 'text';
        input.inputMode = kind === 'count' ? 'numeric' : 'decimal';
        input.spellcheck = false;
        input.value = displayNumber(layer[key]);
        wrap.append(lab, input);
      }
      box.append(wrap);
    }
    li.append(box);
  }
  return li;
}

function readLayers() {
  const json = $('#layer-json');
  if (!json.hidden) {
    // Text that is no list goes to the core as it is, which names the problem (model.layers).
    try {
      return JSON.parse(json.value);
    } catch {
      return json.value;
    }
  }
  return $$('#layer-list > li').map((li) => {
    const type = $('select[data-role=type]', li).value;
    const layer = { type };
    // Fields as rendered: during a type change the row still shows the previous type's fields.
    for (const [key, , kind] of LAYER_FIELDS[li.dataset.type] ?? []) {
      const input = $(`[data-key="${key}"]`, li);
      if (!input) continue;
      layer[key] = kind === 'bool' ? input.checked : numberValue(input);
    }
    return layer;
  });
}

function onLayerListInput(event) {
  const select = event.target.closest('select[data-role=type]');
  if (!select) return;
  // A new type: keep the fields both types share, take the rest from the template.
  const li = select.closest('li');
  const index = $$('#layer-list > li').indexOf(li);
  const layers = readLayers();
  const old = layers[index];
  const fresh = templateLayer(select.value, layers.slice(0, index));
  for (const [key] of LAYER_FIELDS[select.value] ?? []) if (old[key] !== undefined) fresh[key] = old[key];
  layers[index] = fresh;
  renderLayers(layers);
  $(`#layer-${index}-type`).focus();
}

function onLayerListClick(event) {
  const button = event.target.closest('button[data-action]');
  if (!button) return;
  const li = button.closest('li');
  const index = $$('#layer-list > li').indexOf(li);
  const layers = readLayers();
  const action = button.dataset.action;
  let focusAfter;
  if (action === 'remove') {
    layers.splice(index, 1);
    focusAfter = layers.length ? `#layer-${Math.min(index, layers.length - 1)}-type` : '#add-layer-type';
  } else {
    const to = action === 'up' ? index - 1 : index + 1;
    if (to < 0 || to >= layers.length) return;
    [layers[index], layers[to]] = [layers[to], layers[index]];
    focusAfter = `#layer-${to}-type`;
  }
  renderLayers(layers);
  $(focusAfter)?.focus();
  update();
}

function addLayer() {
  const layers = readLayers();
  if (!Array.isArray(layers)) return;  // the JSON text is not a list: the error says so
  layers.push(templateLayer($('#add-layer-type').value, layers));
  renderLayers(layers);
  ($(`#layer-${layers.length - 1}-type`) ?? $('#layer-json')).focus();
  update();
}

// ---------- errors ----------

function clearErrors() {
  const box = $('#errors');
  box.hidden = true;
  box.replaceChildren();
  for (const el of $$('[aria-invalid=true]')) el.removeAttribute('aria-invalid');
  for (const el of $$('[data-invalid=true]')) el.removeAttribute('data-invalid');
  // Only the notes showErrors added; other .field-error texts (import, comparison) stay.
  for (const el of $$('.field-error[id^="field-error-"]')) el.remove();
  for (const el of $$('[data-described-error]')) {
    el.setAttribute('aria-describedby', el.dataset.describedError);
    if (!el.dataset.describedError) el.removeAttribute('aria-describedby');
    delete el.dataset.describedError;
  }
}

// The control for a JSON path, trying shorter paths until one matches:
// "model.largestMatrices[0].rows" → "model.largestMatrices".
function controlFor(field) {
  let path = field;
  while (path) {
    const el = $$('[data-field]').find((e) => e.dataset.field === path && !e.closest('[hidden]'));
    if (el) return el;
    const cut = Math.max(path.lastIndexOf('.'), path.lastIndexOf('['));
    path = cut > 0 ? path.slice(0, cut) : '';
  }
  return null;
}

function errorText(err) {
  const message = String(err.message ?? 'invalid value');
  return err.field && !message.includes(err.field) ? `${err.field}: ${message}` : message;
}

function showErrors(errors) {
  const box = $('#errors');
  const title = document.createElement('strong');
  title.textContent = errors.length === 1 ? 'This setup cannot be estimated:' : `This setup cannot be estimated (${errors.length} problems):`;
  const list = document.createElement('ul');
  errors.forEach((err, k) => {
    const li = document.createElement('li');
    if (err.field) {
      const code = document.createElement('code');
      code.textContent = err.field;
      const message = String(err.message ?? '');
      li.append(code, `: ${message.startsWith(err.field) ? message.slice(err.field.length).replace(/^[:\s]+/, '') : message}`);
    } else {
      li.textContent = errorText(err);
    }
    list.append(li);
    const control = err.field ? controlFor(err.field) : null;
    if (control) {
      // aria-invalid belongs on form controls; a layer row or group is marked for the eye only.
      control.setAttribute(control.matches('input, select') ? 'aria-invalid' : 'data-invalid', 'true');
      const note = document.createElement('p');
      note.className = 'field-error';
      note.id = `field-error-${k}`;
      note.textContent = errorText(err);
      const container = control.closest('.field, .check, .layer, fieldset') ?? control.parentElement;
      container.append(note);
      if (control.matches('input, select')) {
        if (!('describedError' in control.dataset)) control.dataset.describedError = control.getAttribute('aria-describedby') ?? '';
        control.setAttribute('aria-describedby', `${control.dataset.describedError} ${note.id}`.trim());
      }
    }
  });
  box.replaceChildren(title, list);
  box.hidden = false;
}

function errorsOf(exception) {
  if (exception instanceof GpumemError) {
    if (Array.isArray(exception.errors) && exception.errors.length) return exception.errors;
    return [{ code: exception.code, field: exception.field ?? '', message: exception.message }];
  }
  return [{ code: 'internal', field: '', message: `The calculator failed: ${exception?.message ?? exception}` }];
}

function setResultsState(value) {
  $('#results').dataset.state = value;
  $('#stale-note').hidden = value !== 'stale';
}

// ---------- URL state ----------

// The setup from "#s=<base64url of the JSON>" (or of URI-encoded JSON, for hand-written
// links); null when the hash holds none; throws when it holds one that cannot be read.
function setupFromHash(hash) {
  const value = new URLSearchParams(hash.replace(/^#/, '')).get('s');
  if (!value) return null;
  const text = value.trimStart().startsWith('{') ? value : fromBase64Url(value);
  return JSON.parse(text);
}

// The page's state in its address: #s=<setup> (its gpu.id names a listed GPU), units=GB when
// decimal units are chosen, compare=<setup A> while a comparison is pinned. Called with no
// setup, it rewrites the last one (after a units change).
function writeHash(setup) {
  if (setup) state.hashSetup = setup;
  if (!state.hashSetup) return;
  const params = new URLSearchParams();
  params.set('s', encodeSetupParam(state.hashSetup));
  if (state.units === 'GB') params.set('units', 'GB');
  if (state.compare) params.set('compare', encodeSetupParam(state.compare.setup));
  const hash = `#${params.toString()}`;
  state.lastHash = hash;
  if (location.hash !== hash) {
    try {
      history.replaceState(null, '', hash);
    } catch {
      location.replace(hash);
    }
  }
  if (state.embed) {
    // The full calculator: the same address without the query (the hash holds the state).
    const url = new URL(location.href);
    url.search = '';
    $('#open-calculator').href = url.href;
  }
}

// ---------- estimate and rendering ----------

function phaseLabel(id) {
  return state.options.phases.find((p) => p.id === id)?.label ?? id;
}

// One colour class per category, cat-0 … cat-8 in index.html; a tenth category would reuse one.
const CATEGORY_COLOURS = 9;

function categoryIndex(id) {
  const i = state.options.categories.findIndex((c) => c.id === id);
  return (i < 0 ? state.options.categories.length : i) % CATEGORY_COLOURS;
}

function categoryLabel(row) {
  return row.label || state.options.categories.find((c) => c.id === row.category)?.label || row.category;
}

// Typing waits for a pause; the pause grows with what the last update cost, so on a slow
// machine a burst of keystrokes still runs one estimate instead of one per key.
function typingDelay() {
  if (state.lastCostMs <= SLOW_UPDATE_MS) return TYPING_DELAY_MS;
  return Math.min(MAX_TYPING_DELAY_MS, Math.round(state.lastCostMs * 1.5));
}

// While an update waits for the typing pause, the results say they are about to change.
function scheduleUpdate() {
  clearTimeout(state.timer);
  $('#results').setAttribute('aria-busy', 'true');
  state.timer = setTimeout(update, typingDelay());
}

function update() {
  clearTimeout(state.timer);
  state.timer = 0;
  $('#results').removeAttribute('aria-busy');
  const started = performance.now();
  const { setup, errors } = readForm();
  writeHash(setup);
  clearErrors();
  markSolveStale(setup);
  if (errors.length) {
    failed(errors);
    return;
  }
  let estimate;
  try {
    estimate = state.api.estimate(setup, { timeline: 'labelled' });
  } catch (exception) {
    if (!(exception instanceof GpumemError)) console.error(exception);
    failed(errorsOf(exception));
    return;
  }
  const estimated = performance.now();
  state.lastGood = estimate;
  state.lastGoodSetup = setup;
  state.lastContext = { kind: setup.model.kind, presetId: setup.model.preset ?? '', family: setup.model.architecture?.family };
  render(estimate);
  renderSafetensors();
  state.snapshot?.refresh();  // a dropped PyTorch snapshot, compared with this estimate
  setResultsState('ok');
  scheduleViews(setup);
  if (state.embed) showParamProblems(state.paramProblems ?? []);
  recordTiming(started, estimated);
}

function failed(errors) {
  showErrors(errors);
  cancelViews();
  setResultsState(state.lastGood ? 'stale' : 'empty');
  if (state.embed) showParamProblems([...(state.paramProblems ?? []), ...errors]);
}

function markSolveStale(setup) {
  const box = $('#solve-results');
  if (!state.solve || box.hidden) return;
  const stale = state.solvedFor !== JSON.stringify(setup);
  box.dataset.stale = String(stale);
  if (stale) $('#solve-status').textContent = 'The setup changed since the last solve; press Solve again for its results.';
}

// How long the last change took, kept on #results for anyone measuring the page (the browser
// tests log it): estimate (core + JSON), render (DOM and SVG), and from the input event to the
// next frame after the render, which includes the typing pause.
function recordTiming(started, estimated) {
  const done = performance.now();
  state.lastCostMs = done - started;
  const results = $('#results');
  results.dataset.estimateMs = (estimated - started).toFixed(1);
  results.dataset.renderMs = (done - estimated).toFixed(1);
  const inputAt = state.inputAt;
  state.inputAt = 0;
  requestAnimationFrame(() => {
    if (inputAt) results.dataset.inputToFrameMs = (performance.now() - inputAt).toFixed(1);
  });
}

function cell(text, className) {
  const td = document.createElement('td');
  if (className) td.className = className;
  if (text instanceof Node) td.append(text);
  else td.textContent = text;
  return td;
}

function bytesCells(bytes) {
  const human = cell(formatBytes(bytes), 'num');
  human.title = bytesTitle(bytes);
  const exact = cell(formatExactBytes(bytes), 'num');
  exact.dataset.bytes = String(bytes);
  return [human, exact];
}

function categoryCell(row, heuristic) {
  const frag = document.createDocumentFragment();
  const swatch = document.createElement('span');
  swatch.className = `swatch cat-${categoryIndex(row.category)}`;
  swatch.setAttribute('aria-hidden', 'true');
  frag.append(swatch, categoryLabel(row));
  if (heuristic && row.category === 'activations') {
    const badge = document.createElement('span');
    badge.className = 'badge';
    badge.textContent = 'heuristic';
    frag.append(' ', badge);
  }
  return cell(frag);
}

function fillBytesTable(table, rows, total, totalLabel, totalId, heuristic) {
  const body = $('tbody', table);
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement('tr');
    tr.dataset.category = row.category;
    tr.append(categoryCell(row, heuristic), ...bytesCells(row.bytes), explainCell(row));
    body.append(tr);
  }
  const foot = $('tfoot', table);
  const tr = document.createElement('tr');
  const [human, exact] = bytesCells(total);
  exact.id = totalId;
  tr.append(cell(totalLabel), human, exact, cell(''));
  foot.replaceChildren(tr);
}

// A formula cell: the core's formula (inputs substituted) as a one-line summary that expands,
// with the result it gives beneath. A <details>, so it opens with the keyboard too.
function explainCell(row, where = '') {
  const td = document.createElement('td');
  td.className = 'formula';
  if (!row.formula) return td;
  td.append(explainDetails(row.formula, [
    `${categoryLabel(row)}${where ? ` ${where}` : ''} = ${row.formula}`,
    ` = ${formatExactBytes(row.bytes)} (${formatBytes(row.bytes)})`,
  ]));
  return td;
}

function explainDetails(summaryContent, bodyContent) {
  const details = document.createElement('details');
  details.className = 'explain';
  details.open = state.explainAll;
  const summary = document.createElement('summary');
  summary.append(summaryContent);
  const body = document.createElement('div');
  body.className = 'explain-body';
  body.append(...bodyContent);
  details.append(summary, body);
  return details;
}

// What a snapshot (a phase's peak) holds, category by category, each with its formula.
function snapshotList(snapshot) {
  const list = document.createElement('ul');
  list.append(...snapshot.byCategory.map((row) => {
    const li = document.createElement('li');
    li.dataset.category = row.category;
    const bytes = document.createElement('strong');
    bytes.textContent = formatBytes(row.bytes);
    bytes.title = bytesTitle(row.bytes);
    const op = document.createElement('span');
    op.className = 'op';
    op.textContent = ` = ${row.formula}`;
    li.append(`${categoryLabel(row)}: `, bytes, op);
    return li;
  }));
  return list;
}

// The sentence naming the largest category at the peak, with its formula and the core's reason
// (estimate.peakDominant: category, bytes, share and reason, all from the core); the sizes are
// written here in the chosen units.
function showDominant(est) {
  const peak = est.peak;
  const el = $('#dominant');
  const dominant = est.peakDominant;
  const top = dominant ? peak.byCategory.find((r) => r.category === dominant.category) : null;
  if (!top || !(peak.totalBytes > 0)) {
    el.replaceChildren();
    delete el.dataset.category;
    return;
  }
  const share = dominant.sharePercent;
  const pct = share >= 99.5 && top.bytes < peak.totalBytes ? '>99' : share < 1 ? '<1' : String(Math.round(share));
  el.dataset.category = top.category;
  const name = document.createElement('strong');
  name.textContent = categoryLabel(top);
  const formula = document.createElement('span');
  formula.className = 'formula-inline';
  formula.textContent = top.formula;
  const size = document.createElement('span');
  size.textContent = `${formatBytes(top.bytes)} of ${formatBytes(peak.totalBytes)}`;
  size.title = `${formatExactBytes(top.bytes)} of ${formatExactBytes(peak.totalBytes)}`;
  el.replaceChildren('Largest at the peak: ', name, ` — ${pct} % of it (`, size, '). ', formula);
  if (dominant.reason) {
    const reason = document.createElement('span');
    reason.className = 'why';
    reason.textContent = `Why: ${dominant.reason}.`;
    el.append(document.createElement('br'), reason);
  }
  el.title = String(est.peakExplanation ?? '');
}

function gpuCaption(gpuId, est) {
  const gpu = gpuById(gpuId);
  return gpu ? gpu.label : `custom ${formatBytes(est.gpu.capacityBytes)}`;
}

function render(est) {
  const peak = est.peak;
  const gpu = est.gpu;
  const heuristic = Boolean(est.activationsFromHeuristic);

  const total = $('#peak-total');
  total.textContent = formatBytes(peak.totalBytes);
  total.dataset.bytes = String(peak.totalBytes);
  total.title = bytesTitle(peak.totalBytes);
  $('#peak-exact').textContent = `${formatExactBytes(peak.totalBytes)} · ${formatBytesOther(peak.totalBytes)}`;
  const stepText = peak.step > 0 ? ` of step ${peak.step}` : '';
  $('#peak-where').textContent = `During ${phaseLabel(peak.phase)}${stepText}, at event #${peak.eventIndex}: ${peak.label}`;
  $('#peak-where').dataset.phase = peak.phase;
  $('#heuristic-note').hidden = !heuristic;

  // The verdict is the core's device figure: the step through PyTorch's caching allocator at
  // the GPU's capacity, plus the CUDA context (est.device; docs/schema.md).
  const device = est.device;
  const verdict = $('#verdict');
  verdict.dataset.fits = String(Boolean(gpu.fits));
  verdict.dataset.verdict = device.verdict;
  verdict.dataset.headroomBytes = String(gpu.headroomBytes);
  verdict.dataset.deviceBytes = String(device.peakDeviceBytes);
  const headline = document.createElement('span');
  headline.className = 'big';
  headline.textContent = device.verdict === 'tight' ? 'Fits, tight' : gpu.fits ? 'Fits' : 'Does not fit';
  const sub = document.createElement('span');
  sub.className = 'sub';
  sub.id = 'verdict-amount';
  sub.textContent = gpu.fits
    ? `${formatBytes(gpu.headroomBytes)} headroom on ${formatBytes(gpu.capacityBytes)}`
    : `${formatBytes(Math.abs(gpu.headroomBytes))} short of ${formatBytes(gpu.capacityBytes)}`;
  sub.title = `${formatExactBytes(gpu.headroomBytes)} headroom (capacity ${formatExactBytes(gpu.capacityBytes)})`;
  const name = document.createElement('span');
  name.className = 'gpu-name';
  name.textContent = gpuCaption(state.lastGoodSetup?.gpu?.id, est);
  const why = document.createElement('span');
  why.className = 'sub verdict-why';
  why.id = 'verdict-why';
  // The one-line why, worded here from the core's figures so that the page's units apply.
  const oom = device.oom;
  why.textContent = oom
    ? `At ${formatBytes(device.capacityBytes)}, a ${formatBytes(oom.requestedBytes)} request found no free block of that size: `
      + `${formatBytes(oom.freeBytes)} was free in ${formatInteger(oom.freeFragments)} fragments, the largest ${formatBytes(oom.largestFreeBlockBytes)}.`
    : device.tight
      ? `Tight: only ${formatBytes(device.headroomBytes)} left, under 5 % of the GPU or ${formatBytes(2 ** 30)}; another process or a longer sample can tip it over.`
      : `${formatBytes(device.peakDeviceBytes)} on the device, ${formatBytes(device.headroomBytes)} to spare.`;
  why.title = device.why;
  verdict.replaceChildren(headline, sub, name, why);

  // Breakdown at the peak.
  const segments = peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  const legend = $('#capacity-legend');
  legend.replaceChildren(...segments.filter((s) => s.bytes > 0).map((s) => {
    const li = document.createElement('li');
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${s.colorIndex}`;
    li.append(swatch, `${s.label} ${formatBytes(s.bytes)}`);
    li.title = bytesTitle(s.bytes);
    return li;
  }));
  showDominant(est);
  renderDevice(est);
  fillBytesTable($('#peak-table'), peak.byCategory, peak.totalBytes, 'Total at the peak', 'peak-table-total', heuristic);

  // Model states.
  const states = est.modelStates;
  const count = $('#param-count');
  count.textContent = formatInteger(states.parameterCount);
  count.dataset.count = String(states.parameterCount);
  showParameterSource(states, state.lastContext ?? {});
  fillBytesTable($('#states-table'), states.rows, states.totalBytes, 'Model states', 'states-total', false);

  // What forward leaves for backward.
  const fe = est.forwardEnd;
  if (fe) {
    const feStep = fe.step > 0 ? ` of step ${fe.step}` : '';
    $('#forward-where').textContent = `At the end of ${phaseLabel(fe.phase)}${feStep} (event #${fe.eventIndex}: ${fe.label}), before backward starts. Everything here stays until backward frees it.`;
    fillBytesTable($('#forward-table'), fe.byCategory, fe.totalBytes, 'Total when backward starts', 'forward-total', heuristic);
  }

  // Phase peaks.
  const phaseBody = $('#phase-table tbody');
  phaseBody.replaceChildren(...est.phasePeaks.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.phase = p.phase;
    const size = cell(formatBytes(p.totalBytes), 'num');
    size.title = bytesTitle(p.totalBytes);
    size.dataset.bytes = String(p.totalBytes);
    const bar = document.createElement('div');
    bar.className = 'phase-bar';
    const share = peak.totalBytes > 0 ? (p.totalBytes / peak.totalBytes) * 100 : 0;
    bar.style.width = `${Math.max(0, Math.min(100, share)).toFixed(1)}%`;
    const where = p.step > 0 ? `step ${p.step}: ${p.label}` : p.label;
    const whereCell = cell(explainDetails(where, [
      `${phaseLabel(p.phase)} peaks at ${formatBytes(p.totalBytes)} (${formatExactBytes(p.totalBytes)}), event #${p.eventIndex}. It holds:`,
      snapshotList(p),
    ]));
    tr.append(cell(phaseLabel(p.phase)), size, cell(bar, 'bar-cell'), whereCell);
    return tr;
  }));

  // Which category is live in which phase: bytes of each category at each phase's peak.
  fillPhaseMatrix(est.phasePeaks);

  // Notes.
  $('#notes').replaceChildren(...est.notes.map((text) => {
    const li = document.createElement('li');
    li.textContent = text;
    return li;
  }));

  fillLargestEvents(est.timeline, est.timelineEventCount);
  drawCharts(est);
  renderCompare();
  if (state.embed) {
    const d = describeSetup(state.lastGoodSetup, state.lastGoodSetup, est);
    const model = document.createElement('strong');
    model.textContent = d.model;
    $('#embed-setup').replaceChildren(model, ` · batch ${d.shape} · ${d.precision} · ${d.optimizer}`);
  }
}

// Where the parameter count comes from, and for a preset the count its model card publishes.
function showParameterSource(states, context) {
  const source = $('#param-source');
  const published = $('#param-published');
  const family = state.options.families?.find((f) => f.id === context.family)?.label ?? context.family;
  if (context.kind === state.archKind) {
    source.textContent = `Counted by the core: the elements of every parameter tensor of the ${family} architecture, with Hugging Face's tensor names and shapes (a tied output head is counted once): ${states.parameterFormula}.`;
  } else if (context.kind === state.layersKind) {
    source.textContent = `Counted by the core from the layer list: in × out (+ out for a bias) per linear layer, rows × width per embedding: ${states.parameterFormula}.`;
  } else {
    source.textContent = 'As entered (model.parameterCount).';
  }
  const preset = context.kind === state.archKind ? presetById(context.presetId) : null;
  published.hidden = !preset;
  if (!preset) {
    published.replaceChildren();
    delete published.dataset.count;
    return;
  }
  published.dataset.count = String(preset.publishedParameters);
  // The core says how far the count is from the published one (modelStates.preset).
  const difference = states.preset?.id === preset.id ? states.preset.differenceFromPublished : null;
  const verdict = document.createElement('span');
  verdict.className = difference === 0 ? 'match' : 'differs';
  verdict.textContent = difference === 0 ? 'the count above matches it'
    : difference === null ? 'the architecture above is not exactly this preset'
      : `the count above differs by ${difference > 0 ? '+' : '−'}${formatInteger(Math.abs(difference))}`;
  published.replaceChildren(`Published: ${formatInteger(preset.publishedParameters)} (${preset.source}; counted as ${preset.countedAs}) — `, verdict, '.');
}

// The biggest single allocations of the run: a keyboard- and screen-reader-readable companion
// to the chart. Steps 1 and 2 repeat most events, so equal events of both steps share a row.
// A long run's timeline lists only each stretch's highest and lowest totals, which the note says.
function fillLargestEvents(timeline, eventCount) {
  const listed = timeline.length;
  const note = $('#largest-note');
  note.hidden = !(eventCount > listed);
  note.textContent = eventCount > listed
    ? `Among the ${formatInteger(listed)} of ${formatInteger(eventCount)} events the estimate lists (for long runs the core keeps each stretch's highest and lowest total); the CLI's --timeline prints every event.`
    : '';
  const rows = new Map();
  timeline.forEach((p, k) => {
    if (!(p.deltaBytes > 0)) return;
    const i = Number.isInteger(p.index) ? p.index : k;
    const key = `${p.phase}|${p.layer}|${p.label}|${p.deltaBytes}`;
    const row = rows.get(key);
    if (row) row.steps.push(p.step);
    else rows.set(key, { ...p, index: i, steps: [p.step] });
  });
  const largest = [...rows.values()].sort((a, b) => b.deltaBytes - a.deltaBytes || a.index - b.index).slice(0, LARGEST_EVENTS);
  $('#largest-events tbody').replaceChildren(...largest.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.event = String(p.index);
    const steps = p.steps.filter((s) => s > 0);
    const when = steps.length ? `${phaseLabel(p.phase)} · step${steps.length > 1 ? 's' : ''} ${steps.join(', ')}` : phaseLabel(p.phase);
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${categoryIndex(p.category)}`;
    swatch.title = categoryLabel({ category: p.category });
    swatch.setAttribute('role', 'img');
    swatch.setAttribute('aria-label', `${swatch.title}: `);
    const what = cell(p.label, 'label-cell');
    what.prepend(swatch);
    const size = cell(formatBytes(p.deltaBytes), 'num');
    size.title = bytesTitle(p.deltaBytes);
    size.dataset.bytes = String(p.deltaBytes);
    const total = cell(formatBytes(p.totalBytes), 'num');
    total.title = bytesTitle(p.totalBytes);
    tr.append(cell(`#${p.index}`, 'num'), cell(when), cell(p.layer >= 0 ? String(p.layer) : '—', 'num'), what, size, total);
    return tr;
  }));
}

function fillPhaseMatrix(phasePeaks) {
  const table = $('#phase-matrix');
  const head = document.createElement('tr');
  const corner = document.createElement('th');
  corner.scope = 'col';
  corner.textContent = 'Category';
  head.append(corner, ...phasePeaks.map((p) => {
    const th = document.createElement('th');
    th.scope = 'col';
    th.className = 'num';
    th.textContent = phaseLabel(p.phase);
    return th;
  }));
  $('thead', table).replaceChildren(head);
  const present = state.options.categories.filter((c) =>
    phasePeaks.some((p) => p.byCategory.some((row) => row.category === c.id)));
  $('tbody', table).replaceChildren(...present.map((c) => {
    const tr = document.createElement('tr');
    tr.dataset.category = c.id;
    tr.append(categoryCell({ category: c.id, label: c.label }, false), ...phasePeaks.map((p) => {
      const row = p.byCategory.find((r) => r.category === c.id);
      const td = cell(row ? formatBytes(row.bytes) : '—', 'num');
      td.dataset.phase = p.phase;
      td.dataset.bytes = String(row ? row.bytes : 0);
      if (row) td.title = `${formatExactBytes(row.bytes)} · ${formatBytesOther(row.bytes)}: ${row.formula}`;
      return td;
    }));
    return tr;
  }));
}

// What the device holds at its peak, from estimate.device (the core's caching-allocator
// simulation and device overheads, docs/device.md): the rows of what nvidia-smi shows, each with
// the core's formula, and one sentence on fragmentation where it matters.
function deviceRows(device) {
  const f = device.formulas ?? {};
  return [
    { part: 'reserved', label: 'Reserved by the caching allocator', bytes: device.peakReservedBytes, formula: f.peakReservedBytes },
    { part: 'cache', label: 'of which allocator cache (free blocks in its segments)', bytes: device.fragmentationBytes, formula: f.fragmentationBytes, sub: true },
    { part: 'workspaces', label: 'of which cuBLAS / cuBLASLt workspaces', bytes: device.workspaceBytes, formula: f.workspaceBytes, sub: true },
    { part: 'context', label: 'CUDA context and kernel images', bytes: device.contextBytes, formula: f.contextBytes },
    { part: 'communication', label: 'Communication buffers (NCCL)', bytes: device.communicationBytes, formula: f.communicationBytes },
  ];
}

// The device bar's parts, summing to peakDeviceBytes: the reserved bytes split into the tensors
// allocated at the reserved peak, the workspaces and the cache (reserved = allocated + cache,
// workspaces inside allocated), then the context and communication outside the allocator.
function deviceSegments(device) {
  const f = device.formulas ?? {};
  const tensors = device.peakReservedBytes - device.fragmentationBytes - device.workspaceBytes;
  return [
    { part: 'allocated', className: 'dev dev-allocated', label: 'Allocated tensors', bytes: tensors,
      formula: `reserved − cache − workspaces at the reserved peak = ${formatExactBytes(tensors)}` },
    { part: 'workspaces', className: 'dev dev-workspaces', label: 'cuBLAS workspaces', bytes: device.workspaceBytes, formula: f.workspaceBytes },
    { part: 'cache', className: 'dev dev-cache', label: 'Allocator cache', bytes: device.fragmentationBytes, formula: f.fragmentationBytes },
    { part: 'context', className: 'dev dev-context', label: 'CUDA context', bytes: device.contextBytes, formula: f.contextBytes },
    { part: 'communication', className: 'dev dev-communication', label: 'NCCL buffers', bytes: device.communicationBytes, formula: f.communicationBytes },
  ];
}

function renderDevice(est) {
  const device = est.device;
  const card = $('#device');
  if (!device) {
    card.hidden = true;
    return;
  }
  card.hidden = false;
  const segments = deviceSegments(device);
  $('#device-legend').replaceChildren(...segments.filter((s) => s.bytes > 0).map((s) => {
    const li = document.createElement('li');
    li.dataset.part = s.part;
    const swatch = document.createElement('span');
    swatch.className = `swatch ${s.className.replace('dev ', '')}`;
    li.append(swatch, `${s.label} ${formatBytes(s.bytes)}`);
    li.title = bytesTitle(s.bytes);
    return li;
  }));
  const body = $('#device-table tbody');
  body.replaceChildren(...deviceRows(device).map((row) => {
    const tr = document.createElement('tr');
    tr.dataset.part = row.part;
    if (row.sub) tr.className = 'sub-row';
    const td = document.createElement('td');
    td.className = 'formula';
    if (row.formula) td.append(explainDetails(row.formula, [`${row.label} = ${row.formula}`]));
    tr.append(cell(row.label), ...bytesCells(row.bytes), td);
    return tr;
  }));
  const foot = document.createElement('tr');
  const [human, exact] = bytesCells(device.peakDeviceBytes);
  exact.id = 'device-total';
  const formula = document.createElement('td');
  formula.className = 'formula';
  if (device.formulas?.peakDeviceBytes) formula.append(explainDetails(device.formulas.peakDeviceBytes, [`What nvidia-smi shows at the peak = ${device.formulas.peakDeviceBytes}`]));
  foot.append(cell('On the device at its peak (nvidia-smi)'), human, exact, formula);
  $('#device-table tfoot').replaceChildren(foot);
  // Fragmentation gets its sentence when it matters: a tenth or more of what is reserved sits in
  // cached free blocks, or the step fails with enough free memory in total.
  const note = $('#fragmentation-note');
  const share = device.peakReservedBytes > 0 ? device.fragmentationBytes / device.peakReservedBytes : 0;
  const oom = device.oom;
  const fragmentationDecided = oom && oom.freeBytes >= oom.requestedBytes;
  const matters = share >= 0.1 || fragmentationDecided;
  note.hidden = !matters;
  note.textContent = matters ? device.fragmentationExplanation : '';
  const oomNote = $('#oom-note');
  oomNote.hidden = !oom;
  oomNote.textContent = oom
    ? `Out of memory at event #${oom.eventIndex} (${oom.label}): ${oom.explanation}. ${device.numAllocRetries > 0 ? 'PyTorch would first free its cached segments and retry, as simulated; it still fails. ' : ''}`
      + 'torch.cuda.OutOfMemoryError would be raised there.'
    : '';
}

function drawCharts(est) {
  const barBox = $('#capacity-bar');
  const segments = est.peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  barBox.replaceChildren(capacityBar(segments, est.gpu.capacityBytes, {
    width: Math.max(barBox.clientWidth, 280), peakLabel: `peak ${formatBytes(est.peak.totalBytes)}`,
  }));
  const deviceBox = $('#device-bar');
  if (est.device) {
    const device = est.device;
    deviceBox.replaceChildren(capacityBar(deviceSegments(device), device.capacityBytes, {
      width: Math.max(deviceBox.clientWidth, 280),
      peakLabel: `device peak ${formatBytes(device.peakDeviceBytes)}`,
      ariaLabel: `On the device at the peak, ${formatBytes(device.peakDeviceBytes)}: allocated tensors, cuBLAS workspaces, allocator cache and CUDA context, against a GPU of ${formatBytes(device.capacityBytes)}`,
    }));
  }
  const chartBox = $('#timeline-chart');
  const width = Math.max(chartBox.clientWidth, 280);
  state.chartWidth = chartBox.clientWidth;
  // A person stepping through the chart with the keyboard keeps the focus across a redraw.
  const hadFocus = chartBox.contains(document.activeElement);
  chartBox.replaceChildren(timelineChart(est.timeline, {
    eventCount: est.timelineEventCount, peak: est.peak, phasePeaks: est.phasePeaks, forwardEnd: est.forwardEnd,
    phaseLabel, capacityBytes: est.gpu.capacityBytes,
    width, height: width < 500 ? 220 : 270,
  }));
  if (hadFocus) $('svg', chartBox)?.focus();
  drawCompareChart();
}

// ---------- setup sources: defaults, examples, the URL, files ----------

// Fills the form from a (possibly partial) setup. The core's validate() normalises a valid one;
// an invalid one is still shown, so the errors point at what the person gave.
function applySetup(partial) {
  let problems = [];
  let setup = mergeSetup(presetBaseSetup(partial), partial);
  try {
    const result = state.api.validate(partial);
    if (result.ok) setup = result.setup;
    else problems = result.errors ?? [];
  } catch (exception) {
    problems = errorsOf(exception);
  }
  fillForm(setup, isPlainObject(partial?.model) ? partial.model.preset : undefined);
  update();
  return problems;
}

// What an invalid setup that names a preset is shown over: as the core reads one, the preset's
// architecture with the setup's fields on top, and the transformer kind unless it names another.
function presetBaseSetup(partial) {
  const base = state.options.defaultSetup;
  const model = isPlainObject(partial) && isPlainObject(partial.model) ? partial.model : null;
  if (!model || typeof model.preset !== 'string' || !state.archKind) return base;
  const preset = presetById(model.preset);
  return mergeSetup(base, { model: { kind: state.archKind, ...(preset ? { architecture: preset.architecture } : {}) } });
}

// The state in the address: the hash the page writes (#s=…&gpu=…&units=…&compare=…), or, when
// it holds no setup, the short parameters of a hand-written link or an iframe embed
// (?embed=1&preset=gpt2&batch-size=4&gpu=nvidia-h100-sxm; see web/setup-params.js).
function loadFromHash() {
  state.paramProblems = [];
  const params = new URLSearchParams(location.hash.replace(/^#/, ''));
  const query = new URLSearchParams(location.search);
  setUnits(params.get('units') ?? query.get('units') ?? 'GiB', { rerender: false });
  loadCompareFrom(params.get('compare') ?? query.get('compare'));
  try {
    const fromHash = setupFromHash(location.hash);
    if (fromHash) {
      const problems = applySetup(fromHash);
      // A link's problems stay visible in the embed, which has no editor to show them in.
      if (problems.length) showLinkProblems(problems);
      ioStatus(problems.length ? `The link's setup has problems: ${problems.map(errorText).join('; ')}` : '');
      return;
    }
  } catch (exception) {
    ioStatus(`The setup in this link could not be read (${exception.message}); showing the defaults.`, true);
    applySetup(state.options.defaultSetup);
    return;
  }
  const fromQuery = setupFromParams((name) => query.get(name));
  if (fromQuery.given) {
    const problems = [...fromQuery.problems, ...applySetup(fromQuery.setup)];
    if (problems.length) showLinkProblems(problems);
    ioStatus(problems.length ? `The link's setup has problems: ${problems.map(errorText).join('; ')}` : '');
    return;
  }
  applySetup(state.options.defaultSetup);
}

// Problems with a link's setup (an unknown GPU id, bad JSON) disappear from the form once it
// shows what it could read; the embed, which has no editor, keeps them above its result.
function showLinkProblems(problems) {
  state.paramProblems = problems;
  showParamProblems(problems);
}

function showParamProblems(problems) {
  const el = $('#embed-error');
  if (!state.embed) return;
  el.hidden = !problems.length;
  el.textContent = problems.map(errorText).join(' ');
}

function ioStatus(text, isError = false) {
  const el = $('#io-status');
  el.textContent = text;
  el.className = isError ? 'field-error' : 'hint';
}

function exportSetup() {
  const { setup } = readForm();
  downloadBlob(new Blob([`${JSON.stringify(setup, null, 2)}\n`], { type: 'application/json' }), 'gpumem-setup.json');
  ioStatus('Exported gpumem-setup.json.');
}

async function importSetup(file) {
  if (!file) return;
  let parsed;
  try {
    parsed = JSON.parse(await file.text());
  } catch (exception) {
    ioStatus(`${file.name} is not JSON: ${exception.message}`, true);
    return;
  }
  if (!isPlainObject(parsed)) {
    ioStatus(`${file.name} does not hold a setup object.`, true);
    return;
  }
  $('#example').value = '';
  const problems = applySetup(parsed);
  if (problems.length) ioStatus(`Imported ${file.name} with problems: ${problems.map(errorText).join('; ')}`, true);
  else ioStatus(`Imported ${file.name}.`);
}

function loadExample(id) {
  const example = state.examples.find((e) => e.id === id);
  if (!example) return;
  applySetup(example.setup);
  ioStatus(`Loaded the example “${example.label}”.`);
}

// Switching to the layer list with no layers starts from the first layer-list example's model.
function onKindChange() {
  showKindPanels();
  if (currentKind() === state.layersKind && $$('#layer-list > li').length === 0 && $('#layer-json').hidden) {
    const example = state.examples.find((e) => e.setup?.model?.kind === state.layersKind);
    if (example) {
      renderLayers(example.setup.model.layers ?? []);
      if (example.setup.model.loss) setSelectValue($('#loss'), example.setup.model.loss);
    }
  }
}

// ---------- GPU list and units ----------

function gpus() {
  return Array.isArray(state.options?.gpus) ? state.options.gpus : [];
}

function gpuById(id) {
  return id ? gpus().find((g) => g.id === id) : undefined;
}

const GPU_KIND_LABELS = { dataCenter: 'Data centre', workstation: 'Workstation', consumer: 'Consumer' };

// The select lists options.gpus grouped by kind; without a list (an older core) only the size
// field is shown.
function buildGpuSelect() {
  const list = gpus();
  $('#gpu-field').hidden = list.length === 0;
  const select = $('#gpu');
  select.replaceChildren(new Option('Custom size', ''));
  const groups = new Map();
  for (const gpu of list) {
    const key = GPU_KIND_LABELS[gpu.kind] ?? gpu.kind ?? 'Other';
    if (!groups.has(key)) {
      const group = document.createElement('optgroup');
      group.label = key;
      groups.set(key, group);
      select.append(group);
    }
    const option = new Option(gpu.label, gpu.id);
    option.title = `${gpu.vendor} · ${gpu.memoryGiB} GiB`;
    groups.get(key).append(option);
  }
}

// The select names a GPU only while the size field holds that GPU's memory.
function syncGpuSelect() {
  const gpu = gpuById(state.gpuId);
  if (!gpu || parseNumberText($('#memoryGiB').value) !== gpu.memoryGiB) state.gpuId = '';
  $('#gpu').value = state.gpuId;
  const hint = $('#gpu-hint');
  const chosen = gpuById(state.gpuId);
  hint.textContent = chosen
    ? `${chosen.label}: ${chosen.memoryGiB} GiB as sold (${chosen.vendor}); the driver keeps a little of it back.`
    : gpus().length ? 'Choose a GPU, or type a custom size in GiB (2^30 bytes).' : 'Memory in GiB (2^30 bytes).';
}

function onGpuChange() {
  const gpu = gpuById($('#gpu').value);
  state.gpuId = gpu?.id ?? '';
  if (gpu) $('#memoryGiB').value = String(gpu.memoryGiB);
  syncGpuSelect();
}

function setUnits(units, { rerender = true } = {}) {
  state.units = setByteUnits(units === 'GB' || units === 'gb' ? 'GB' : 'GiB');
  for (const radio of $$('input[name=units]')) radio.checked = radio.value === state.units;
  document.documentElement.dataset.units = state.units;
  if (!rerender) return;
  if (state.lastGood) render(state.lastGood);
  renderSafetensors();
  renderSolve();
  renderViews();
  writeHash();
}

// ---------- comparison ----------

function loadCompareFrom(text) {
  state.compare = null;
  if (!text) return;
  try {
    const setup = decodeSetupParam(text);
    if (!isPlainObject(setup)) throw new Error('not a setup object');
    pinSetup(setup);
  } catch (exception) {
    ioStatus(`The comparison in this link could not be read (${exception.message}).`, true);
  }
}

// A is estimated once, when pinned; B is the live estimate.
function pinSetup(setup) {
  const compare = { setup, shown: setup, estimate: null, error: '' };
  try {
    const checked = state.api.validate(setup);
    if (checked.ok) compare.shown = checked.setup;
    compare.estimate = state.api.estimate(setup);
  } catch (exception) {
    compare.error = `A cannot be estimated: ${errorsOf(exception).map(errorText).join('; ')}`;
  }
  state.compare = compare;
}

function onPin() {
  if (state.timer) update();
  const { setup, errors } = readForm();
  if (errors.length || $('#results').dataset.state !== 'ok') {
    announce('Fix the setup before pinning it for a comparison.');
    return;
  }
  pinSetup(JSON.parse(JSON.stringify(setup)));
  renderCompare();
  writeHash();
  announce('Pinned the current setup as A. Change the setup to compare it with B.');
}

function onClearCompare() {
  state.compare = null;
  renderCompare();
  writeHash();
  $('#compare-pin').focus();
  announce('Comparison cleared.');
}

// Loads A into the editor; the current setup becomes the pinned one.
function onSwapCompare() {
  const a = state.compare;
  if (!a) return;
  const { setup } = readForm();
  applySetup(a.setup);
  pinSetup(setup);
  renderCompare();
  writeHash();
  announce('Swapped: A is now in the editor, and the setup you had is pinned as A.');
}

function optionLabel(list, id) {
  return (list ?? []).find((o) => o.id === id)?.label ?? (id === undefined ? '—' : String(id));
}

// Short descriptions of a setup for the comparison table (labels from options()).
function describeSetup(original, shown, est) {
  const gpuId = shown?.gpu?.id ?? '';
  const m = isPlainObject(shown?.model) ? shown.model : {};
  const t = isPlainObject(shown?.training) ? shown.training : {};
  let model;
  if (m.kind === state.archKind && state.archKind) {
    const preset = presetById(original?.model?.preset) ?? (isPlainObject(m.architecture) ? matchingPreset(m.architecture) : null);
    const family = state.options.families?.find((f) => f.id === m.architecture?.family)?.label ?? m.architecture?.family;
    model = preset ? preset.label : `${family}, custom (${m.architecture?.numLayers} blocks)`;
  } else if (m.kind === state.layersKind) {
    model = `Layer list (${Array.isArray(m.layers) ? m.layers.length : 0} layers)`;
  } else {
    model = `${typeof m.parameterCount === 'number' ? formatInteger(m.parameterCount) : m.parameterCount} parameters (quick)`;
  }
  const extras = [];
  if (m.kind === state.archKind && state.archKind) {
    extras.push(optionLabel(state.options.attentions, t.attention));
    if (t.checkpointing && t.checkpointing !== 'none') {
      extras.push(`checkpointing ${optionLabel(state.options.checkpointings, t.checkpointing)}${t.checkpointing === 'everyKthBlock' ? ` (k = ${t.checkpointInterval})` : ''}`);
    }
  }
  return {
    model,
    shape: `${t.batchSize} × ${t.sequenceLength} tokens`,
    precision: optionLabel(state.options.precisions, t.precision),
    optimizer: `${optionLabel(state.options.optimizers, t.optimizer)} · ${optionLabel(state.options.optimizerImplementations, t.optimizerImplementation)}`,
    attention: extras.join(' · ') || '—',
    gpu: est ? gpuCaption(gpuId, est) : gpuById(gpuId)?.label ?? `${shown?.gpu?.memoryGiB} GiB`,
  };
}

function renderCompare() {
  const c = state.compare;
  $('#compare').hidden = !c;
  $('#compare-clear').hidden = !c;
  $('#compare-pin').textContent = c ? 'Pin this setup as A instead' : 'Compare: pin this setup as A';
  if (!c) return;
  const error = $('#compare-error');
  error.hidden = !c.error;
  error.textContent = c.error;
  const a = c.estimate;
  const b = state.lastGood;
  const descA = describeSetup(c.setup, c.shown, a);
  const descB = describeSetup(state.lastGoodSetup, state.lastGoodSetup, b);
  const body = $('#compare-table tbody');
  const rows = [];
  const textRow = (id, label, va, vb) => {
    const tr = document.createElement('tr');
    tr.dataset.row = id;
    tr.classList.toggle('differs', va !== vb);
    const th = document.createElement('th');
    th.scope = 'row';
    th.textContent = label;
    const ca = cell(va, 'num setup-cell');
    ca.dataset.side = 'A';
    const cb = cell(vb, 'num setup-cell');
    cb.dataset.side = 'B';
    tr.append(th, ca, cb);
    rows.push(tr);
  };
  const bytesRow = (id, label, ba, bb, strong) => {
    const tr = document.createElement('tr');
    tr.dataset.row = id;
    if (strong) tr.className = 'strong-row';
    const th = document.createElement('th');
    th.scope = 'row';
    th.append(label);
    const side = (bytes, name) => {
      const td = cell(typeof bytes === 'number' ? formatBytes(bytes) : '—', 'num');
      td.dataset.side = name;
      if (typeof bytes === 'number') {
        td.dataset.bytes = String(bytes);
        td.title = bytesTitle(bytes);
      }
      if (strong) td.style.fontWeight = '700';
      return td;
    };
    tr.append(th, side(ba, 'A'), side(bb, 'B'));
    rows.push(tr);
  };
  const section = (text) => {
    const tr = document.createElement('tr');
    tr.className = 'section';
    const td = cell(text);
    td.colSpan = 3;
    tr.append(td);
    rows.push(tr);
  };
  textRow('model', 'Model', descA.model, descB.model);
  textRow('shape', 'Batch × sequence', descA.shape, descB.shape);
  textRow('precision', 'Precision', descA.precision, descB.precision);
  textRow('optimizer', 'Optimizer', descA.optimizer, descB.optimizer);
  if (descA.attention !== '—' || descB.attention !== '—') textRow('attention', 'Attention', descA.attention, descB.attention);
  textRow('gpu', 'GPU', descA.gpu, descB.gpu);
  textRow('parameters', 'Parameters', a ? formatInteger(a.modelStates.parameterCount) : '—', b ? formatInteger(b.modelStates.parameterCount) : '—');
  bytesRow('peak', 'Peak', a?.peak.totalBytes, b?.peak.totalBytes, true);
  const fitsText = (est) => (!est ? '—' : est.gpu.fits
    ? `Fits · ${formatBytes(est.gpu.headroomBytes)} headroom`
    : `Does not fit · ${formatBytes(Math.abs(est.gpu.headroomBytes))} short`);
  textRow('fits', 'Fits the GPU', fitsText(a), fitsText(b));
  const fitsRow = rows.at(-1);
  fitsRow.classList.add('fits-row');
  fitsRow.children[1].dataset.fits = String(Boolean(a?.gpu.fits));
  fitsRow.children[2].dataset.fits = String(Boolean(b?.gpu.fits));
  bytesRow('states', 'Model states', a?.modelStates.totalBytes, b?.modelStates.totalBytes);
  section('Breakdown at the peak');
  for (const category of state.options.categories) {
    const ra = a?.peak.byCategory.find((r) => r.category === category.id);
    const rb = b?.peak.byCategory.find((r) => r.category === category.id);
    if (!ra && !rb) continue;
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${categoryIndex(category.id)}`;
    swatch.setAttribute('aria-hidden', 'true');
    const label = document.createDocumentFragment();
    label.append(swatch, category.label);
    bytesRow(`cat-${category.id}`, label, ra?.bytes ?? (a ? 0 : undefined), rb?.bytes ?? (b ? 0 : undefined));
    rows.at(-1).dataset.category = category.id;
  }
  body.replaceChildren(...rows);
  drawCompareChart();
}

function drawCompareChart() {
  const box = $('#compare-chart');
  const c = state.compare;
  if (!c || $('#compare').hidden) return;
  const bars = [];
  const bar = (name, est, setup) => ({
    name,
    segments: est.peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) })),
    capacityBytes: est.gpu.capacityBytes,
    caption: gpuById(setup?.gpu?.id)?.label ?? '',
    peakLabel: `peak ${formatBytes(est.peak.totalBytes)} · ${est.gpu.fits ? 'fits' : 'does not fit'}`,
  });
  if (c.estimate) bars.push(bar('A', c.estimate, c.shown));
  if (state.lastGood) bars.push(bar('B', state.lastGood, state.lastGoodSetup));
  box.replaceChildren(bars.length ? comparisonBars(bars, { width: Math.max(box.clientWidth, 280) }) : '');
}

// ---------- exports ----------

function announce(text) {
  const el = $('#export-status');
  el.textContent = '';
  requestAnimationFrame(() => { el.textContent = text; });
}

// The breakdown as CSV: the categories at the peak and the model states, each with its bytes
// and formula as the core gave them, and the totals.
function breakdownCsv(est) {
  const rows = [['section', 'category', 'label', 'bytes', 'formula']];
  for (const row of est.peak.byCategory) rows.push(['peak', row.category, categoryLabel(row), row.bytes, row.formula ?? '']);
  const step = est.peak.step > 0 ? ` of step ${est.peak.step}` : '';
  rows.push(['peak', 'total', 'Total at the peak', est.peak.totalBytes, `during ${phaseLabel(est.peak.phase)}${step}, event #${est.peak.eventIndex}: ${est.peak.label}`]);
  for (const row of est.modelStates.rows) rows.push(['modelStates', row.category, categoryLabel(row), row.bytes, row.formula ?? '']);
  rows.push(['modelStates', 'total', 'Model states', est.modelStates.totalBytes, `parameters: ${est.modelStates.parameterFormula ?? est.modelStates.parameterCount}`]);
  rows.push(['gpu', 'capacity', 'GPU capacity', est.gpu.capacityBytes, gpuCaption(state.lastGoodSetup?.gpu?.id, est)]);
  rows.push(['gpu', 'headroom', est.gpu.fits ? 'Headroom (fits)' : 'Headroom (does not fit)', est.gpu.headroomBytes, 'capacity − peak']);
  return csvText(rows);
}

async function exportChart(svg, base, format, title) {
  if (!svg) {
    announce('There is no chart to export yet.');
    return;
  }
  const { text, width, height } = standaloneSvg(svg, { title });
  if (format === 'svg') {
    downloadBlob(new Blob([text], { type: 'image/svg+xml' }), `${base}.svg`);
    announce(`Downloaded ${base}.svg.`);
    return;
  }
  try {
    downloadBlob(await svgToPngBlob(text, width, height, 2), `${base}.png`);
    announce(`Downloaded ${base}.png.`);
  } catch (exception) {
    announce(`The PNG could not be made: ${exception.message}`);
  }
}

function onExport(kind) {
  const est = state.lastGood;
  if (!est) return;
  const peakTitle = `gpumem: peak ${formatBytes(est.peak.totalBytes)} against ${formatBytes(est.gpu.capacityBytes)}`;
  switch (kind) {
    case 'csv':
      downloadBlob(new Blob([breakdownCsv(est)], { type: 'text/csv' }), 'gpumem-breakdown.csv');
      announce('Downloaded gpumem-breakdown.csv.');
      break;
    case 'bar-svg':
    case 'bar-png':
      exportChart($('#capacity-bar svg'), 'gpumem-peak', kind.slice(-3), peakTitle);
      break;
    case 'timeline-svg':
    case 'timeline-png':
      exportChart($('#timeline-chart svg'), 'gpumem-timeline', kind.slice(-3), `gpumem: memory through two training steps, ${peakTitle}`);
      break;
    case 'comparison-svg':
    case 'comparison-png':
      exportChart($('#compare-chart svg'), 'gpumem-comparison', kind.slice(-3), 'gpumem: A (pinned) and B compared');
      break;
    default:
  }
}

function toggleExplainAll(button) {
  state.explainAll = button.getAttribute('aria-pressed') !== 'true';
  for (const b of $$('.explain-all')) {
    b.setAttribute('aria-pressed', String(state.explainAll));
    b.textContent = state.explainAll ? 'Hide the formulas' : 'Show every formula';
  }
  for (const details of $$('#results details.explain')) details.open = state.explainAll;
}

// ---------- importing config.json and safetensors ----------

function canImport() {
  return typeof state.api.importConfig === 'function' || typeof state.api.importSafetensors === 'function';
}

// Which of the three JSON documents a text is: a safetensors index (weight_map), a safetensors
// header (tensors with dtype and shape), or else a config.json (the core reports bad JSON).
function kindOfJson(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    return 'config';
  }
  if (!isPlainObject(doc)) return 'config';
  if (isPlainObject(doc.weight_map)) return 'index';
  if ('__metadata__' in doc) return 'header';
  const values = Object.values(doc);
  if (values.length && values.every((v) => isPlainObject(v) && 'dtype' in v && 'shape' in v)) return 'header';
  return 'config';
}

function importText(text, source) {
  const kind = kindOfJson(text);
  if (kind === 'config') importConfigText(text, source);
  else importSafetensorsText(text, source);
}

function importError(exception, source, what) {
  const box = $('#import-result');
  const p = document.createElement('p');
  p.className = 'field-error';
  const errors = errorsOf(exception);
  p.textContent = `${source}: ${what} could not be read — ${errors.map(errorText).join('; ')}`;
  box.replaceChildren(p);
  box.dataset.state = 'error';
  $('#import-model').open = true;
}

function importConfigText(text, source) {
  if (typeof state.api.importConfig !== 'function') return;
  let result;
  try {
    result = state.api.importConfig(text);
  } catch (exception) {
    importError(exception, source, 'the config');
    return;
  }
  state.safetensors = null;
  const { setup: current } = readForm();
  const merged = mergeSetup({ ...current, model: {} }, result.setup);
  $('#example').value = '';
  const problems = applySetup(merged);
  const box = $('#import-result');
  box.dataset.state = 'config';
  box.dataset.modelType = result.modelType ?? '';
  const ignored = Array.isArray(result.ignoredFields) ? result.ignoredFields : [];
  box.dataset.ignored = String(ignored.length);
  const head = document.createElement('p');
  head.className = 'ok';
  head.textContent = `Imported ${source}: model_type “${result.modelType ?? '?'}”, ${ignored.length} field${ignored.length === 1 ? '' : 's'} ignored. The architecture fields above are filled in and editable.`;
  const parts = [head];
  if (ignored.length) {
    const details = document.createElement('details');
    const summary = document.createElement('summary');
    summary.textContent = `Ignored fields (${ignored.length})`;
    const list = document.createElement('p');
    list.className = 'hint';
    list.textContent = ignored.join(', ');
    details.append(summary, list);
    parts.push(details);
  }
  for (const note of result.notes ?? []) parts.push(paragraph('hint', note));
  if (problems.length) {
    const p = document.createElement('p');
    p.className = 'field-error';
    p.textContent = `With the current training settings: ${problems.map(errorText).join('; ')}`;
    parts.push(p);
  }
  box.replaceChildren(...parts);
}

function importSafetensorsText(text, source) {
  if (typeof state.api.importSafetensors !== 'function') return;
  let result;
  try {
    result = state.api.importSafetensors(text);
  } catch (exception) {
    importError(exception, source, 'the safetensors data');
    return;
  }
  state.safetensors = { result, source, text };
  renderSafetensors();
}

// dtypes may come as {F16: 148}, [[dtype, count]] or [{dtype, count}]: shown as "F16 × 148".
function dtypeText(dtypes) {
  const entries = Array.isArray(dtypes)
    ? dtypes.map((d) => (Array.isArray(d) ? d : [d.dtype ?? d.id ?? d.name, d.count ?? d.tensors ?? d.tensorCount]))
    : Object.entries(dtypes ?? {});
  return entries.map(([d, n]) => (n === undefined ? String(d) : `${d} × ${formatInteger(Number(n))}`)).join(', ') || '—';
}

// The core's comparison of a safetensors header with a setup's architecture, or null.
function compareWithArchitecture(text, setup) {
  try {
    const r = state.api.importSafetensors(text, setup);
    return typeof r.differenceFromArchitecture === 'number' ? r : null;
  } catch {
    return null;
  }
}

function paragraph(className, text) {
  const p = document.createElement('p');
  p.className = className;
  p.textContent = text;
  return p;
}

function renderSafetensors() {
  const box = $('#import-result');
  const s = state.safetensors;
  if (!s) {
    if (box.dataset.state === 'safetensors') {
      box.replaceChildren();
      delete box.dataset.state;
    }
    return;
  }
  const r = s.result;
  box.dataset.state = 'safetensors';
  box.dataset.source = r.source;
  const head = document.createElement('p');
  head.className = 'ok';
  head.textContent = `Read ${s.source} (${r.source === 'header' ? 'a safetensors header: exact shapes' : 'a safetensors index: tensor names and total size only'}).`;
  const dl = document.createElement('dl');
  const item = (term, value, attrs = {}) => {
    const dt = document.createElement('dt');
    dt.textContent = term;
    const dd = document.createElement('dd');
    dd.append(value);
    Object.assign(dd.dataset, attrs);
    dl.append(dt, dd);
    return dd;
  };
  item('Parameters', r.parameterCount === null || r.parameterCount === undefined
    ? 'not in an index (it lists names and bytes only; drop a .safetensors file for an exact count)'
    : `${formatInteger(r.parameterCount)} (exact)`, { count: String(r.parameterCount ?? '') }).id = 'safetensors-count';
  const size = item('Tensor data', formatBytes(r.totalSizeBytes));
  size.title = bytesTitle(r.totalSizeBytes);
  item('Tensors', formatInteger(r.tensorCount));
  item('dtypes', dtypeText(r.dtypes));
  if (r.numLayers) item('Blocks', formatInteger(r.numLayers));
  if (Array.isArray(r.largestMatrices) && r.largestMatrices.length) {
    item('Largest matrices', r.largestMatrices.map((m) => `${formatInteger(m.rows)}×${formatInteger(m.cols)}`).join(', '));
  }
  const parts = [head, dl];
  // In architecture mode, the header's exact count against the architecture's: the core reads
  // the header again beside the setup last estimated and gives both counts and their difference.
  const compared = state.lastGood && state.lastContext?.kind === state.archKind && state.archKind && typeof r.parameterCount === 'number'
    ? compareWithArchitecture(s.text, state.lastGoodSetup) : null;
  if (compared) {
    const arch = compared.architectureParameterCount;
    const difference = compared.differenceFromArchitecture;
    const p = document.createElement('p');
    p.id = 'safetensors-vs-arch';
    const same = difference === 0;
    p.dataset.match = String(same);
    p.className = same ? 'ok' : 'differs';
    p.textContent = same
      ? `The header's count equals the architecture's count (${formatInteger(arch)}).`
      : `The header's count differs from the architecture's count (${formatInteger(arch)}) by ${difference > 0 ? '+' : '−'}${formatInteger(Math.abs(difference))}.`;
    parts.push(p);
  }
  for (const note of r.notes ?? []) parts.push(paragraph('hint', note));
  if (r.setup) {
    const use = document.createElement('button');
    use.type = 'button';
    use.id = 'safetensors-use';
    use.textContent = 'Use this parameter count (quick mode)';
    use.addEventListener('click', () => {
      const { setup: current } = readForm();
      $('#example').value = '';
      applySetup(mergeSetup({ ...current, model: {} }, r.setup));
      announce('The model is now the checkpoint\'s exact parameter count, in quick mode.');
    });
    const actions = document.createElement('div');
    actions.className = 'actions';
    actions.append(use);
    parts.push(actions);
  }
  box.replaceChildren(...parts);
}

// A .safetensors file starts with its header's length N (8 bytes, little-endian u64) and the
// N bytes of its JSON header; only those are read.
async function readSafetensorsHeader(file) {
  if (file.size < 8) throw new Error('the file is shorter than a safetensors header');
  const view = new DataView(await file.slice(0, 8).arrayBuffer());
  const length = view.getBigUint64(0, true);
  if (length === 0n || length > BigInt(file.size - 8) || length > 512n * 1024n * 1024n) {
    throw new Error(`the first 8 bytes give a header of ${length} bytes, which does not fit the file (${file.size} bytes): not a safetensors file`);
  }
  return new TextDecoder('utf-8', { fatal: true }).decode(await file.slice(8, 8 + Number(length)).arrayBuffer());
}

// Several .safetensors files (the shards of one checkpoint): their headers go to the core as one
// JSON array, which counts them together.
async function importFiles(fileList) {
  const files = [...(fileList ?? [])];
  if (files.length > 1 && files.every((f) => /\.safetensors$/i.test(f.name))) {
    $('#import-model').open = true;
    try {
      const headers = await Promise.all(files.map(readSafetensorsHeader));
      importSafetensorsText(`[${headers.join(',')}]`, `${files.length} shards`);
    } catch (exception) {
      importError(exception, `${files.length} files`, 'the files');
    }
    return;
  }
  return importFile(files[0]);
}

async function importFile(file) {
  if (!file) return;
  $('#import-model').open = true;
  try {
    if (/\.safetensors$/i.test(file.name)) {
      importSafetensorsText(await readSafetensorsHeader(file), file.name);
    } else {
      importText(await file.text(), file.name);
    }
  } catch (exception) {
    importError(exception, file.name, 'the file');
  }
}

function wireDropTarget() {
  const zone = $('#model-fieldset');
  let depth = 0;
  const hasFiles = (event) => [...(event.dataTransfer?.types ?? [])].includes('Files');
  zone.addEventListener('dragenter', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    depth++;
    zone.classList.add('dragging');
  });
  zone.addEventListener('dragover', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
  });
  zone.addEventListener('dragleave', () => {
    depth = Math.max(0, depth - 1);
    if (!depth) zone.classList.remove('dragging');
  });
  zone.addEventListener('drop', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    depth = 0;
    zone.classList.remove('dragging');
    importFiles(event.dataTransfer.files);
  });
  // A file dropped anywhere else must not replace the page (and its state) with the file.
  window.addEventListener('dragover', (event) => { if (hasFiles(event)) event.preventDefault(); });
  window.addEventListener('drop', (event) => { if (hasFiles(event)) event.preventDefault(); });
}

// ---------- solve ----------

function canSolve() {
  return typeof state.api.solve === 'function';
}

function runSolve() {
  if (state.timer) update();
  const { setup, errors } = readForm();
  const status = $('#solve-status');
  if (errors.length || $('#results').dataset.state !== 'ok') {
    status.textContent = 'Fix the setup first: solving starts from a setup the core can estimate.';
    return;
  }
  const button = $('#solve-run');
  button.disabled = true;
  state.solving = true;
  $('#solve').setAttribute('aria-busy', 'true');
  // Progress: the search's elapsed time, and a Cancel that ends it (the worker restarts).
  const started = performance.now();
  const progress = $('#solve-progress');
  progress.hidden = false;
  $('#solve-cancel').disabled = false;
  const tick = () => { status.textContent = `Solving… ${((performance.now() - started) / 1000).toFixed(1)} s`; };
  tick();
  clearInterval(state.solveTicker);
  state.solveTicker = setInterval(tick, 200);
  const done = () => {
    clearInterval(state.solveTicker);
    progress.hidden = true;
    $('#solve-cancel').disabled = true;
    button.disabled = false;
    state.solving = false;
    $('#solve').removeAttribute('aria-busy');
  };
  state.solveDone = done;
  // In a worker: the page keeps answering input while the search runs; a result for a setup
  // that has changed since is shown as stale (markSolveStale), as before.
  state.engine.run('solve', [{ kind: 'solve', setup }], (outcome) => {
    done();
    if (outcome.errors) {
      status.textContent = `The search failed: ${outcome.errors.map(errorText).join('; ')}`;
      return;
    }
    state.solve = { result: outcome.result, setup, ms: outcome.roundTripMs };
    state.solvedFor = JSON.stringify(setup);
    $('#solve').dataset.solveMs = outcome.roundTripMs.toFixed(1);
    $('#solve').dataset.inWorker = String(outcome.inWorker);
    renderSolve();
    const stale = state.solvedFor !== JSON.stringify(readForm().setup);
    status.textContent = stale
      ? 'The setup changed while solving; these results are for the earlier setup. Press Solve again for the current one.'
      : `Solved in ${Math.round(outcome.roundTripMs)} ms${outcome.inWorker ? ' (in a background worker)' : ''}.`;
  });
}

// ---------- views ----------

// After each good estimate: the views of the same setup, from the worker, each drawn as it
// arrives. A newer setup replaces the request; results of replaced requests are dropped.
function scheduleViews(setup) {
  if (state.embed || !state.engine) return;
  const key = JSON.stringify(setup);
  if (key === state.viewsFor && !state.viewsTimer) return;
  clearTimeout(state.viewsTimer);
  $('#views').dataset.stale = 'true';
  $('#views').setAttribute('aria-busy', 'true');
  state.viewsTimer = setTimeout(() => {
    state.viewsTimer = 0;
    state.viewsFor = key;
    const requestedAt = performance.now();
    const timings = [];
    state.engine.run('views', VIEW_KINDS.map((kind) => ({ kind, setup })), (outcome) => {
      const box = $('#views');
      if (outcome.errors) {
        $('#views-status').textContent = `The views failed: ${outcome.errors.map(errorText).join('; ')}`;
      } else {
        state.views[outcome.kind] = outcome.result;
        renderView(outcome.kind);
      }
      box.dataset[`${outcome.kind}Ms`] = outcome.roundTripMs.toFixed(1);
      box.dataset[`${outcome.kind}CoreMs`] = outcome.coreMs.toFixed(1);
      timings.push(`${viewName(outcome.kind)} ${Math.round(outcome.coreMs)} ms`);
      if (outcome.kind === VIEW_KINDS[VIEW_KINDS.length - 1]) {
        box.dataset.stale = 'false';
        box.removeAttribute('aria-busy');
        box.dataset.viewsMs = (performance.now() - requestedAt).toFixed(1);
        box.dataset.inWorker = String(outcome.inWorker);
        $('#views-status').textContent = `(${timings.join(', ')}${outcome.inWorker ? ', in a background worker' : ', on the page'}.)`;
      }
    });
  }, VIEWS_DELAY_MS);
}

function cancelViews() {
  clearTimeout(state.viewsTimer);
  state.viewsTimer = 0;
  state.viewsFor = '';
  state.engine?.cancel('views');
  const box = $('#views');
  if (box) {
    box.dataset.stale = 'true';
    box.removeAttribute('aria-busy');
  }
}

function viewName(kind) {
  return { heatMap: 'heat map', curves: 'curves', gpuMatrix: 'GPU matrix' }[kind] ?? kind;
}

function renderView(kind) {
  const result = state.views[kind];
  if (!result) return;
  if (kind === 'heatMap') renderHeatMap($('#heatmap'), result, { readout: $('#heatmap-readout'), onApply: applyPartial });
  else if (kind === 'curves') renderCurves($('#curves'), result);
  else if (kind === 'gpuMatrix') renderGpuMatrix($('#gpu-matrix'), result, { currentGpuId: state.gpuId, onApply: applyPartial });
}

function renderViews() {
  for (const kind of VIEW_KINDS) renderView(kind);
}

function solveApplyButton(text, label, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = text;
  b.setAttribute('aria-label', label);
  b.addEventListener('click', onClick);
  return b;
}

function applyPartial(change, what) {
  const { setup } = readForm();
  $('#example').value = '';
  const problems = applySetup(mergeSetup(setup, change));
  announce(problems.length ? `Applied ${what}, with problems: ${problems.map(errorText).join('; ')}` : `Applied ${what}.`);
}

function renderSolve() {
  const box = $('#solve-results');
  const solved = state.solve;
  box.hidden = !solved;
  if (!solved) return;
  const { result } = solved;
  const fill = (id, entry, unit, field, extra) => {
    const item = $(id);
    const value = $('.solve-value', item);
    const hint = $('.hint', item);
    item.querySelector('button')?.remove();
    if (!entry) {
      value.textContent = 'none';
      delete item.dataset.value;
      hint.textContent = `Even ${unit === 'samples' ? 'one sample' : 'the shortest sequence'} does not fit this GPU.`;
      return;
    }
    item.dataset.value = String(entry.value);
    value.textContent = `${formatInteger(entry.value)} ${unit}`;
    hint.textContent = `Peak ${formatBytes(entry.peakBytes)}${extra ? ` · ${extra(entry)}` : ''}.`;
    hint.title = bytesTitle(entry.peakBytes);
    const current = solved.setup.training[field];
    if (entry.value !== current) {
      item.append(solveApplyButton(`Use ${formatInteger(entry.value)}`, `Use ${field === 'batchSize' ? 'batch size' : 'sequence length'} ${entry.value}`,
        () => applyPartial({ training: { [field]: entry.value } }, `${field === 'batchSize' ? 'batch size' : 'sequence length'} ${entry.value}`)));
    }
  };
  const limitNote = (what) => (e) => (e.limit !== undefined && e.limit !== null && e.value >= e.limit ? `the search stops at ${formatInteger(e.limit)} ${what}` : '');
  fill('#solve-batch', result.maxBatchSize, 'samples', 'batchSize', limitNote('samples'));
  fill('#solve-seq', result.maxSequenceLength, 'tokens', 'sequenceLength', limitNote('tokens (the position table or the search\'s bound)'));
  const list = $('#solve-suggestions');
  const suggestions = Array.isArray(result.suggestions) ? result.suggestions : [];
  list.replaceChildren(...suggestions.map((s) => {
    const li = document.createElement('li');
    li.dataset.id = s.id;
    li.dataset.fits = String(Boolean(s.fits));
    const label = document.createElement('strong');
    label.textContent = s.label;
    const saved = document.createElement('span');
    saved.textContent = ` — saves ${formatBytes(s.savedBytes)}, peak ${formatBytes(s.peakBytes)} `;
    saved.title = `${bytesTitle(s.savedBytes)} saved; peak ${bytesTitle(s.peakBytes)}`;
    const fits = document.createElement('span');
    fits.className = s.fits ? 'fits-yes' : 'fits-no';
    fits.textContent = s.fits ? 'fits' : 'still does not fit';
    li.append(label, saved, fits, solveApplyButton('Apply', `Apply: ${s.label}`, () => applyPartial(s.change, `“${s.label}”`)));
    if (s.tradeoff) {
      const tradeoff = document.createElement('span');
      tradeoff.className = 'tradeoff';
      tradeoff.textContent = `Cost: ${s.tradeoff}`;
      li.append(tradeoff);
    }
    return li;
  }));
  if (!suggestions.length) {
    const li = document.createElement('li');
    li.textContent = 'No single change found.';
    list.append(li);
  }
  box.dataset.stale = String(state.solvedFor !== JSON.stringify(readForm().setup));
}

// ---------- start ----------

function buildControls(options) {
  const examples = Array.isArray(options.examples)
    ? options.examples
    : Object.entries(options.examples ?? {}).map(([id, setup]) => ({ id, label: id, setup }));
  state.examples = examples;
  const kinds = options.modelKinds;
  state.quickKind = kinds.find((k) => k.id === 'parameterCount')?.id ?? kinds[0]?.id;
  state.layersKind = kinds.find((k) => k.id === 'layers')?.id ?? kinds.find((k) => k.id !== state.quickKind)?.id ?? 'layers';
  state.archKind = kinds.find((k) => k.id === 'transformer')?.id ?? '';

  const group = $('#model-kinds');
  group.replaceChildren(...kinds.map((k, i) => {
    const label = document.createElement('label');
    const radio = document.createElement('input');
    radio.type = 'radio';
    radio.name = 'modelKind';
    radio.value = k.id;
    radio.id = `modelKind-${i}`;
    label.append(radio, k.label);
    return label;
  }));
  fillSelect($('#example'), examples, 'Load an example…');
  fillSelect($('#add-layer-type'), options.layerTypes);
  fillSelect($('#loss'), options.losses);
  fillSelect($('#precision'), options.precisions);
  fillSelect($('#optimizer'), options.optimizers);
  fillSelect($('#optimizerImplementation'), options.optimizerImplementations);
  fillSelect($('#attention'), options.attentions ?? []);
  fillSelect($('#checkpointing'), options.checkpointings ?? []);
  // Each preset with the count its model card publishes, so the list itself says what it is.
  $('#preset').replaceChildren(new Option('Custom architecture', ''), ...(options.presets ?? []).map((p) =>
    new Option(`${p.label} — ${formatInteger(p.publishedParameters)} parameters`, p.id)));
  fillSelect($('#arch-family'), options.families ?? []);
  buildArchFields();
  buildRuntimeFields();
  buildGpuSelect();
  $('#import-model').hidden = !canImport();
  $('#solve').hidden = !canSolve();
  $('#views').hidden = typeof state.api.heatMap !== 'function';
}

function wireEvents() {
  const form = $('#setup-form');
  form.addEventListener('submit', (e) => e.preventDefault());
  $('#layer-list').addEventListener('input', onLayerListInput);
  $('#layer-list').addEventListener('click', onLayerListClick);
  form.addEventListener('input', (event) => {
    const target = event.target;
    if (target.id === 'example' || target.id === 'import-file' || target.id === 'add-layer-type') return;
    $('#example').value = '';
    state.inputAt = performance.now();
    if (target.name === 'modelKind') onKindChange();
    if (target.id === 'parameterCount') showParameterHint();
    if (target.id === 'preset') onPresetChange();
    else if (target.id === 'arch-family') onFamilyChange();
    else if (target.closest('#arch-fields')) onArchFieldInput();
    if (target.id === 'checkpointing') showTrainingOptions();
    if (target.id === 'gpu') onGpuChange();
    if (target.id === 'memoryGiB') syncGpuSelect();
    // The import box's text is not part of the setup.
    if (target.id === 'config-text' || target.id === 'model-file') return;
    if (target.type === 'text' || target.id === 'layer-json') scheduleUpdate();
    else update();
  });
  $('#example').addEventListener('change', (e) => loadExample(e.target.value));
  $('#add-layer').addEventListener('click', addLayer);
  $('#export').addEventListener('click', exportSetup);
  $('#import').addEventListener('click', () => $('#import-file').click());
  $('#import-file').addEventListener('change', (e) => {
    importSetup(e.target.files?.[0]);
    e.target.value = '';
  });
  for (const radio of $$('input[name=units]')) radio.addEventListener('change', () => setUnits(radio.value));
  $('#compare-pin').addEventListener('click', onPin);
  $('#compare-clear').addEventListener('click', onClearCompare);
  $('#compare-swap').addEventListener('click', onSwapCompare);
  $('#results').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-export]');
    if (button) onExport(button.dataset.export);
    const explain = event.target.closest('button.explain-all');
    if (explain) toggleExplainAll(explain);
  });
  $('#import-config').addEventListener('click', () => {
    const text = $('#config-text').value;
    if (!text.trim()) {
      $('#import-result').textContent = 'Paste the text of a config.json first.';
      return;
    }
    importText(text, 'the pasted JSON');
  });
  $('#open-model-file').addEventListener('click', () => $('#model-file').click());
  $('#model-file').addEventListener('change', (e) => {
    importFiles(e.target.files);
    e.target.value = '';
  });
  wireDropTarget();
  state.snapshot = wireSnapshot({ api: state.api, getSetup: () => state.lastGoodSetup });
  $('#solve-run').addEventListener('click', runSolve);
  $('#solve-cancel').addEventListener('click', () => {
    if (!state.solving) return;
    state.engine.stop('solve');
    state.solveDone?.();
    $('#solve-status').textContent = 'Cancelled: the search was stopped.';
    $('#solve-run').focus();
  });
  $('#reset').addEventListener('click', () => {
    $('#example').value = '';
    applySetup(state.options.defaultSetup);
    ioStatus('Reset to the defaults.');
  });
  window.addEventListener('hashchange', () => {
    if (location.hash !== state.lastHash) loadFromHash();
  });
  let frame = 0;
  // Charts are drawn to the width they get; only a new width redraws them (a taller results
  // column, say from the chart's own readout, must not replace the chart under the keyboard).
  new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => {
      if (state.lastGood && $('#timeline-chart').clientWidth !== state.chartWidth) drawCharts(state.lastGood);
      else if (state.compare) drawCompareChart();
    });
  }).observe($('#results'));
}

async function start() {
  const status = $('#load-status');
  try {
    state.api = await loadGpumem();
    state.options = state.api.options();
  } catch (exception) {
    status.textContent = `The calculator could not start: ${exception?.message ?? exception}`;
    status.className = 'field-error';
    console.error(exception);
    return;
  }
  const params = new URLSearchParams(location.search);
  state.embed = params.get('embed') === '1';
  // ?worker=0 runs the long calls on the page's thread (the fallback when no worker can start).
  if (!state.embed) state.engine = createEngine(state.api, { useWorker: typeof Worker === 'function' && params.get('worker') !== '0' });
  document.body.classList.toggle('embed', state.embed);
  buildControls(state.options);
  wireEvents();
  $('#version').textContent = `version ${state.options.version ?? state.api.version ?? '?'}`;
  loadFromHash();
  $('#controls').disabled = false;
  status.textContent = 'Ready';
  document.body.dataset.ready = 'true';
}

start();
