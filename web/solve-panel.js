// Make it fit: the solver's largest batch and sequence, and the changes that save memory.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { bytesTitle, formatBytes, formatInteger } from './charts.js';
import { failed, update } from './app.js';
import { errorText } from './errors.js';
import { announce } from './export-panel.js';
import { applySetup } from './link.js';
import { $, state } from './page-state.js';
import { mergeSetup, readForm } from './setup-form.js';

// ---------- solve ----------

export function canSolve() {
  return typeof state.api.solve === 'function';
}

export function runSolve() {
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

function solveApplyButton(text, label, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = text;
  b.setAttribute('aria-label', label);
  b.addEventListener('click', onClick);
  return b;
}

export function applyPartial(change, what) {
  const { setup } = readForm();
  $('#example').value = '';
  const problems = applySetup(mergeSetup(setup, change));
  announce(problems.length ? `Applied ${what}, with problems: ${problems.map(errorText).join('; ')}` : `Applied ${what}.`);
}

export function renderSolve() {
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
