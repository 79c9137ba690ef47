// The layer-list editor (the model as a list of layers), rows or JSON for long lists.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { formatInteger } from './charts.js';
import { update } from './app.js';
import { LAYER_FIELDS } from './model-panel.js';
import { $, $$, displayNumber, numberValue, state } from './page-state.js';
import { fillSelect, setSelectValue } from './setup-form.js';

// ---------- layer editor ----------

// A new layer's fields come from the first example layer of that type (the core's examples),
// so the page does not invent sizes; a linear layer takes the width flowing into it.
function templateLayer(type, layersBefore) {
  const fromExample = state.examples
    .flatMap((e) => e.setup?.model?.layers ?? [])
    .find((l) => l.type === type);
  const layer = { ...(fromExample ?? {}), type };
  if (type === 'linear') {
    const width = widthAfter(layersBefore);
    if (width !== undefined) {
      layer.inFeatures = width;
      if (layer.outFeatures === undefined) layer.outFeatures = width;
    }
  }
  return layer;
}

// The feature width leaving the last layer that sets one (for pre-filling, not for estimating).
function widthAfter(layers) {
  for (let i = layers.length - 1; i >= 0; i--) {
    const l = layers[i];
    if (l.type === 'linear' && typeof l.outFeatures === 'number') return l.outFeatures;
    if (l.type === 'embedding' && typeof l.embeddingDim === 'number') return l.embeddingDim;
  }
  return undefined;
}

function layerTypeLabel(id) {
  return state.options.layerTypes.find((t) => t.id === id)?.label ?? id;
}

// A row per layer costs the page about 1.5 ms to build; past this many layers the list is
// edited as JSON instead (one layer a line), so any list the core accepts stays quick to show.
const LAYER_ROWS_MAX = 200;

// One layer as a line of the JSON editor, a space after each colon and comma: easier to read,
// and the browser lays the text out a third faster (its shaping cache holds short words; a
// 5,000-layer list's first layout took 88 ms as unbroken lines and 59 ms spaced, Chromium 156).
function layerLine(layer) {
  if (layer === null || typeof layer !== 'object' || Array.isArray(layer)) return JSON.stringify(layer);
  return `{${Object.entries(layer).map(([key, value]) => `${JSON.stringify(key)}: ${JSON.stringify(value)}`).join(', ')}}`;
}

export function renderLayers(layers) {
  const list = $('#layer-list');
  const json = $('#layer-json');
  list.replaceChildren();
  const asJson = layers.length > LAYER_ROWS_MAX;
  list.hidden = asJson;
  json.hidden = !asJson;
  $('#layer-json-hint').hidden = !asJson;
  if (asJson) {
    $('#layer-json-hint').textContent = `${formatInteger(layers.length)} layers: more than the ${LAYER_ROWS_MAX} the row editor shows, so they are listed as JSON, one layer a line.`;
    json.value = `[\n${layers.map(layerLine).join(',\n')}\n]`;
    return;
  }
  json.value = '';
  layers.forEach((layer, i) => list.append(layerRow(layer, i, layers.length)));
}

