// The gpumem page: a form for a training setup, and the core's estimate drawn beside it.
//
// Every byte count shown comes from the core (through ./gpumem.js); this module only parses
// what a person typed, formats numbers and draws. Enum lists, labels, defaults and examples come
// from options(), so nothing here re-types them. The setup (docs/schema.md) is also the URL
// state and the export/import format.

import { loadGpumem, GpumemError } from './gpumem.js';
import { capacityBar, timelineChart, formatBytes, formatGB, formatExactBytes, formatInteger } from './charts.js';

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

// Per layer type, the schema fields the editor shows: [field, label, kind]. The schema lists
// which fields belong to which type; options() only names the types.
const LAYER_FIELDS = {
  embedding: [['numEmbeddings', 'Vocabulary (rows)', 'count'], ['embeddingDim', 'Width', 'count']],
  linear: [['inFeatures', 'In features', 'count'], ['outFeatures', 'Out features', 'count'], ['bias', 'Bias', 'bool']],
  dropout: [['p', 'Dropout p', 'number']],
};

// The architecture's fields (model.architecture.*): [field, label, kind, hint, shown(arch)].
// kind is 'count', 'number', 'bool' or 'select:<options list>'. shown() says which families use
// the field (the schema's comments, core/include/gpumem/setup.hpp); a field whose value differs
// from the family's default is shown anyway, so no setting the core uses is ever invisible.
const ALL = () => true;
const LLAMA = (a) => a.family === 'llama';
const MOE = (a) => a.family === 'llama' && Number(a.numExperts) > 0;
const ARCH_FIELDS = [
  ['vocabSize', 'Vocabulary', 'count', 'tokens (embedding rows)', ALL],
  ['hiddenSize', 'Hidden size', 'count', 'elements per token', ALL],
  ['numLayers', 'Blocks', 'count', 'transformer layers', ALL],
  ['numHeads', 'Attention heads', 'count', 'query heads', ALL],
  ['numKeyValueHeads', 'Key/value heads', 'count', '0 = numHeads (grouped-query attention when fewer)', LLAMA],
  ['headDim', 'Head dimension', 'count', 'elements; 0 = hiddenSize / numHeads', LLAMA],
  ['intermediateSize', 'MLP width', 'count', 'elements; 0 = 4 × hiddenSize', ALL],
  ['maxPositionEmbeddings', 'Position table', 'count', 'positions (rows); at least the sequence length', (a) => a.family !== 'llama'],
  ['typeVocabSize', 'Token types', 'count', 'rows of the token-type table', (a) => a.family === 'bert'],
  ['hiddenAct', 'Activation', 'select:hiddenActs', '', ALL],
  ['hiddenDropout', 'Hidden dropout', 'number', 'probability, 0 ≤ p < 1; 0 keeps no mask', (a) => a.family !== 'llama'],
  ['attentionDropout', 'Attention dropout', 'number', 'probability, 0 ≤ p < 1', ALL],
  ['encoderHead', 'Training head', 'select:encoderHeads', '', (a) => a.family === 'bert'],
  ['numLabels', 'Classes', 'count', 'outputs of the classifier', (a) => a.family === 'bert' && a.encoderHead === 'classification'],
  ['tieWordEmbeddings', 'Output head shares the token embedding (tied)', 'bool', '', (a) => a.family !== 'bert'],
  ['attentionBias', 'q/k/v projections have biases (Qwen2)', 'bool', '', LLAMA],
  ['numExperts', 'Experts', 'count', '0 = dense MLP (mixture of experts when more)', LLAMA],
  ['expertsPerToken', 'Experts per token', 'count', 'top-k routing', MOE],
  ['expertIntermediateSize', 'Expert MLP width', 'count', 'elements; 0 = intermediateSize', MOE],
  ['sharedExpertIntermediateSize', 'Shared expert width', 'count', 'elements; 0 = no shared expert', MOE],
  ['sharedExpertGate', 'Sigmoid gate on the shared expert', 'bool', '', (a) => MOE(a) && Number(a.sharedExpertIntermediateSize) > 0],
];

