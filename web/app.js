// The gpumem page: a form for a training setup, and the core's estimate drawn beside it.
//
// Every byte count shown comes from the core (through ./gpumem.js); this module only parses
// what a person typed, formats numbers and draws. Enum lists, labels, defaults and examples come
// from options(), so nothing here re-types them. The setup (docs/schema.md) is also the URL
// state and the export/import format.

import { formatInteger } from './charts.js';
import { buildFinetuneFields, modeSelectIsFinetune, onFinetuneInput, onModeChange } from './finetune-panel.js';
import { buildFirstScreen, firstVisitSetup, onModelSearch, precisionItems, syncModelSearch } from './first-screen.js';
import { createEngine } from './engine.js';
import { GpumemError, loadGpumem } from './gpumem.js';
import { wireSnapshot } from './snapshot.js';
import { drawCompareChart, onClearCompare, onPin, onSwapCompare } from './compare-panel.js';
import { clearErrors, errorsOf, setResultsState, showErrors } from './errors.js';
import { onExport, toggleExplainAll } from './export-panel.js';
import { buildGpuSelect, onGpuChange, setUnits, syncGpuSelect } from './gpu-panel.js';
import { canImport, importFiles, importText, renderSafetensors, wireDropTarget } from './import-panel.js';
import { addLayer, onLayerListClick, onLayerListInput } from './layers-panel.js';
import { applySetup, exportSetup, importSetup, ioStatus, loadExample, loadFromHash, onKindChange, showParamProblems, writeHash } from './link.js';
import { buildArchFields, onArchFieldInput, onFamilyChange, onPresetChange } from './model-panel.js';
import { $, $$, MAX_TYPING_DELAY_MS, SLOW_UPDATE_MS, TYPING_DELAY_MS, state } from './page-state.js';
import { drawCharts, markScrollingTables, render } from './results-panel.js';
import { buildParallelFields, parallelImport, parallelRunFewest, parallelRunLayouts, renderParallel, wireParallelDrop } from './parallel-panel.js';
import { buildRuntimeFields } from './runtime-panel.js';
import { buildSaverFields } from './savers-panel.js';
import { fillSelect, readForm, showParameterHint, showTrainingOptions } from './setup-form.js';
import { canSolve, runSolve } from './solve-panel.js';
import { cancelViews, scheduleViews } from './views-panel.js';

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

export function update() {
  clearTimeout(state.timer);
  state.timer = 0;
  $('#results').removeAttribute('aria-busy');
  const started = performance.now();
  const { setup, errors } = readForm();
  syncModelSearch();
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
  // The results are shown before they are drawn, so the charts measure the width they will have:
  // the first result used to be drawn into a hidden box (data-state=empty: display none), 280
  // px wide, and drawn again at its real width one frame later. (Nothing can observe the state
  // between here and the end of this function: it all runs in one task.)
  setResultsState('ok');
  render(estimate);
  renderParallel(estimate);
  renderSafetensors();
  state.snapshot?.refresh();  // a dropped PyTorch snapshot, compared with this estimate
  scheduleViews(setup);
  if (state.embed) showParamProblems(state.paramProblems ?? []);
  recordTiming(started, estimated);
  stampShown();
}

export function failed(errors) {
  showErrors(errors);
  cancelViews();
  setResultsState(state.lastGood ? 'stale' : 'empty');
  if (state.embed) showParamProblems([...(state.paramProblems ?? []), ...errors]);
  stampShown();
}

