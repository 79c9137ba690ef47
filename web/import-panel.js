// Importing a Hugging Face config.json or a safetensors header into the model panel.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { bytesTitle, formatBytes, formatInteger } from './charts.js';
import { errorText, errorsOf } from './errors.js';
import { announce } from './export-panel.js';
import { applySetup } from './link.js';
import { $, state } from './page-state.js';
import { isPlainObject, mergeSetup, readForm } from './setup-form.js';

// ---------- importing config.json and safetensors ----------

export function canImport() {
  return typeof state.api.importConfig === 'function' || typeof state.api.importSafetensors === 'function';
}

// Which of the three JSON documents a text is: a safetensors index (weight_map), a safetensors
// header (tensors with dtype and shape), or else a config.json (the core reports bad JSON).
function kindOfJson(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    return 'config';
  }
  if (!isPlainObject(doc)) return 'config';
  if (isPlainObject(doc.weight_map)) return 'index';
  if ('__metadata__' in doc) return 'header';
  const values = Object.values(doc);
  if (values.length && values.every((v) => isPlainObject(v) && 'dtype' in v && 'shape' in v)) return 'header';
  return 'config';
}

export function importText(text, source) {
  const kind = kindOfJson(text);
  if (kind === 'config') importConfigText(text, source);
  else importSafetensorsText(text, source);
}

function importError(exception, source, what) {
  const box = $('#import-result');
  const p = document.createElement('p');
  p.className = 'field-error';
  const errors = errorsOf(exception);
  p.textContent = `${source}: ${what} could not be read — ${errors.map(errorText).join('; ')}`;
  // A way forward for a model the core cannot trace (t5, gpt_neox …): its safetensors header
  // still gives the exact parameter count, and quick mode estimates from a count.
  const next = document.createElement('p');
  next.className = 'hint';
  next.id = 'import-next';
  next.textContent = 'What you can do: drop the model\'s .safetensors file (only its header is read) for the exact parameter count, '
    + 'or choose “Parameter count” under Model details and type the count from its model card (quick mode, activations by a rule of thumb).';
  box.replaceChildren(p, next);
  box.dataset.state = 'error';
  $('#model-details').open = true;
  $('#import-model').open = true;
}

function importConfigText(text, source) {
  if (typeof state.api.importConfig !== 'function') return;
  let result;
  try {
    result = state.api.importConfig(text);
  } catch (exception) {
    importError(exception, source, 'the config');
    return;
  }
  state.safetensors = null;
  const { setup: current } = readForm();
  const merged = mergeSetup({ ...current, model: {} }, result.setup);
  $('#example').value = '';
  const problems = applySetup(merged);
  const box = $('#import-result');
  box.dataset.state = 'config';
  box.dataset.modelType = result.modelType ?? '';
  const ignored = Array.isArray(result.ignoredFields) ? result.ignoredFields : [];
  box.dataset.ignored = String(ignored.length);
  const head = document.createElement('p');
  head.className = 'ok';
  head.textContent = `Imported ${source}: model_type “${result.modelType ?? '?'}”, ${ignored.length} field${ignored.length === 1 ? '' : 's'} ignored. The architecture fields above are filled in and editable.`;
  const parts = [head];
  if (ignored.length) {
    const details = document.createElement('details');
    const summary = document.createElement('summary');
    summary.textContent = `Ignored fields (${ignored.length})`;
    const list = document.createElement('p');
    list.className = 'hint';
    list.textContent = ignored.join(', ');
    details.append(summary, list);
    parts.push(details);
  }
  for (const note of result.notes ?? []) parts.push(paragraph('hint', note));
  if (problems.length) {
    const p = document.createElement('p');
    p.className = 'field-error';
    p.textContent = `With the current training settings: ${problems.map(errorText).join('; ')}`;
    parts.push(p);
  }
  box.replaceChildren(...parts);
}

function importSafetensorsText(text, source) {
  if (typeof state.api.importSafetensors !== 'function') return;
  let result;
  try {
    result = state.api.importSafetensors(text);
  } catch (exception) {
    importError(exception, source, 'the safetensors data');
    return;
  }
  state.safetensors = { result, source, text };
  renderSafetensors();
}

// dtypes may come as {F16: 148}, [[dtype, count]] or [{dtype, count}]: shown as "F16 × 148".
function dtypeText(dtypes) {
  const entries = Array.isArray(dtypes)
    ? dtypes.map((d) => (Array.isArray(d) ? d : [d.dtype ?? d.id ?? d.name, d.count ?? d.tensors ?? d.tensorCount]))
    : Object.entries(dtypes ?? {});
  return entries.map(([d, n]) => (n === undefined ? String(d) : `${d} × ${formatInteger(Number(n))}`)).join(', ') || '—';
}

// The core's comparison of a safetensors header with a setup's architecture, or null.
function compareWithArchitecture(text, setup) {
  try {
    const r = state.api.importSafetensors(text, setup);
    return typeof r.differenceFromArchitecture === 'number' ? r : null;
  } catch {
    return null;
  }
}

function paragraph(className, text) {
  const p = document.createElement('p');
  p.className = className;
  p.textContent = text;
  return p;
}