const TYPING_DELAY_MS = 150;
// An update (estimate + render) slower than this makes the page wait longer after the last
// keystroke, so typing "4096" runs one estimate, not four. A 32-block model traces ~14k events;
// its estimate takes 40–110 ms in headless Chromium, more on a slow machine.
const SLOW_UPDATE_MS = 150;
const MAX_TYPING_DELAY_MS = 600;
const LARGEST_EVENTS = 8;

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
  showKindPanels();
  showParameterHint();
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
    gpu: { memoryGiB: numberValue($('#memoryGiB')) },
  };
  return { setup, errors };
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
  $('#arch-fields').replaceChildren(...ARCH_FIELDS.map(([key, label, kind, hint]) => {
    const id = `arch-${key}`;
    const wrap = document.createElement('div');
    wrap.dataset.archKey = key;
    const lab = document.createElement('label');
    lab.htmlFor = id;
    lab.textContent = label;
    let input;
    if (kind.startsWith('select:')) {
      input = document.createElement('select');
      fillSelect(input, state.options[kind.slice('select:'.length)] ?? []);
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
    wrap.className = kind.startsWith('select:') ? 'field wide' : 'field';
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
  for (const [key, , kind] of ARCH_FIELDS) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') arch[key] = input.checked;
    else if (kind.startsWith('select:')) arch[key] = input.value;
    else arch[key] = numberValue(input);
  }
  return arch;
}

function fillArchitecture(arch, presetId) {
  setSelectValue($('#arch-family'), arch.family);
  for (const [key, , kind] of ARCH_FIELDS) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') input.checked = Boolean(arch[key]);
    else if (kind.startsWith('select:')) setSelectValue(input, arch[key]);
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
  for (const [key, , , , shown] of ARCH_FIELDS) {
    $(`[data-arch-key="${key}"]`).hidden = !(shown(arch) || (key in defaults && arch[key] !== defaults[key]));
  }
}

function onPresetChange() {
  const preset = presetById($('#preset').value);
  if (preset) fillArchitecture(preset.architecture, preset.id);
  else showPresetHint();  // "custom": the values stay as they are
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

function renderLayers(layers) {
  const list = $('#layer-list');
  list.replaceChildren();
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
  layers.push(templateLayer($('#add-layer-type').value, layers));
  renderLayers(layers);
  $(`#layer-${layers.length - 1}-type`).focus();
  update();
}

// ---------- errors ----------

function clearErrors() {
  const box = $('#errors');
  box.hidden = true;
  box.replaceChildren();
  for (const el of $$('[aria-invalid=true]')) el.removeAttribute('aria-invalid');
  for (const el of $$('[data-invalid=true]')) el.removeAttribute('data-invalid');
  for (const el of $$('.field-error')) el.remove();
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

function toBase64Url(text) {
  let binary = '';
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function fromBase64Url(text) {
  let b64 = text.replace(/-/g, '+').replace(/_/g, '/');
  while (b64.length % 4) b64 += '=';
  const binary = atob(b64);
  return new TextDecoder('utf-8', { fatal: true }).decode(Uint8Array.from(binary, (c) => c.charCodeAt(0)));
}

// The setup from "#s=<base64url of the JSON>" (or of URI-encoded JSON, for hand-written
// links); null when the hash holds none; throws when it holds one that cannot be read.
function setupFromHash(hash) {
  const value = new URLSearchParams(hash.replace(/^#/, '')).get('s');
  if (!value) return null;
  const text = value.trimStart().startsWith('{') ? value : fromBase64Url(value);
  return JSON.parse(text);
}

function writeHash(setup) {
  const hash = `#s=${toBase64Url(JSON.stringify(setup))}`;
  state.lastHash = hash;
  if (location.hash === hash) return;
  try {
    history.replaceState(null, '', hash);
  } catch {
    location.replace(hash);
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
  $('#results').removeAttribute('aria-busy');
  const started = performance.now();
  const { setup, errors } = readForm();
  writeHash(setup);
  clearErrors();
  if (errors.length) {
    showErrors(errors);
    setResultsState(state.lastGood ? 'stale' : 'empty');
    return;
  }
  let estimate;
  try {
    estimate = state.api.estimate(setup);
  } catch (exception) {
    if (!(exception instanceof GpumemError)) console.error(exception);
    showErrors(errorsOf(exception));
    setResultsState(state.lastGood ? 'stale' : 'empty');
    return;
  }
  const estimated = performance.now();
  state.lastGood = estimate;
  state.lastContext = { kind: setup.model.kind, presetId: setup.model.preset ?? '', family: setup.model.architecture?.family };
  render(estimate);
  setResultsState('ok');
  recordTiming(started, estimated);
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
  human.title = formatGB(bytes);
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
    tr.append(categoryCell(row, heuristic), ...bytesCells(row.bytes), cell(row.formula ?? '', 'formula'));
    body.append(tr);
  }
  const foot = $('tfoot', table);
  const tr = document.createElement('tr');
  const [human, exact] = bytesCells(total);
  exact.id = totalId;
  tr.append(cell(totalLabel), human, exact, cell(''));
  foot.replaceChildren(tr);
}

function render(est) {
  const peak = est.peak;
  const gpu = est.gpu;
  const heuristic = Boolean(est.activationsFromHeuristic);

  const total = $('#peak-total');
  total.textContent = formatBytes(peak.totalBytes);
  total.dataset.bytes = String(peak.totalBytes);
  $('#peak-exact').textContent = `${formatExactBytes(peak.totalBytes)} · ${formatGB(peak.totalBytes)}`;
  const stepText = peak.step > 0 ? ` of step ${peak.step}` : '';
  $('#peak-where').textContent = `During ${phaseLabel(peak.phase)}${stepText}, at event #${peak.eventIndex}: ${peak.label}`;
  $('#peak-where').dataset.phase = peak.phase;
  $('#heuristic-note').hidden = !heuristic;

  const verdict = $('#verdict');
  verdict.dataset.fits = String(Boolean(gpu.fits));
  verdict.dataset.headroomBytes = String(gpu.headroomBytes);
  const headline = document.createElement('span');
  headline.textContent = gpu.fits ? 'Fits' : 'Does not fit';
  const sub = document.createElement('span');
  sub.className = 'sub';
  sub.textContent = gpu.fits
    ? `${formatBytes(gpu.headroomBytes)} headroom on ${formatBytes(gpu.capacityBytes)}`
    : `${formatBytes(Math.abs(gpu.headroomBytes))} short of ${formatBytes(gpu.capacityBytes)}`;
  sub.title = `${formatExactBytes(gpu.headroomBytes)} headroom (capacity ${formatExactBytes(gpu.capacityBytes)})`;
  verdict.replaceChildren(headline, sub);

  // Breakdown at the peak.
  const segments = peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  const legend = $('#capacity-legend');
  legend.replaceChildren(...segments.filter((s) => s.bytes > 0).map((s) => {
    const li = document.createElement('li');
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${s.colorIndex}`;
    li.append(swatch, `${s.label} ${formatBytes(s.bytes)}`);
    return li;
  }));
  fillBytesTable($('#peak-table'), peak.byCategory, peak.totalBytes, 'Total at the peak', 'peak-table-total', heuristic);

  // Model states.
  const states = est.modelStates;
  const count = $('#param-count');
  count.textContent = formatInteger(states.parameterCount);
  count.dataset.count = String(states.parameterCount);
  showParameterSource(states, state.lastContext ?? {});
  fillBytesTable($('#states-table'), states.rows, states.totalBytes, 'Model states', 'states-total', false);

  // Phase peaks.
  const phaseBody = $('#phase-table tbody');
  phaseBody.replaceChildren(...est.phasePeaks.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.phase = p.phase;
    const size = cell(formatBytes(p.totalBytes), 'num');
    size.title = formatExactBytes(p.totalBytes);
    size.dataset.bytes = String(p.totalBytes);
    const bar = document.createElement('div');
    bar.className = 'phase-bar';
    const share = peak.totalBytes > 0 ? (p.totalBytes / peak.totalBytes) * 100 : 0;
    bar.style.width = `${Math.max(0, Math.min(100, share)).toFixed(1)}%`;
    const where = p.step > 0 ? `step ${p.step}: ${p.label}` : p.label;
    tr.append(cell(phaseLabel(p.phase)), size, cell(bar, 'bar-cell'), cell(where));
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
}

// Where the parameter count comes from, and for a preset the count its model card publishes.
function showParameterSource(states, context) {
  const counted = states.parameterCount;
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
  const difference = counted - preset.publishedParameters;
  const verdict = document.createElement('span');
  verdict.className = difference === 0 ? 'match' : 'differs';
  verdict.textContent = difference === 0 ? 'the count above matches it'
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
    size.title = formatExactBytes(p.deltaBytes);
    size.dataset.bytes = String(p.deltaBytes);
    const total = cell(formatBytes(p.totalBytes), 'num');
    total.title = formatExactBytes(p.totalBytes);
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
      if (row) td.title = `${formatExactBytes(row.bytes)}: ${row.formula}`;
      return td;
    }));
    return tr;
  }));
}

function drawCharts(est) {
  const barBox = $('#capacity-bar');
  const segments = est.peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  barBox.replaceChildren(capacityBar(segments, est.gpu.capacityBytes, {
    width: Math.max(barBox.clientWidth, 280), peakLabel: `peak ${formatBytes(est.peak.totalBytes)}`,
  }));
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

function loadFromHash() {
  try {
    const fromHash = setupFromHash(location.hash);
    if (fromHash) {
      const problems = applySetup(fromHash);
      ioStatus(problems.length ? `The link's setup has problems: ${problems.map(errorText).join('; ')}` : '');
      return;
    }
  } catch (exception) {
    ioStatus(`The setup in this link could not be read (${exception.message}); showing the defaults.`, true);
  }
  applySetup(state.options.defaultSetup);
}

function ioStatus(text, isError = false) {
  const el = $('#io-status');
  el.textContent = text;
  el.className = isError ? 'field-error' : 'hint';
}

function exportSetup() {
  const { setup } = readForm();
  const blob = new Blob([`${JSON.stringify(setup, null, 2)}\n`], { type: 'application/json' });
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = 'gpumem-setup.json';
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
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
  if (currentKind() === state.layersKind && $$('#layer-list > li').length === 0) {
    const example = state.examples.find((e) => e.setup?.model?.kind === state.layersKind);
    if (example) {
      renderLayers(example.setup.model.layers ?? []);
      if (example.setup.model.loss) setSelectValue($('#loss'), example.setup.model.loss);
    }
  }
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
    if (target.type === 'text') scheduleUpdate();
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
  buildControls(state.options);
  wireEvents();
  $('#version').textContent = `version ${state.options.version ?? state.api.version ?? '?'}`;
  loadFromHash();
  $('#controls').disabled = false;
  status.textContent = 'Ready';
  document.body.dataset.ready = 'true';
}

start();
