// The views around the setup (heat map, curves, GPU matrix), computed in the worker.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { renderCurves, renderGpuMatrix, renderHeatMap } from './views.js';
import { failed } from './app.js';
import { errorText } from './errors.js';
import { mergeViewParts } from './gpumem.js';
import { $, VIEWS_DELAY_MS, VIEW_KINDS, state } from './page-state.js';
import { applyPartial } from './solve-panel.js';

// ---------- views ----------

// After each good estimate: the views of the same setup, from the worker pool, each drawn as it
// arrives. The heat map and the curves are split into parts (docs/schema.md "part"), one per
// worker, so that the machine's cores share them; a view is drawn once all its parts are in,
// merged by the JS API (mergeViewParts: every cell is one part's). A newer setup replaces the
// request; results of replaced requests are dropped.
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
    const calls = viewCalls(setup, state.engine.workers('views'));
    const pending = Object.fromEntries(VIEW_KINDS.map((kind) => [kind, { parts: [], coreMs: 0, errors: null, count: 0 }]));
    for (const call of calls) pending[call.kind].count += 1;
    const timings = [];
    let left = calls.length;
    state.engine.run('views', calls, (outcome) => {
      const box = $('#views');
      const view = pending[outcome.kind];
      view.coreMs += outcome.coreMs;
      if (outcome.errors) view.errors = view.errors ?? outcome.errors;
      else view.parts.push(outcome.result);
      if (view.parts.length + (view.errors ? 1 : 0) >= view.count || view.errors) finishView(outcome.kind, view, requestedAt, timings);
      left -= 1;
      if (left === 0) {
        box.dataset.stale = 'false';
        box.removeAttribute('aria-busy');
        box.dataset.viewsMs = (performance.now() - requestedAt).toFixed(1);
        box.dataset.inWorker = String(outcome.inWorker);
        box.dataset.viewWorkers = String(state.engine.workers('views'));
        // A failure's message stays; otherwise the timings.
        const failedView = VIEW_KINDS.some((kind) => pending[kind].failed);
        if (!failedView) {
          $('#views-status').textContent = `(${timings.join(', ')}${outcome.inWorker ? `, in ${state.engine.workers('views')} background workers` : ', on the page'}.)`;
        }
      }
    });
  }, VIEWS_DELAY_MS);
}

// The calls of one views request over `workers` workers: the heat map first, in as many parts
// as workers (all of them on it at once: it is the view people look at first, and the largest),
// then the GPU matrix whole (where its candidates stop depends on every one before), then the
// curves in two.
export function viewCalls(setup, workers) {
  const split = (kind, count) => count <= 1
    ? [{ kind, setup }]
    : Array.from({ length: count }, (_, index) => ({ kind, setup, options: { part: { index, count } } }));
  return [...split('heatMap', workers), ...split('gpuMatrix', 1), ...split('curves', Math.min(2, workers))];
}

// A view whose parts are all in (or one of which failed): merged, drawn, and its time kept.
function finishView(kind, view, requestedAt, timings) {
  if (view.done) return;
  view.done = true;
  const box = $('#views');
  if (view.errors) {
    view.failed = true;
    $('#views-status').textContent = `The views failed: ${view.errors.map(errorText).join('; ')}`;
  } else {
    try {
      state.views[kind] = view.parts.length === 1 && !view.parts[0].part ? view.parts[0] : mergeViewParts(kind, view.parts);
      renderView(kind);
    } catch (error) {
      view.failed = true;
      $('#views-status').textContent = `The views failed: ${errorText(error?.errors?.[0] ?? { message: String(error) })}`;
    }
  }
  box.dataset[`${kind}Ms`] = (performance.now() - requestedAt).toFixed(1);
  box.dataset[`${kind}CoreMs`] = view.coreMs.toFixed(1);
  box.dataset[`${kind}Parts`] = String(view.count);
  timings.push(`${viewName(kind)} ${Math.round(view.coreMs)} ms${view.count > 1 ? ` in ${view.count} parts` : ''}`);
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
