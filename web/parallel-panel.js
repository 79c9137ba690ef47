// The "Many GPUs" fold (issue 12): the core's parallel section as a form built from
// options.parallelFields (the frameworks' own names: DeepSpeed, FSDP, Megatron), a DeepSpeed
// config or Megatron arguments read onto the setup by the core, the fewest GPUs of this type
// (the core's FewestGpus, in a worker), and the simulated rank: which rank and why
// (estimate.rank), and a cluster picture of where each model state lives (estimate.rank.holds)
// with the rank's bytes (estimate.modelStates). Nothing here computes a byte.
//
// The single-file page shares one scope between the panels: every top-level name here starts
// with "parallel" (scripts/assemble-web.mjs refuses duplicates).

import { optionControl } from './option-field.js';
import { formatBytes, formatExactBytes } from './charts.js';
import { errorText, errorsOf } from './errors.js';
import { $, displayNumber, numberValue, state } from './page-state.js';
import { isPlainObject, mergeSetup, setSelectValue } from './setup-form.js';

// The fields shown first: the ones people set; the rest are the frameworks' tuning knobs.
const PARALLEL_MAIN_KEYS = ['dataParallel', 'zeroStage', 'fsdp', 'offload', 'tensorParallel', 'sequenceParallel', 'pipelineParallel', 'gradientAccumulationSteps', 'contextParallel', 'expertParallel'];
// Boxes drawn at most; a larger job is drawn as its first boxes and a count.
const PARALLEL_MAX_BOXES = 64;
const PARALLEL_STATES = [
  { key: 'parameters', bytes: 'parametersBytes', label: 'parameters' },
  { key: 'masterWeights', bytes: 'masterWeightsBytes', label: 'fp32 master' },
  { key: 'gradients', bytes: 'gradientsBytes', label: 'gradients' },
  { key: 'optimizerStates', bytes: 'optimizerStatesBytes', label: 'optimizer states' },
];

export function parallelFields() {
  return Array.isArray(state.options.parallelFields) ? state.options.parallelFields : [];
}

export function parallelAvailable() {
  return parallelFields().length > 0 && isPlainObject(state.options.defaultSetup.parallel);
}

function parallelFieldId(key) {
  return `parallel-${key}`;
}

function parallelFieldElement(f) {
  const { wrap } = optionControl(f, parallelFieldId(f.key), { field: `parallel.${f.key}`, parallel: f.key });
  wrap.dataset.parallelField = f.key;
  return wrap;
}

export function buildParallelFields() {
  const fold = $('#parallel-fold');
  if (!fold) return;
  fold.hidden = !parallelAvailable();
  const fields = parallelFields();
  $('#parallel-main').replaceChildren(...fields.filter((f) => PARALLEL_MAIN_KEYS.includes(f.key)).map(parallelFieldElement));
  $('#parallel-more').replaceChildren(...fields.filter((f) => !PARALLEL_MAIN_KEYS.includes(f.key)).map(parallelFieldElement));
  $('#parallel-fewest').hidden = typeof state.api.fewestGpus !== 'function' || !state.engine;
  $('#parallel-import').hidden = typeof state.api.importDeepSpeed !== 'function';
  $('#parallel-layouts').hidden = typeof state.api.layouts !== 'function' || !state.engine;
}

export function readParallel() {
  const out = {};
  for (const f of parallelFields()) {
    const input = $(`#${parallelFieldId(f.key)}`);
    if (!input) continue;
    if (f.kind === 'bool') out[f.key] = input.checked;
    else if (f.kind === 'select') out[f.key] = input.value;
    else out[f.key] = numberValue(input);
  }
  return out;
}

export function fillParallel(parallel) {
  const values = mergeSetup(state.options.defaultSetup.parallel ?? {}, isPlainObject(parallel) ? parallel : {});
  for (const f of parallelFields()) {
    const input = $(`#${parallelFieldId(f.key)}`);
    if (!input) continue;
    const v = values[f.key];
    if (f.kind === 'bool') input.checked = Boolean(v);
    else if (f.kind === 'select') setSelectValue(input, v);
    else input.value = displayNumber(v);
  }
  if (JSON.stringify(readParallel()) !== JSON.stringify(state.options.defaultSetup.parallel)) $('#parallel-fold').open = true;
}

