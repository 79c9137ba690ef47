// One control for a field the core describes in its options ({key, label, kind, options, hint}):
// a checkbox for "bool", a select of options[f.options] for "select", a text box otherwise.
// The fine-tuning and memory-savers folds build their forms from it.

import { state } from './page-state.js';

// {wrap, input}: the input gets `id` and the given data attributes; the hint is linked to it.
export function optionControl(f, id, data, hintText = f.hint) {
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
    input.spellcheck = false;
    if (f.kind !== 'names') input.inputMode = 'decimal';
    wrap.append(label, input);
  }
  input.id = id;
  Object.assign(input.dataset, data);
  if (hintText) {
    const hint = document.createElement('p');
    hint.className = 'hint';
    hint.id = `${id}-hint`;
    hint.textContent = hintText;
    input.setAttribute('aria-describedby', hint.id);
    wrap.append(hint);
  }
  return { wrap, input };
}
