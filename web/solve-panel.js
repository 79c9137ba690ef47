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
  if (state.solving) return;
  // aria-disabled, not disabled: a disabled button loses the keyboard focus to the page body,
  // and the person pressed it from the keyboard (issue 13).
  button.setAttribute('aria-disabled', 'true');
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
    // Cancel was pressed or is about to be disabled: its focus moves to Solve, not to the body.
    if (document.activeElement === $('#solve-cancel')) button.focus();
    $('#solve-cancel').disabled = true;
    button.removeAttribute('aria-disabled');
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

// Applies a suggestion: the form changes, the estimate reruns, and the page shows the changed
// result (scrolled into view, highlighted, "was → now") while the focus stays on the button the
// person pressed, so the next suggestion is one Tab away.
export function applyPartial(change, what) {
  const { setup } = readForm();
  const before = state.lastGood;
  $('#example').value = '';
  const problems = applySetup(mergeSetup(setup, change));
  const after = state.lastGood;
  const text = problems.length ? `Applied ${what}, with problems: ${problems.map(errorText).join('; ')}`
    : `Applied ${what}: ${wasNow(before, after)}`;
  showChange(text);
  announce(text);
}

function verdictWords(est) {
  const v = est?.device?.verdict;
  return v === 'tight' ? 'fits, tight' : v === 'fits' ? 'fits' : 'does not fit';
}

// "device peak 36.39 GiB → 22.10 GiB; does not fit → fits", from the two estimates.
function wasNow(before, after) {
  if (!after) return 'the setup cannot be estimated.';
  const now = after.device?.peakDeviceBytes ?? after.peak.totalBytes;
  if (!before) return `device peak ${formatBytes(now)}; ${verdictWords(after)}.`;
  const was = before.device?.peakDeviceBytes ?? before.peak.totalBytes;
  const verdict = verdictWords(before) === verdictWords(after) ? `still ${verdictWords(after)}` : `${verdictWords(before)} → ${verdictWords(after)}`;
  return `device peak ${formatBytes(was)} → ${formatBytes(now)}; ${verdict}.`;
}

function showChange(text) {
  const note = $('#change-note');
  note.textContent = text;
  note.hidden = false;
  const summary = $('.summary');
  summary.classList.remove('changed');
  // Restart the highlight for a second Apply in a row.
  void summary.offsetWidth;
  summary.classList.add('changed');
  summary.scrollIntoView({ block: 'start' });
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
    value.textContent = `${formatInteger(entry.value)} ${entry.value === 1 ? unit.replace(/s$/, '') : unit}`;
    const more = extra ? extra(entry) : '';
    hint.textContent = `Peak ${formatBytes(entry.peakBytes)}${more ? ` · ${more}` : ''}.`;
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
    li.dataset.lowerBound = String(Boolean(s.peakIsLowerBound));
    const label = document.createElement('strong');
    label.textContent = s.label;
    const saved = document.createElement('span');
    // Unsimulated: its floor passes the capacity (the core's peakIsLowerBound and what the floor
    // counts, lowerBoundBasis).
    const floorWhat = s.lowerBoundBasis === 'forwardEnd'
      ? 'its model states and what its blocks keep at the end of forward'
      : 'its model states alone';
    saved.textContent = s.peakIsLowerBound
      ? ` — saves at most ${formatBytes(s.savedBytes)}, peak at least ${formatBytes(s.peakBytes)} (${floorWhat}) `
      : ` — saves ${formatBytes(s.savedBytes)}, peak ${formatBytes(s.peakBytes)} `;
    saved.title = s.peakIsLowerBound
      ? `not simulated: ${floorWhat} (${bytesTitle(s.peakBytes)}) pass the GPU's capacity`
      : `${bytesTitle(s.savedBytes)} saved; peak ${bytesTitle(s.peakBytes)}`;
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
  showSamePeak(suggestions);
  showManyGpus(suggestions, result.capacityBytes);
  if (!suggestions.length) {
    const li = document.createElement('li');
    li.textContent = 'No single change found.';
    list.append(li);
  }
  box.dataset.stale = String(state.solvedFor !== JSON.stringify(readForm().setup));
}

// When nothing fits and the model states alone pass the GPU (the core's modelStates and
// capacity), no change on one GPU can help: point at the Many GPUs fold's fewest-GPUs search.
function showManyGpus(suggestions, capacityBytes) {
  const note = $('#solve-many-gpus');
  const states = state.lastGood?.modelStates?.totalBytes;
  const over = !suggestions.some((s) => s.fits) && Number.isFinite(states) && states > capacityBytes;
  note.hidden = !over;
  if (over) {
    note.textContent = `The model states alone (${formatBytes(states)}) pass this GPU's ${formatBytes(capacityBytes)}: `
      + 'changes marked “at least” were not simulated, since none of them can fit on one GPU. '
      + 'Sharding the states across GPUs can: see Many GPUs → “Fewest GPUs of this type”.';
  }
}

// Suggestions that save exactly the same bytes act on the same peak: each removes the part of
// it they share, so applying one makes the others save less. Said once above the list.
function showSamePeak(suggestions) {
  const note = $('#solve-same-peak');
  const groups = new Map();
  for (const s of suggestions) {
    if (!(s.savedBytes > 0) || s.peakIsLowerBound) continue;  // a ceiling, not a saving measured
    const list = groups.get(s.savedBytes) ?? [];
    list.push(s);
    groups.set(s.savedBytes, list);
  }
  const shared = [...groups.values()].filter((g) => g.length > 1);
  const peak = state.lastGood?.peak;
  const dominant = state.lastGood?.peakDominant;
  const part = dominant ? state.options.categories.find((c) => c.id === dominant.category)?.label?.toLowerCase() ?? dominant.category : 'memory';
  note.hidden = !shared.length;
  note.textContent = shared.map((g) => {
    const names = g.map((s) => `“${s.label}”`);
    const all = g.length === 2 ? 'Both' : `All ${g.length}`;
    return `${all} of ${names.slice(0, -1).join(', ')} and ${names[names.length - 1]} save the same ${formatBytes(g[0].savedBytes)}: they attack the same peak`
      + `${peak ? ` (${peak.label}, where ${part} is the largest part)` : ''}, so after applying one the others save less — solve again.`;
  }).join(' ');
}
