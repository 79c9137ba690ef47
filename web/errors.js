// The core's field errors shown beside the controls they name.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { GpumemError } from './gpumem.js';
import { failed } from './app.js';
import { $, $$ } from './page-state.js';

// ---------- errors ----------

export function clearErrors() {
  const box = $('#errors');
  box.hidden = true;
  box.replaceChildren();
  for (const el of $$('[aria-invalid=true]')) el.removeAttribute('aria-invalid');
  for (const el of $$('[data-invalid=true]')) el.removeAttribute('data-invalid');
  // Only the notes showErrors added; other .field-error texts (import, comparison) stay.
  for (const el of $$('.field-error[id^="field-error-"]')) el.remove();
  for (const el of $$('[data-described-error]')) {
    el.setAttribute('aria-describedby', el.dataset.describedError);
    if (!el.dataset.describedError) el.removeAttribute('aria-describedby');
    delete el.dataset.describedError;
  }
}

// The control for a JSON path, trying shorter paths until one matches:
// "model.largestMatrices[0].rows" → "model.largestMatrices".
function controlFor(field, { includeHidden = false } = {}) {
  let path = field;
  while (path) {
    const el = $$('[data-field]').find((e) => e.dataset.field === path && (includeHidden || !e.closest('[hidden]')));
    if (el) return el;
    const cut = Math.max(path.lastIndexOf('.'), path.lastIndexOf('['));
    path = cut > 0 ? path.slice(0, cut) : '';
  }
  return null;
}

// The label people see for a JSON path: the text of the control's <label> (without its unit),
// for a layer row "layer N · field", else the path's last name in words. Errors are named by it.
export function fieldLabel(field) {
  if (!field) return '';
  const control = controlFor(field, { includeHidden: true });
  const exact = control && control.dataset.field === field;
  const labelEl = control?.id ? document.querySelector(`label[for="${control.id}"]`) : null;
  if (labelEl && exact) {
    const copy = labelEl.cloneNode(true);
    for (const unit of copy.querySelectorAll('.unit')) unit.remove();
    return copy.textContent.trim();
  }
  // A control labelled by its place rather than a <label> (the layer list's JSON editor).
  if (exact && control.dataset.label) return control.dataset.label;
  const layer = /^model\.layers\[(\d+)\](?:\.(\w+))?/.exec(field);
  const words = (name) => name.replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase();
  if (layer) return `layer ${Number(layer[1]) + 1}${layer[2] ? ` · ${words(layer[2])}` : ''}`;
  const last = field.split('.').pop().replace(/\[\d+\]$/, '');
  const prefix = field.startsWith('model.architecture.') ? 'architecture · ' : field.startsWith('runtime.') ? 'runtime · ' : '';
  return `${prefix}${words(last)}`;
}

// The core's message in words for the person at the control: an empty field or text where a
// number belongs says so and how to fix it (the core only knows it got a string).
function messageFor(err, control) {
  const message = String(err.message ?? 'invalid value');
  if (control && control.matches('input[type=text]') && /must be (a|an) (number|integer|whole number)|got a string/i.test(message)) {
    const value = control.value.trim();
    if (!value) return 'is empty: type a number.';
    return `“${value}” is not a number: type digits such as 8, 1,024 or 1.5e9.`;
  }
  return message.startsWith(err.field) ? message.slice(err.field.length).replace(/^[:\s]+/, '') : message;
}

export function errorText(err) {
  if (!err.field) return String(err.message ?? 'invalid value');
  return `${fieldLabel(err.field)}: ${messageFor(err, controlFor(err.field))}`;
}

export function showErrors(errors) {
  const box = $('#errors');
  const title = document.createElement('strong');
  title.textContent = errors.length === 1 ? 'This setup cannot be estimated:' : `This setup cannot be estimated (${errors.length} problems):`;
  const list = document.createElement('ul');
  errors.forEach((err, k) => {
    const li = document.createElement('li');
    const control = err.field ? controlFor(err.field) : null;
    if (err.field) {
      const name = document.createElement('strong');
      name.className = 'error-field';
      name.textContent = fieldLabel(err.field);
      // The JSON path stays in the title, for people who edit the exported JSON.
      name.title = err.field;
      li.dataset.errorField = err.field;
      li.append(name, `: ${messageFor(err, control)}`);
    } else {
      li.textContent = errorText(err);
    }
    list.append(li);
    if (control) {
      // A control in a closed fold (model details, runtime) is shown with its error.
      for (let fold = control.closest('details'); fold; fold = fold.parentElement?.closest('details')) fold.open = true;
      // aria-invalid belongs on form controls; a layer row or group is marked for the eye only.
      control.setAttribute(control.matches('input, select') ? 'aria-invalid' : 'data-invalid', 'true');
      const note = document.createElement('p');
      note.className = 'field-error';
      note.id = `field-error-${k}`;
      note.textContent = messageFor(err, control);
      const container = control.closest('.field, .check, .layer, fieldset') ?? control.parentElement;
      container.append(note);
      if (control.matches('input, select')) {
        if (!('describedError' in control.dataset)) control.dataset.describedError = control.getAttribute('aria-describedby') ?? '';
        control.setAttribute('aria-describedby', `${control.dataset.describedError} ${note.id}`.trim());
      }
    }
  });
  box.replaceChildren(title, list);
  box.hidden = false;
}

export function errorsOf(exception) {
  if (exception instanceof GpumemError) {
    if (Array.isArray(exception.errors) && exception.errors.length) return exception.errors;
    return [{ code: exception.code, field: exception.field ?? '', message: exception.message }];
  }
  return [{ code: 'internal', field: '', message: `The calculator failed: ${exception?.message ?? exception}` }];
}

export function setResultsState(value) {
  $('#results').dataset.state = value;
  $('#stale-note').hidden = value !== 'stale';
}
