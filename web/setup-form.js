// The setup form: the setup written into the controls and read back from them.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { formatInteger } from './charts.js';
import { syncModelSearch } from './first-screen.js';
import { fillFinetune, finetuneFields, readFinetune } from './finetune-panel.js';
import { fieldHoldsGpu, gpuById, gpuCapacityField, listedGpuOf, syncGpuSelect } from './gpu-panel.js';
import { readLayers, renderLayers } from './layers-panel.js';
import { fillArchitecture, presetById, readArchitecture } from './model-panel.js';
import { $, $$, displayNumber, numberValue, parseMatrices, parseNumberText, state } from './page-state.js';
import { fillRuntime, readRuntime } from './runtime-panel.js';
import { fillParallel, parallelAvailable, readParallel } from './parallel-panel.js';
import { fillSavers, readSavers } from './savers-panel.js';

// ---------- setup <-> form ----------

export function isPlainObject(x) {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

// Overlays a partial setup on the defaults (arrays replace), as the core does for absent fields.
export function mergeSetup(base, over) {
  if (!isPlainObject(over)) return base;
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) out[k] = isPlainObject(v) && isPlainObject(base?.[k]) ? mergeSetup(base[k], v) : v;
  return out;
}

export function fillSelect(select, items, placeholder) {
  select.replaceChildren();
  if (placeholder) select.append(new Option(placeholder, ''));
  for (const item of items) select.append(new Option(item.label, item.id));
}

export function setSelectValue(select, value) {
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

export function currentKind() {
  return $('input[name=modelKind]:checked')?.value ?? state.quickKind;
}

export function showKindPanels() {
  const kind = currentKind();
  const layers = kind === state.layersKind;
  const arch = Boolean(state.archKind) && kind === state.archKind;
  $('#quick-panel').hidden = layers || arch;
  $('#layers-panel').hidden = !layers;
  $('#arch-panel').hidden = !arch;
  showTrainingOptions();
}

// Attention and checkpointing only change a traced transformer; k only matters for every-k-th.
export function showTrainingOptions() {
  $('#transformer-training').hidden = !state.archKind || currentKind() !== state.archKind;
  $('#checkpointInterval-field').hidden = $('#checkpointing').value !== 'everyKthBlock';
}

// fillForm's presetId is the preset the setup named: a validated setup no longer names it (the
// core has merged it into the architecture).
export function fillForm(setup, presetId) {
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
  const listed = listedGpuOf(gpu);
  $('#memoryGiB').value = listed ? gpuCapacityField(listed) : displayNumber(gpu.memoryGiB);
  fillRuntime(setup.runtime);
  fillSavers(setup.training);
  if (finetuneFields().length) fillFinetune(setup.finetune);
  if (parallelAvailable()) fillParallel(setup.parallel);
  state.gpuId = gpuById(gpu.id)?.id ?? '';
  showKindPanels();
  showParameterHint();
  syncGpuSelect();
  syncModelSearch();
  // Quick mode, a layer list or a custom architecture are described in the fold: it opens for
  // them; a preset's fields stay folded (the search box names the preset).
  if (model.kind !== state.archKind || !presetById($('#preset').value)) $('#model-details').open = true;
}

// The listed GPU with its exact capacity while the size field shows it (syncGpuSelect); an id
// the list lacks (a link's) as it is, for the core to name; else a custom size.
function readGpu() {
  const listed = gpuById(state.gpuId);
  if (listed && fieldHoldsGpu($('#memoryGiB').value, listed)) return { id: listed.id, memoryGiB: listed.memoryGiB };
  return state.gpuId ? { id: state.gpuId, memoryGiB: numberValue($('#memoryGiB')) } : { memoryGiB: numberValue($('#memoryGiB')) };
}

// The setup the form describes, in the schema's shape. Only the active model mode's fields are
// written: the other mode's fields would be ignored by the core anyway.
export function readForm() {
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
    // A GPU of the list is named by its id; its exact size is written too (the field shows it
    // rounded), so the setup reads the same without the list.
    gpu: readGpu(),
  };
  Object.assign(setup.training, readSavers());
  setup.runtime = readRuntime();
  if (finetuneFields().length && isPlainObject(state.options.defaultSetup.finetune)) setup.finetune = readFinetune();
  if (parallelAvailable()) setup.parallel = readParallel();
  return { setup, errors };
}

export function showParameterHint() {
  const hint = $('#parameterCount-hint');
  const n = parseNumberText($('#parameterCount').value);
  hint.textContent = Number.isFinite(n) && n > 0
    ? `= ${formatInteger(n)} parameters`
    : 'Accepts 1.5e9, 1,500,000,000 or 1.5B.';
}
