// The memory-savers fold: training options that change what the step holds without changing the
// model (torchtune's chunked loss, a loss without the fp32 upcast, the optimizer step in
// backward), built from the core's options.savers: each field's key under `training`, its kind,
// label, hint and the framework option it is. A saver the core adds appears here by itself.

import { $, $$, displayNumber, numberValue, state } from './page-state.js';

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
    const id = saverId(f.key);
    const wrap = document.createElement('div');
    const label = document.createElement('label');
    label.htmlFor = id;
    label.textContent = f.label;
    let input;
    if (f.kind === 'bool') {
      wrap.className = 'check';
      input = document.createElement('input');
      input.type = 'checkbox';
      wrap.append(input, label);
    } else if (f.kind === 'select') {
      wrap.className = 'field';
      input = document.createElement('select');
      for (const o of state.options[f.options] ?? []) input.append(new Option(o.label, o.id));
      wrap.append(label, input);
    } else {
      wrap.className = 'field';
      input = document.createElement('input');
      input.type = 'text';
      input.inputMode = 'decimal';
      input.spellcheck = false;
      wrap.append(label, input);
    }
    input.id = id;
    input.dataset.field = `training.${f.key}`;
    input.dataset.saver = f.key;
    // Which framework option it is, then what it changes (issue: "say which framework option").
    const hint = document.createElement('p');
    hint.className = 'hint';
    hint.id = `${id}-hint`;
    hint.textContent = [f.framework, f.hint].filter(Boolean).join('. ');
    input.setAttribute('aria-describedby', hint.id);
    wrap.append(hint);
    return wrap;
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