export function renderSafetensors() {
  const box = $('#import-result');
  const s = state.safetensors;
  if (!s) {
    if (box.dataset.state === 'safetensors') {
      box.replaceChildren();
      delete box.dataset.state;
    }
    return;
  }
  const r = s.result;
  box.dataset.state = 'safetensors';
  box.dataset.source = r.source;
  const head = document.createElement('p');
  head.className = 'ok';
  head.textContent = `Read ${s.source} (${r.source === 'header' ? 'a safetensors header: exact shapes' : 'a safetensors index: tensor names and total size only'}).`;
  const dl = document.createElement('dl');
  const item = (term, value, attrs = {}) => {
    const dt = document.createElement('dt');
    dt.textContent = term;
    const dd = document.createElement('dd');
    dd.append(value);
    Object.assign(dd.dataset, attrs);
    dl.append(dt, dd);
    return dd;
  };
  item('Parameters', r.parameterCount === null || r.parameterCount === undefined
    ? 'not in an index (it lists names and bytes only; drop a .safetensors file for an exact count)'
    : `${formatInteger(r.parameterCount)} (exact)`, { count: String(r.parameterCount ?? '') }).id = 'safetensors-count';
  const size = item('Tensor data', formatBytes(r.totalSizeBytes));
  size.title = bytesTitle(r.totalSizeBytes);
  item('Tensors', formatInteger(r.tensorCount));
  item('dtypes', dtypeText(r.dtypes));
  if (r.numLayers) item('Blocks', formatInteger(r.numLayers));
  if (Array.isArray(r.largestMatrices) && r.largestMatrices.length) {
    item('Largest matrices', r.largestMatrices.map((m) => `${formatInteger(m.rows)}×${formatInteger(m.cols)}`).join(', '));
  }
  const parts = [head, dl];
  // In architecture mode, the header's exact count against the architecture's: the core reads
  // the header again beside the setup last estimated and gives both counts and their difference.
  const compared = state.lastGood && state.lastContext?.kind === state.archKind && state.archKind && typeof r.parameterCount === 'number'
    ? compareWithArchitecture(s.text, state.lastGoodSetup) : null;
  if (compared) {
    const arch = compared.architectureParameterCount;
    const difference = compared.differenceFromArchitecture;
    const p = document.createElement('p');
    p.id = 'safetensors-vs-arch';
    const same = difference === 0;
    p.dataset.match = String(same);
    p.className = same ? 'ok' : 'differs';
    p.textContent = same
      ? `The header's count equals the architecture's count (${formatInteger(arch)}).`
      : `The header's count differs from the architecture's count (${formatInteger(arch)}) by ${difference > 0 ? '+' : '−'}${formatInteger(Math.abs(difference))}.`;
    parts.push(p);
  }
  for (const note of r.notes ?? []) parts.push(paragraph('hint', note));
  if (r.setup) {
    const use = document.createElement('button');
    use.type = 'button';
    use.id = 'safetensors-use';
    use.textContent = 'Use this parameter count (quick mode)';
    use.addEventListener('click', () => {
      const { setup: current } = readForm();
      $('#example').value = '';
      applySetup(mergeSetup({ ...current, model: {} }, r.setup));
      announce('The model is now the checkpoint\'s exact parameter count, in quick mode.');
    });
    const actions = document.createElement('div');
    actions.className = 'actions';
    actions.append(use);
    parts.push(actions);
  }
  box.replaceChildren(...parts);
}

// A .safetensors file starts with its header's length N (8 bytes, little-endian u64) and the
// N bytes of its JSON header; only those are read.
async function readSafetensorsHeader(file) {
  if (file.size < 8) throw new Error('the file is shorter than a safetensors header');
  const view = new DataView(await file.slice(0, 8).arrayBuffer());
  const length = view.getBigUint64(0, true);
  if (length === 0n || length > BigInt(file.size - 8) || length > 512n * 1024n * 1024n) {
    throw new Error(`the first 8 bytes give a header of ${length} bytes, which does not fit the file (${file.size} bytes): not a safetensors file`);
  }
  return new TextDecoder('utf-8', { fatal: true }).decode(await file.slice(8, 8 + Number(length)).arrayBuffer());
}

// Several .safetensors files (the shards of one checkpoint): their headers go to the core as one
// JSON array, which counts them together.
export async function importFiles(fileList) {
  const files = [...(fileList ?? [])];
  if (files.length > 1 && files.every((f) => /\.safetensors$/i.test(f.name))) {
    $('#model-details').open = true;
  $('#import-model').open = true;
    try {
      const headers = await Promise.all(files.map(readSafetensorsHeader));
      importSafetensorsText(`[${headers.join(',')}]`, `${files.length} shards`);
    } catch (exception) {
      importError(exception, `${files.length} files`, 'the files');
    }
    return;
  }
  return importFile(files[0]);
}

async function importFile(file) {
  if (!file) return;
  $('#model-details').open = true;
  $('#import-model').open = true;
  try {
    if (/\.safetensors$/i.test(file.name)) {
      importSafetensorsText(await readSafetensorsHeader(file), file.name);
    } else {
      importText(await file.text(), file.name);
    }
  } catch (exception) {
    importError(exception, file.name, 'the file');
  }
}

const hasFiles = (event) => [...(event.dataTransfer?.types ?? [])].includes('Files');

function wireDropZone(zone) {
  let depth = 0;
  zone.addEventListener('dragenter', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    depth++;
    zone.classList.add('dragging');
  });
  zone.addEventListener('dragover', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
  });
  zone.addEventListener('dragleave', () => {
    depth = Math.max(0, depth - 1);
    if (!depth) zone.classList.remove('dragging');
  });
  zone.addEventListener('drop', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    depth = 0;
    zone.classList.remove('dragging');
    importFiles(event.dataTransfer.files);
  });
}

export function wireDropTarget() {
  // The model details and the first screen's model field both take a dropped config or header.
  for (const zone of [$('#model-fieldset'), $('#first-screen')]) wireDropZone(zone);
  // A file dropped anywhere else must not replace the page (and its state) with the file.
  window.addEventListener('dragover', (event) => { if (hasFiles(event)) event.preventDefault(); });
  window.addEventListener('drop', (event) => { if (hasFiles(event)) event.preventDefault(); });
}