// When the answer (or the errors) reached the screen, in ms since the page's navigation began:
// a task queued from the next animation frame runs after that frame's layout and paint. Kept on
// #results as data-shown-at-ms; the browser tests' time bounds read it (tests/browser/bounds).
function stampShown() {
  const results = $('#results');
  delete results.dataset.shownAtMs;
  requestAnimationFrame(() => setTimeout(() => { results.dataset.shownAtMs = performance.now().toFixed(1); }, 0));
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
  fillSelect($('#precision'), precisionItems(options.precisions));
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
  buildFirstScreen();
  buildFinetuneFields();
  buildParallelFields();
  buildSaverFields();
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
    // The search box is not a setup field: it changes the setup only when it names a preset.
    if (target.id === 'model-search') {
      if (onModelSearch()) update();
      return;
    }
    $('#example').value = '';
    $('#change-note').hidden = true;  // "Applied …" no longer describes what is shown
    state.inputAt = performance.now();
    if (target.name === 'modelKind') onKindChange();
    if (target.id === 'parameterCount') showParameterHint();
    if (target.id === 'preset') onPresetChange();
    else if (target.id === 'arch-family') onFamilyChange();
    else if (target.closest('#arch-fields')) onArchFieldInput();
    if (target.id === 'checkpointing') showTrainingOptions();
    if (target.id === 'training-mode' && modeSelectIsFinetune()) onModeChange();
    if (target.closest('#finetune-fields')) onFinetuneInput();
    if (target.id === 'gpu') onGpuChange();
    if (target.id === 'memoryGiB') syncGpuSelect();
    // The import box's text is not part of the setup.
    if (target.id === 'config-text' || target.id === 'model-file' || target.id === 'parallel-deepspeed' || target.id === 'parallel-megatron' || target.id === 'parallel-accelerate' || target.id === 'parallel-layouts-gpus') return;
    if (target.type === 'text' || target.id === 'layer-json') scheduleUpdate();
    else update();
  });
  $('#example').addEventListener('change', (e) => loadExample(e.target.value));
  $('#model-search').addEventListener('keydown', (event) => {
    if (event.key !== 'Enter') return;
    event.preventDefault();
    state.inputAt = performance.now();
    if (onModelSearch({ final: true })) update();
  });
  $('#model-search').addEventListener('change', () => {
    if (onModelSearch({ final: true })) update();
  });
  $('#pinned-verdict').addEventListener('click', () => {
    $('#results').scrollIntoView({ block: 'start' });
    $('#verdict').setAttribute('tabindex', '-1');
    $('#verdict').focus({ preventScroll: true });
  });
  $('#open-import').addEventListener('click', () => {
    const box = $('#import-model');
    $('#model-details').open = true;
    box.open = true;
    box.scrollIntoView({ block: 'center' });
    $('#config-text').focus();
  });
  $('#add-layer').addEventListener('click', addLayer);
  // Many GPUs: the imports and the fewest-GPUs search replace the setup through applySetup.
  $('#parallel-deepspeed-apply').addEventListener('click', () => parallelImport('deepspeed', $('#parallel-deepspeed').value, readForm().setup, applySetup));
  $('#parallel-megatron-apply').addEventListener('click', () => parallelImport('megatron', $('#parallel-megatron').value, readForm().setup, applySetup));
  wireParallelDrop(() => readForm().setup, applySetup);
  $('#parallel-fewest').addEventListener('click', () => parallelRunFewest(readForm().setup, applySetup));
  $('#parallel-accelerate-apply').addEventListener('click', () => parallelImport('accelerate', $('#parallel-accelerate').value, readForm().setup, applySetup));
  $('#parallel-layouts-run').addEventListener('click', () => parallelRunLayouts(readForm().setup, applySetup));
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
    applySetup(firstVisitSetup());
    ioStatus('Back to the starting setup.');
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
      markScrollingTables();
    });
  }).observe($('#results'));
}

// The marks time the page's start (gpumem:…, in the performance timeline): what the first
// answer waits for, read by the page-load measurements (docs/budget.md).
async function start() {
  performance.mark('gpumem:start');
  const status = $('#load-status');
  try {
    // The single-file page compiled its wasm while it was parsed (web/wasm-preload.js).
    state.api = await loadGpumem({ wasmModule: globalThis.gpumemWasm?.module });
    performance.mark('gpumem:module-ready');
    state.options = state.api.options();
    performance.mark('gpumem:options');
  } catch (exception) {
    status.textContent = `The calculator could not start: ${exception?.message ?? exception}`;
    status.className = 'field-error';
    console.error(exception);
    return;
  }
  const params = new URLSearchParams(location.search);
  state.embed = params.get('embed') === '1';
  // ?worker=0 runs the long calls on the page's thread (the fallback when no worker can start).
  if (!state.embed) {
    state.engine = createEngine(state.api, { useWorker: typeof Worker === 'function' && params.get('worker') !== '0', wasm: globalThis.gpumemWasm ?? null });
  }
  document.body.classList.toggle('embed', state.embed);
  buildControls(state.options);
  wireEvents();
  $('#version').textContent = `version ${state.options.version ?? state.api.version ?? '?'}`;
  performance.mark('gpumem:controls');
  await loadFromHash();
  $('#controls').disabled = false;
  status.textContent = 'Ready';
  document.body.dataset.ready = 'true';
  // The background workers start once the first answer is on the screen (a task after the next
  // frame), not beside it: on two cores their start took a third of the first answer's time.
  requestAnimationFrame(() => setTimeout(() => state.engine?.start(), 0));
}

start();
