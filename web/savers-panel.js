// The memory-savers fold: training options that change what the step holds without changing the
// model (torchtune's chunked loss, a loss without the fp32 upcast, the optimizer step in
// backward), built from the core's options.savers: each field's key under `training`, its kind,
// label, hint and the framework option it is. A saver the core adds appears here by itself.

import { $, $$, displayNumber, numberValue, state } from './page-state.js';
import { optionControl } from './option-field.js';

export function saverFields() {
  return Array.isArray(state.options.savers) ? state.options.savers : [];
}

function saverId(key) {
  return `saver-${key}`;
}

export function buildSaverFields() {
  const fields = saverFields();
  $('#savers-fold').hidden = !fields.length;
  $('#saver-fields').replaceChildren(...fields.map((f) => {
    // Which framework option it is, then what it changes.
    const hint = [f.framework, f.hint].filter(Boolean).join('. ');
    return optionControl(f, saverId(f.key), { field: `training.${f.key}`, saver: f.key }, hint).wrap;
  }));
}

// The savers' values, to be merged into setup.training.
export function readSavers() {
  const out = {};
  for (const input of $$('#saver-fields [data-saver]')) {
    const key = input.dataset.saver;
    const defaultValue = state.options.defaultSetup.training?.[key];
    out[key] = input.type === 'checkbox' ? input.checked
      : input.tagName === 'SELECT' ? input.value
      : typeof defaultValue === 'number' ? numberValue(input) : input.value;
  }
  return out;
}

export function fillSavers(training) {
  const defaults = state.options.defaultSetup.training ?? {};
  let changed = false;
  for (const input of $$('#saver-fields [data-saver]')) {
    const key = input.dataset.saver;
    const value = training?.[key] ?? defaults[key];
    changed ||= value !== undefined && value !== defaults[key];
    if (input.type === 'checkbox') input.checked = Boolean(value);
    else input.value = input.tagName === 'SELECT' ? value : displayNumber(value);
  }
  // A setup that uses a saver opens the fold, so nothing that moves the figure is hidden.
  if (changed) $('#savers-fold').open = true;
}
