// The model panel: presets and the architecture fields, built from the core's options.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { formatInteger } from './charts.js';
import { $, displayNumber, numberValue, state } from './page-state.js';
import { fillSelect, setSelectValue } from './setup-form.js';

// Per layer type, the schema fields the editor shows: [field, label, kind]. The schema lists
// which fields belong to which type; options() only names the types.
export const LAYER_FIELDS = {
  embedding: [['numEmbeddings', 'Vocabulary (rows)', 'count'], ['embeddingDim', 'Width', 'count']],
  linear: [['inFeatures', 'In features', 'count'], ['outFeatures', 'Out features', 'count'], ['bias', 'Bias', 'bool']],
  dropout: [['p', 'Dropout p', 'number']],
};

// The architecture's fields come from the core (options.architectureFields: key, label, kind,
// hint, the families that read it, and a field it depends on). A field whose value differs from
// the family's default is shown anyway, so no setting the core uses is ever invisible.
function archFields() {
  return state.options.architectureFields ?? [];
}

function fieldShown(field, arch) {
  if (!field.families.includes(arch.family)) return false;
  if (!field.when) return true;
  const other = arch[field.when.field];
  return field.when.value === 'positive' ? Number(other) > 0 : other === field.when.value;
}

// ---------- architecture editor ----------

export function presetById(id) {
  return (state.options.presets ?? []).find((p) => p.id === id);
}

// True when every field of the preset's architecture has the same value in `arch`.
function sameArchitecture(arch, presetArch) {
  return Object.entries(presetArch).every(([key, value]) => arch[key] === value);
}

export function matchingPreset(arch) {
  return (state.options.presets ?? []).find((p) => sameArchitecture(arch, p.architecture));
}

export function buildArchFields() {
  $('#arch-fields').replaceChildren(...archFields().map(({ key, label, kind, hint, options }) => {
    const id = `arch-${key}`;
    const wrap = document.createElement('div');
    wrap.dataset.archKey = key;
    const lab = document.createElement('label');
    lab.htmlFor = id;
    lab.textContent = label;
    let input;
    if (kind === 'select') {
      input = document.createElement('select');
      fillSelect(input, state.options[options] ?? []);
    } else {
      input = document.createElement('input');
      input.type = kind === 'bool' ? 'checkbox' : 'text';
      if (kind !== 'bool') {
        input.inputMode = kind === 'count' ? 'numeric' : 'decimal';
        input.spellcheck = false;
      }
    }
    input.id = id;
    input.dataset.key = key;
    input.dataset.field = `model.architecture.${key}`;
    if (kind === 'bool') {
      wrap.className = 'check';
      wrap.append(input, lab);
      return wrap;
    }
    wrap.className = kind === 'select' ? 'field wide' : 'field';
    wrap.append(lab, input);
    if (hint) {
      const p = document.createElement('p');
      p.className = 'hint';
      p.id = `${id}-hint`;
      p.textContent = hint;
      input.setAttribute('aria-describedby', p.id);
      wrap.append(p);
    }
    return wrap;
  }));
}

// The architecture as the schema writes it: family first, then every field, shown or not (a
// field hidden for this family holds the family's default, which the core ignores anyway).
export function readArchitecture() {
  const arch = { family: $('#arch-family').value };
  for (const { key, kind } of archFields()) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') arch[key] = input.checked;
    else if (kind === 'select') arch[key] = input.value;
    else arch[key] = numberValue(input);
  }
  return arch;
}

export function fillArchitecture(arch, presetId) {
  setSelectValue($('#arch-family'), arch.family);
  for (const { key, kind } of archFields()) {
    const input = $(`#arch-${key}`);
    if (kind === 'bool') input.checked = Boolean(arch[key]);
    else if (kind === 'select') setSelectValue(input, arch[key]);
    else input.value = displayNumber(arch[key]);
  }
  state.presetBase = presetById(presetId)?.id ?? '';
  syncPreset();
  showArchFields();
}

// The preset select names a preset only while the fields hold exactly its architecture; after
// an edit it says "custom" and the hint remembers which preset the values started from.
function syncPreset() {
  const arch = readArchitecture();
  const base = presetById(state.presetBase);
  const current = base && sameArchitecture(arch, base.architecture) ? base : matchingPreset(arch);
  if (current) state.presetBase = current.id;
  $('#preset').value = current?.id ?? '';
  showPresetHint();
}

function showPresetHint() {
  const hint = $('#preset-hint');
  const current = presetById($('#preset').value);
  const base = presetById(state.presetBase);
  if (current) {
    hint.textContent = `Published: ${formatInteger(current.publishedParameters)} parameters (${current.source}; counted as ${current.countedAs}). The fields below stay editable.`;
  } else if (base) {
    hint.textContent = `Custom: modified from ${base.label}, so its published count no longer applies.`;
  } else {
    hint.textContent = 'Custom architecture. Choose a preset to load a published model\'s sizes.';
  }
}

// Which fields the family uses, plus any whose value is not the family default (so a value
// loaded from a link or file is never hidden while it changes the estimate or an error).
function showArchFields() {
  const arch = readArchitecture();
  const defaults = state.options.familyDefaults?.[arch.family] ?? {};
  for (const field of archFields()) {
    const { key } = field;
    $(`[data-arch-key="${key}"]`).hidden = !(fieldShown(field, arch) || (key in defaults && arch[key] !== defaults[key]));
  }
}

export function onPresetChange() {
  const preset = presetById($('#preset').value);
  if (preset) {
    fillArchitecture(preset.architecture, preset.id);
    // The core's length for this preset (its published context, capped for long-context
    // models: options().presets[].defaultSequenceLength), not whatever the field held.
    if (preset.defaultSequenceLength) $('#sequenceLength').value = displayNumber(preset.defaultSequenceLength);
  } else {
    showPresetHint();  // "custom": the values stay as they are
  }
}

export function onFamilyChange() {
  const defaults = state.options.familyDefaults?.[$('#arch-family').value];
  if (defaults) fillArchitecture(defaults);
  else showArchFields();
}

export function onArchFieldInput() {
  syncPreset();
  showArchFields();
}