function layerRow(layer, i, count) {
  const li = document.createElement('li');
  li.className = 'layer';
  li.dataset.type = layer.type;
  // Errors about the layer as a whole ("model.layers[3]") are shown on its row.
  li.dataset.field = `model.layers[${i}]`;
  const head = document.createElement('div');
  head.className = 'layer-head';
  const index = document.createElement('span');
  index.className = 'layer-index';
  index.textContent = String(i);
  const typeLabel = document.createElement('label');
  typeLabel.className = 'visually-hidden';
  typeLabel.htmlFor = `layer-${i}-type`;
  typeLabel.textContent = `Layer ${i} type`;
  const select = document.createElement('select');
  select.id = `layer-${i}-type`;
  select.dataset.role = 'type';
  select.dataset.field = `model.layers[${i}].type`;
  fillSelect(select, state.options.layerTypes);
  setSelectValue(select, layer.type);
  const button = (action, text, label, disabled) => {
    const b = document.createElement('button');
    b.type = 'button';
    b.dataset.action = action;
    b.textContent = text;
    b.setAttribute('aria-label', label);
    b.title = label;
    b.disabled = disabled;
    return b;
  };
  head.append(index, typeLabel, select,
    button('up', '↑', `Move layer ${i} up`, i === 0),
    button('down', '↓', `Move layer ${i} down`, i === count - 1),
    button('remove', '✕', `Remove layer ${i} (${layerTypeLabel(layer.type)})`, false));
  li.append(head);

  const fields = LAYER_FIELDS[layer.type] ?? [];
  if (fields.length) {
    const box = document.createElement('div');
    box.className = 'layer-fields';
    for (const [key, label, kind] of fields) {
      const id = `layer-${i}-${key}`;
      const wrap = document.createElement('div');
      const input = document.createElement('input');
      input.id = id;
      input.dataset.key = key;
      input.dataset.field = `model.layers[${i}].${key}`;
      const lab = document.createElement('label');
      lab.htmlFor = id;
      lab.textContent = label;
      if (kind === 'bool') {
        wrap.className = 'check';
        input.type = 'checkbox';
        input.checked = layer[key] !== false;
        wrap.append(input, lab);
      } else {
        wrap.className = 'field';
        input.type = 'text';
        input.inputMode = kind === 'count' ? 'numeric' : 'decimal';
        input.spellcheck = false;
        input.value = displayNumber(layer[key]);
        wrap.append(lab, input);
      }
      box.append(wrap);
    }
    li.append(box);
  }
  return li;
}

export function readLayers() {
  const json = $('#layer-json');
  if (!json.hidden) {
    // Text that is no list goes to the core as it is, which names the problem (model.layers).
    try {
      return JSON.parse(json.value);
    } catch {
      return json.value;
    }
  }
  return $$('#layer-list > li').map((li) => {
    const type = $('select[data-role=type]', li).value;
    const layer = { type };
    // Fields as rendered: during a type change the row still shows the previous type's fields.
    for (const [key, , kind] of LAYER_FIELDS[li.dataset.type] ?? []) {
      const input = $(`[data-key="${key}"]`, li);
      if (!input) continue;
      layer[key] = kind === 'bool' ? input.checked : numberValue(input);
    }
    return layer;
  });
}

export function onLayerListInput(event) {
  const select = event.target.closest('select[data-role=type]');
  if (!select) return;
  // A new type: keep the fields both types share, take the rest from the template.
  const li = select.closest('li');
  const index = $$('#layer-list > li').indexOf(li);
  const layers = readLayers();
  const old = layers[index];
  const fresh = templateLayer(select.value, layers.slice(0, index));
  for (const [key] of LAYER_FIELDS[select.value] ?? []) if (old[key] !== undefined) fresh[key] = old[key];
  layers[index] = fresh;
  renderLayers(layers);
  $(`#layer-${index}-type`).focus();
}

export function onLayerListClick(event) {
  const button = event.target.closest('button[data-action]');
  if (!button) return;
  const li = button.closest('li');
  const index = $$('#layer-list > li').indexOf(li);
  const layers = readLayers();
  const action = button.dataset.action;
  let focusAfter;
  if (action === 'remove') {
    layers.splice(index, 1);
    focusAfter = layers.length ? `#layer-${Math.min(index, layers.length - 1)}-type` : '#add-layer-type';
  } else {
    const to = action === 'up' ? index - 1 : index + 1;
    if (to < 0 || to >= layers.length) return;
    [layers[index], layers[to]] = [layers[to], layers[index]];
    focusAfter = `#layer-${to}-type`;
  }
  renderLayers(layers);
  $(focusAfter)?.focus();
  update();
}

export function addLayer() {
  const layers = readLayers();
  if (!Array.isArray(layers)) return;  // the JSON text is not a list: the error says so
  layers.push(templateLayer($('#add-layer-type').value, layers));
  renderLayers(layers);
  ($(`#layer-${layers.length - 1}-type`) ?? $('#layer-json')).focus();
  update();
}