// --- Imports: the core reads the text onto the current setup ----------------------------------

function parallelStatus(text, isError = false) {
  const status = $('#parallel-import-status');
  status.textContent = text;
  status.dataset.state = isError ? 'error' : 'ok';
}

const PARALLEL_IMPORTS = {
  deepspeed: { call: 'importDeepSpeed', empty: 'Paste or drop a DeepSpeed config first.', done: 'Read the DeepSpeed config.' },
  megatron: { call: 'importMegatron', empty: 'Paste Megatron-LM arguments first.', done: "Read Megatron-LM's arguments." },
  accelerate: { call: 'importAccelerate', empty: 'Paste an accelerate config first.', done: 'Read the accelerate config.' },
};

// kind: 'deepspeed' (a ds_config.json's text), 'megatron' (a command line) or 'accelerate' (the
// YAML accelerate config writes). onApplied(setup): the page fills its form and estimates it.
export function parallelImport(kind, text, currentSetup, onApplied) {
  const importer = PARALLEL_IMPORTS[kind];
  if (!String(text).trim()) {
    parallelStatus(importer.empty, true);
    return;
  }
  let result;
  try {
    result = state.api[importer.call](text, currentSetup);
  } catch (exception) {
    parallelStatus(errorsOf(exception).map(errorText).join(' '), true);
    return;
  }
  onApplied(result.setup);
  const parts = [importer.done];
  if (result.notes?.length) parts.push(result.notes.join(' '));
  if (result.ignoredFields?.length) parts.push(`Not modelled, ignored: ${result.ignoredFields.join(', ')}.`);
  parallelStatus(parts.join(' '));
}

// A dropped ds_config.json: its text goes to the DeepSpeed import.
export function wireParallelDrop(getSetup, onApplied) {
  const box = $('#parallel-deepspeed');
  if (!box) return;
  box.addEventListener('dragover', (event) => event.preventDefault());
  box.addEventListener('drop', async (event) => {
    const file = event.dataTransfer?.files?.[0];
    if (!file) return;
    event.preventDefault();
    event.stopPropagation();  // not the model section's drop target
    box.value = await file.text();
    parallelImport('deepspeed', box.value, getSetup(), onApplied);
  });
}

// Runs one request in the 'parallel' worker lane into `out`: "running" while it works, the
// core's errors when it refuses, else `onResult(result)` with the state "done".
function runInParallelLane(out, request, onResult) {
  out.replaceChildren(document.createTextNode('Simulating layouts…'));
  out.dataset.state = 'running';
  state.engine.run('parallel', [request], (outcome) => {
    if (outcome.errors) {
      out.dataset.state = 'error';
      out.replaceChildren(document.createTextNode(outcome.errors.map(errorText).join(' ')));
      return;
    }
    out.dataset.state = 'done';
    out.dataset.inWorker = String(Boolean(outcome.inWorker));
    onResult(outcome.result);
  });
}

// --- Fewest GPUs: the core's FewestGpus in the 'parallel' worker lane ---------------------------

