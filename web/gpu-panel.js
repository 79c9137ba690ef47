// The GPU list and the byte units.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { setByteUnits } from './charts.js';
import { renderSafetensors } from './import-panel.js';
import { writeHash } from './link.js';
import { $, $$, parseNumberText, state } from './page-state.js';
import { render } from './results-panel.js';
import { renderSolve } from './solve-panel.js';
import { renderViews } from './views-panel.js';

// ---------- GPU list and units ----------

function gpus() {
  return Array.isArray(state.options?.gpus) ? state.options.gpus : [];
}

export function gpuById(id) {
  return id ? gpus().find((g) => g.id === id) : undefined;
}

// The listed GPU a setup's gpu section names at its own capacity (no size of another given).
export function listedGpuOf(gpu) {
  const listed = gpuById(gpu?.id);
  return listed && (gpu.memoryGiB === undefined || gpu.memoryGiB === listed.memoryGiB) ? listed : undefined;
}

const GPU_KIND_LABELS = { dataCenter: 'Data centre', workstation: 'Workstation', consumer: 'Consumer' };

// The select lists options.gpus grouped by kind; without a list (an older core) only the size
// field is shown.
export function buildGpuSelect() {
  const list = gpus();
  $('#gpu-field').hidden = list.length === 0;
  const select = $('#gpu');
  select.replaceChildren(new Option('Custom size', ''));
  const groups = new Map();
  for (const gpu of list) {
    const key = GPU_KIND_LABELS[gpu.kind] ?? gpu.kind ?? 'Other';
    if (!groups.has(key)) {
      const group = document.createElement('optgroup');
      group.label = key;
      groups.set(key, group);
      select.append(group);
    }
    const option = new Option(gpu.label, gpu.id);
    option.title = `${gpu.vendor} · ${gpuCapacityText(gpu)}`;
    groups.get(key).append(option);
  }
}

// A listed GPU's capacity for people: CUDA's total to 2 decimals, as PyTorch's out-of-memory
// message writes it (whole GiB stay whole). The size field shows the same; the setup carries the
// exact figure (readForm), so the field need not hold 23.649719297885895.
export function gpuCapacityField(gpu) {
  return Number.isInteger(gpu.memoryGiB) ? String(gpu.memoryGiB) : gpu.memoryGiB.toFixed(2);
}

function gpuCapacityText(gpu) {
  return `${gpuCapacityField(gpu)} GiB`;
}

// Whether the size field's text is this GPU's capacity: as shown, or exact.
export function fieldHoldsGpu(text, gpu) {
  return String(text).trim() === gpuCapacityField(gpu) || parseNumberText(text) === gpu.memoryGiB;
}

// The select names a GPU only while the size field holds that GPU's memory.
export function syncGpuSelect() {
  const gpu = gpuById(state.gpuId);
  if (!gpu || !fieldHoldsGpu($('#memoryGiB').value, gpu)) state.gpuId = '';
  $('#gpu').value = state.gpuId;
  const hint = $('#gpu-hint');
  const chosen = gpuById(state.gpuId);
  hint.textContent = chosen
    // Every listed GPU carries its source (tests/device_overheads_test.cpp).
    ? `${chosen.label}: ${gpuCapacityText(chosen)}, the capacity CUDA reports (${chosen.capacitySource}).`
    : gpus().length
      ? 'Choose a GPU, or type a custom size in GiB (2^30 bytes): the total CUDA reports (torch.cuda.get_device_properties(0).total_memory), a little below the size sold.'
      : 'Memory in GiB (2^30 bytes).';
}

export function onGpuChange() {
  const gpu = gpuById($('#gpu').value);
  state.gpuId = gpu?.id ?? '';
  if (gpu) $('#memoryGiB').value = gpuCapacityField(gpu);
  syncGpuSelect();
}

export function setUnits(units, { rerender = true } = {}) {
  state.units = setByteUnits(units === 'GB' || units === 'gb' ? 'GB' : 'GiB');
  for (const radio of $$('input[name=units]')) radio.checked = radio.value === state.units;
  document.documentElement.dataset.units = state.units;
  if (!rerender) return;
  if (state.lastGood) render(state.lastGood);
  renderSafetensors();
  renderSolve();
  renderViews();
  writeHash();
}
