// The comparison of a pinned setup A with the current setup B.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { bytesTitle, comparisonBars, formatBytes, formatInteger } from './charts.js';
import { decodeSetupParam } from './setup-params.js';
import { update } from './app.js';
import { errorText, errorsOf } from './errors.js';
import { announce } from './export-panel.js';
import { gpuById } from './gpu-panel.js';
import { applySetup, ioStatus, writeHash } from './link.js';
import { matchingPreset, presetById } from './model-panel.js';
import { $, state } from './page-state.js';
import { categoryIndex, categoryLabel, cell, gpuCaption } from './results-panel.js';
import { isPlainObject, readForm } from './setup-form.js';

// ---------- comparison ----------

export function loadCompareFrom(text) {
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

export function onPin() {
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

export function onClearCompare() {
  state.compare = null;
  renderCompare();
  writeHash();
  $('#compare-pin').focus();
  announce('Comparison cleared.');
}

// Loads A into the editor; the current setup becomes the pinned one.
export function onSwapCompare() {
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
export function describeSetup(original, shown, est) {
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

export function renderCompare() {
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

export function drawCompareChart() {
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