export function parallelRunFewest(setup, onUse) {
  const out = $('#parallel-fewest-result');
  runInParallelLane(out, { kind: 'fewestGpus', setup }, (r) => {
    out.dataset.found = String(r.found);
    if (!r.found) {
      out.replaceChildren(document.createTextNode(`No layout of up to 4,096 GPUs of this type fits (${r.estimatesRun} setups simulated).`));
      return;
    }
    out.dataset.gpus = String(r.gpus);
    out.dataset.peakDeviceBytes = String(r.peakDeviceBytes);
    const text = document.createElement('p');
    text.id = 'parallel-fewest-text';
    text.textContent = `${r.gpus} GPU${r.gpus === 1 ? '' : 's'} with ${r.layout}: ${formatBytes(r.peakDeviceBytes)} on the device per rank; ` +
      `${r.communicationParameters} Ψ communicated per step and rank (${r.estimatesRun} setups simulated).`;
    // Offloading trades GPUs for host RAM: what a node needs, and the answer without it.
    const host = document.createElement('p');
    host.id = 'parallel-fewest-host';
    const skipped = r.hostTooSmall > 0
      ? ` ${r.hostTooSmall} offloading layout${r.hostTooSmall === 1 ? '' : 's'} skipped: more host memory per node than stated.`
      : '';
    if (r.offload) {
      const alt = r.withoutOffload;
      host.textContent = `Needs ${formatBytes(r.hostNodeBytes)} of host memory per node. ` +
        (alt ? `Without offloading: ${alt.gpus} GPU${alt.gpus === 1 ? '' : 's'} with ${alt.layout} (${formatBytes(alt.peakDeviceBytes)} per rank).`
             : 'Without offloading no layout of up to 4,096 GPUs fits.') + skipped;
    } else {
      host.textContent = skipped.trim();
    }
    host.hidden = host.textContent === '';
    out.dataset.hostNodeBytes = String(r.hostNodeBytes ?? 0);
    const use = document.createElement('button');
    use.type = 'button';
    use.id = 'parallel-fewest-use';
    use.textContent = 'Use this layout';
    use.addEventListener('click', () => onUse(r.setup));
    out.replaceChildren(text, host, use);
  });
}

// --- Layouts for N GPUs: the core's LayoutsForCluster in the 'parallel' worker lane ----------

const PARALLEL_LAYOUT_COLUMNS = ['dp × tp × pp', 'sharding', 'offload', 'checkpointing', 'peak per rank / capacity', 'communication per step', 'host (PCIe)', 'bubble', 'compute ×'];

function parallelLayoutRow(row, index, onUse) {
  const tr = document.createElement('tr');
  tr.dataset.index = String(index);
  tr.dataset.peakDeviceBytes = String(row.peakDeviceBytes);
  tr.dataset.communicationBytes = String(row.cost.communicationBytes);
  tr.title = 'Use this layout';
  const cells = [
    `${row.dataParallel} × ${row.tensorParallel} × ${row.pipelineParallel}`,
    row.sharding,
    row.hostNodeBytes > 0 ? `${row.offload} (${formatBytes(row.hostNodeBytes)} host per node)` : row.offload,
    row.checkpointing ? 'every block' : 'none',
    `${formatBytes(row.peakDeviceBytes)} / ${formatBytes(row.capacityBytes)}`,
    formatBytes(row.cost.communicationBytes),
    formatBytes(row.cost.hostBytes),
    `${(100 * row.cost.bubbleFraction).toFixed(1)} %`,
    row.cost.computeFactor.toFixed(3),
  ];
  for (const text of cells) tr.append(parallelElement('td', '', text));
  tr.addEventListener('click', () => onUse(row.setup));
  return tr;
}

export function parallelRunLayouts(setup, onUse) {
  const out = $('#parallel-layouts-result');
  const gpus = numberValue($('#parallel-layouts-gpus'));
  runInParallelLane(out, { kind: 'layouts', setup, options: { gpus } }, (r) => {
    out.dataset.rows = String(r.rows.length);
    const summary = parallelElement('p', 'hint', `${r.rows.length} layout${r.rows.length === 1 ? '' : 's'} of ${r.gpus} GPUs fit, best first ` +
      `(no host offload, then bubble and recompute, then bytes communicated). ${r.candidates} candidates: ${r.estimates} simulated, ` +
      `${r.notFitting} did not fit, ${r.refused} refused by validation, ${r.dominated} skipped as dominated` +
      (r.notEstimated ? `, ${r.notEstimated} not simulated (limit reached)` : '') + '. Click a row to use it.');
    summary.id = 'parallel-layouts-summary';
    if (!r.rows.length) {
      out.replaceChildren(summary);
      return;
    }
    const table = parallelElement('table');
    table.id = 'parallel-layouts-table';
    const head = parallelElement('thead');
    const headRow = parallelElement('tr');
    for (const c of PARALLEL_LAYOUT_COLUMNS) headRow.append(parallelElement('th', '', c));
    head.append(headRow);
    const body = parallelElement('tbody');
    r.rows.forEach((row, i) => body.append(parallelLayoutRow(row, i, onUse)));
    table.append(head, body);
    out.replaceChildren(summary, table);
  });
}

