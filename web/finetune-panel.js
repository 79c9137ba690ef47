// The fine-tuning fold: frozen parameters, LoRA / DoRA (PEFT's LoraConfig names) and quantized
// base weights (bitsandbytes' names), built from the core's options.finetuneFields and the
// defaults of defaultSetup.finetune; and the first screen's "What you will do", which sets them.

import { $, $$, numberValue, displayNumber, state } from './page-state.js';
import { isPlainObject, mergeSetup, setSelectValue } from './setup-form.js';
import { optionControl } from './option-field.js';

export function finetuneFields() {
  return Array.isArray(state.options.finetuneFields) ? state.options.finetuneFields : [];
}

function fieldId(key) {
  return `finetune-${key}`;
}

export function buildFinetuneFields() {
  const fold = $('#finetune-fold');
  const fields = finetuneFields();
  fold.hidden = !fields.length || !isPlainObject(state.options.defaultSetup.finetune);
  const box = $('#finetune-fields');
  box.replaceChildren(...fields.map((f) => {
    const { wrap } = optionControl(f, fieldId(f.key), { field: `finetune.${f.key}`, finetune: f.key });
    wrap.dataset.finetuneField = f.key;
    return wrap;
  }));
  buildModeSelect();
}

export function readFinetune() {
  const out = {};
  for (const f of finetuneFields()) {
    const input = $(`#${fieldId(f.key)}`);
    if (!input) continue;
    if (f.kind === 'bool') out[f.key] = input.checked;
    else if (f.kind === 'select') out[f.key] = input.value;
    else if (f.kind === 'names') out[f.key] = input.value.split(',').map((s) => s.trim()).filter(Boolean);
    else out[f.key] = numberValue(input);
  }
  return out;
}

export function fillFinetune(finetune) {
  const values = mergeSetup(state.options.defaultSetup.finetune ?? {}, isPlainObject(finetune) ? finetune : {});
  for (const f of finetuneFields()) {
    const input = $(`#${fieldId(f.key)}`);
    if (!input) continue;
    const v = values[f.key];
    if (f.kind === 'bool') input.checked = Boolean(v);
    else if (f.kind === 'select') setSelectValue(input, v);
    else if (f.kind === 'names') input.value = Array.isArray(v) ? v.join(', ') : displayNumber(v);
    else input.value = displayNumber(v);
  }
  showFinetuneFields();
  if (JSON.stringify(readFinetune()) !== JSON.stringify(state.options.defaultSetup.finetune)) $('#finetune-fold').open = true;
  syncMode();
}

// A field shown only with another: "when lora" (a checkbox) or "when quantization is not none".
export function showFinetuneFields() {
  for (const f of finetuneFields()) {
    if (!f.when) continue;
    const other = $(`#${fieldId(f.when.field)}`);
    const on = other?.type === 'checkbox' ? other.checked : other && other.value !== 'none';
    $(`[data-finetune-field="${f.key}"]`).hidden = !on;
  }
}

// What you will do: the core's one list of training modes (options.trainingModes: full
// training, torchtune's LoRA and QLoRA recipes; core/src/model/training_modes.cpp), the list
// "Make it fit" suggests from. Each mode carries the whole finetune section it sets for each
// family (the recipe's target modules depend on the family's module names).
export function trainingModes() {
  return Array.isArray(state.options.trainingModes) ? state.options.trainingModes : [];
}

// The family whose module names a mode's targets use: the model form's (a preset fills it).
function currentFamily() {
  return $('#arch-family')?.value || state.options.defaultSetup?.model?.architecture?.family;
}

// The finetune section a mode sets for the current family, or null when it has none.
export function modeFinetune(mode, family = currentFamily()) {
  const byFamily = mode?.finetuneByFamily;
  return isPlainObject(byFamily) && isPlainObject(byFamily[family]) ? byFamily[family] : null;
}

function availableModes() {
  const keys = new Set(finetuneFields().map((f) => f.key));
  return trainingModes().filter((m) => {
    const section = modeFinetune(m);
    return section && Object.keys(section).every((k) => keys.has(k));
  });
}

function buildModeSelect() {
  const modes = finetuneFields().length ? availableModes() : [];
  if (!modes.length) return;
  const select = $('#training-mode');
  select.replaceChildren(...modes.map((m) => {
    const option = new Option(m.label, m.id);
    option.title = m.source;
    return option;
  }), new Option('Custom fine-tuning (see the fine-tuning fold)', 'custom'));
  select.disabled = false;
  select.dataset.field = 'finetune';
  $('#training-mode-hint').hidden = false;
  $('#training-mode-hint').textContent = 'LoRA and QLoRA follow torchtune\'s recipes and set the fine-tuning fields below (PEFT and bitsandbytes names); every one stays editable.';
}

export function modeSelectIsFinetune() {
  return $('#training-mode').dataset.field === 'finetune';
}

export function onModeChange() {
  const section = modeFinetune(trainingModes().find((m) => m.id === $('#training-mode').value));
  if (!section) {
    $('#finetune-fold').open = true;
    return;
  }
  fillFinetune(section);
}

function syncMode() {
  if (!modeSelectIsFinetune()) return;
  const current = JSON.stringify(readFinetune());
  const mode = availableModes().find((m) => JSON.stringify(mergeSetup(state.options.defaultSetup.finetune, modeFinetune(m))) === current);
  $('#training-mode').value = mode ? mode.id : 'custom';
}

export function onFinetuneInput() {
  showFinetuneFields();
  syncMode();
}
