// The views around the setup (heat map, curves, GPU matrix), computed in the worker.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { renderCurves, renderGpuMatrix, renderHeatMap } from './views.js';
import { failed } from './app.js';
import { errorText } from './errors.js';
import { $, VIEWS_DELAY_MS, VIEW_KINDS, state } from './page-state.js';
import { applyPartial } from './solve-panel.js';

// ---------- views ----------

// After each good estimate: the views of the same setup, from the worker, each drawn as it
// arrives. A newer setup replaces the request; results of replaced requests are dropped.
export function scheduleViews(setup) {
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

export function cancelViews() {
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

export function renderViews() {
  for (const kind of VIEW_KINDS) renderView(kind);
}