// --- The simulated rank and the cluster picture ------------------------------------------------

const PARALLEL_PLACEMENT_TEXT = {
  replicated: 'a whole copy',
  sharded: 'its shard',
  host: 'on the host (offloaded)',
  none: 'none kept',
};

function parallelPlacementText(placement, rank) {
  if (placement === 'sharded') return `sharded 1/${rank.shardWorld}`;
  return PARALLEL_PLACEMENT_TEXT[placement] ?? placement;
}

function parallelElement(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

// One GPU's box: each model state's bytes on the simulated rank and where it lives.
function parallelGpuBox(index, rank, states, simulated, exactForAll) {
  const box = parallelElement('li', 'gpu-box');
  box.dataset.rank = String(index);
  if (simulated) box.dataset.simulated = 'true';
  box.append(parallelElement('strong', '', `GPU ${index}${simulated ? ' (simulated)' : ''}`));
  const list = parallelElement('dl', 'gpu-states');
  for (const s of PARALLEL_STATES) {
    const placement = rank.holds?.[s.key] ?? 'replicated';
    const bytes = states[s.bytes];
    const term = parallelElement('dt', '', s.label);
    const value = parallelElement('dd');
    value.dataset.state = s.key;
    value.dataset.placement = placement;
    if (simulated || exactForAll) {
      value.dataset.bytes = String(bytes);
      value.title = formatExactBytes(bytes);
      value.textContent = `${formatBytes(bytes)} · ${parallelPlacementText(placement, rank)}`;
    } else {
      value.textContent = `at most GPU ${rank.dataParallelRank}'s · ${parallelPlacementText(placement, rank)}`;
    }
    list.append(term, value);
  }
  box.append(list);
  if (simulated || exactForAll) {
    const total = parallelElement('p', 'gpu-total', `model states ${formatBytes(states.totalBytes)}`);
    total.dataset.bytes = String(states.totalBytes);
    box.append(total);
  }
  return box;
}

export function renderParallel(est) {
  const card = $('#cluster');
  if (!card) return;
  const rank = est.rank;
  card.hidden = !rank;
  if (!rank) return;
  $('#parallel-rank-engine').textContent = rank.engine;
  const where = $('#parallel-rank-where');
  where.textContent = `${rank.worldSize} GPUs; simulated: data-parallel rank ${rank.dataParallelRank}, tensor-parallel rank ${rank.tensorParallelRank}, ` +
    `pipeline stage ${rank.pipelineStage}; model states split over ${rank.shardWorld} rank${rank.shardWorld === 1 ? '' : 's'}.`;
  where.dataset.worldSize = String(rank.worldSize);
  $('#parallel-rank-why').textContent = `Why this rank: ${rank.why}.`;
  // torch's ZeroRedundancyOptimizer gives whole parameters to ranks: the simulated rank holds the
  // most, the others at most as much (SimulatedRankOf). Every other engine pads its partitions so
  // every rank holds the same bytes (docs/parallel.md, "Which rank").
  const exactForAll = !(rank.engine.includes('ZeroRedundancyOptimizer'));
  const simulatedIndex = rank.dataParallelRank;
  const drawn = Math.min(rank.worldSize, PARALLEL_MAX_BOXES);
  const boxes = [];
  for (let i = 0; i < drawn; i += 1) boxes.push(parallelGpuBox(i, rank, est.modelStates, i === simulatedIndex, exactForAll));
  $('#cluster-picture').replaceChildren(...boxes);
  const more = $('#cluster-more');
  more.hidden = rank.worldSize <= drawn;
  more.textContent = `… and ${rank.worldSize - drawn} more GPUs, each as above.`;
}
