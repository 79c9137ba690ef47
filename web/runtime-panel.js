// The runtime fold: PyTorch's allocator options, the CUDA context and cuBLAS workspaces.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { $, $$, displayNumber, numberValue, state } from './page-state.js';
import { isPlainObject, mergeSetup } from './setup-form.js';

// ---------- runtime: PyTorch's allocator, the CUDA context, cuBLAS ----------

// Labels for the runtime fields, by their path under `runtime`: the names people set in
// PYTORCH_CUDA_ALLOC_CONF and the environment (c10/core/AllocatorConfig.cpp parseArgs;
// aten/src/ATen/cuda/CublasHandlePool.cpp). The fields themselves, their kinds and defaults
// come from the core's defaultSetup.runtime, so a field the core adds appears here by its key.
const RUNTIME_FIELDS = {
  'allocator.expandableSegments': { label: 'expandable_segments:True', hint: 'Segments grow in place instead of new cudaMalloc blocks: fewer stranded fragments.' },
  'allocator.maxSplitSizeMiB': { label: 'max_split_size_mb', unit: 'MiB; 0 = no limit, PyTorch\'s default', hint: 'Cached blocks larger than this are never split.' },
  'allocator.roundupPower2Divisions': { label: 'roundup_power2_divisions', unit: 'divisions; 0 = off, the default', hint: 'Rounds request sizes to steps between powers of two.' },
  'allocator.garbageCollectionThreshold': { label: 'garbage_collection_threshold', unit: 'fraction 0–1; 0 = off', hint: 'Frees old cached blocks above this share of the memory (only with a memory fraction set, as in PyTorch).' },
  cudaContextMiB: { label: 'CUDA context', unit: 'MiB; 0 = gpumem\'s default for this GPU', hint: 'Enter what nvidia-smi shows for a process that only initialised CUDA.' },
  ncclBuffersMiB: { label: 'NCCL buffers', unit: 'MiB per GPU; 0 = gpumem\'s estimate (none on one GPU)', hint: 'NCCL\'s communicator buffers, outside PyTorch\'s allocator: nvidia-smi after a step minus memory_reserved minus the context.' },
  cublasWorkspaceConfig: { label: 'CUBLAS_WORKSPACE_CONFIG', unit: 'e.g. :4096:8; empty = PyTorch\'s default', hint: 'Each :SIZE_KiB:COUNT pair adds SIZE × COUNT KiB per handle and stream.' },
  pytorchVersion: { label: 'torch.__version__', unit: 'major.minor, e.g. 2.5 or 1.10', hint: 'Before 1.11 softmax kept its input for backward; before 2.0 one 4 MiB cuBLAS workspace and no SDPA.' },
  deepspeedVersion: { label: 'deepspeed.__version__', unit: 'e.g. 0.19 or 0.18.7', hint: 'ZeRO-1/2 only: from 0.18.7 the trainable parameters are flattened on the GPU when they fit twice, and their freed storages stay cached.' },
  cudaVersion: { label: 'torch.version.cuda', unit: 'major.minor, e.g. 12.4', hint: 'Before CUDA 11.7 every kernel image loads at start: a larger context.' },
  hostMemoryGiB: { label: 'Host memory per node', unit: 'GiB of CPU RAM; 0 = not stated', hint: 'What offloading keeps on the host must fit here; the fewest-GPUs search and the cluster layouts skip an offload that does not.' },
  lazyModuleLoading: { label: 'CUDA_MODULE_LOADING=LAZY', hint: 'PyTorch sets it since 1.13; off, the context loads every kernel image.' },
};

// [{path, value}] for every leaf of the core's default runtime, in its order.
function runtimeLeaves(object, prefix = '') {
  return Object.entries(object ?? {}).flatMap(([key, value]) => (isPlainObject(value)
    ? runtimeLeaves(value, `${prefix}${key}.`)
    : [{ path: `${prefix}${key}`, value }]));
}

function runtimeInputId(path) {
  return `runtime-${path.replace(/\./g, '-')}`;
}

export function buildRuntimeFields() {
  const box = $('#runtime-fields');
  const allocator = document.createElement('fieldset');
  const allocatorLegend = document.createElement('legend');
  allocatorLegend.textContent = 'PYTORCH_CUDA_ALLOC_CONF';
  allocator.append(allocatorLegend);
  const device = document.createElement('div');
  for (const { path, value } of runtimeLeaves(state.options.defaultSetup.runtime)) {
    const meta = RUNTIME_FIELDS[path] ?? { label: path };
    const id = runtimeInputId(path);
    const wrap = document.createElement('div');
    const input = document.createElement('input');
    input.id = id;
    input.dataset.field = `runtime.${path}`;
    input.dataset.runtime = path;
    const label = document.createElement('label');
    label.htmlFor = id;
    const name = document.createElement('code');
    name.textContent = meta.label;
    label.append(name);
    if (typeof value === 'boolean') {
      wrap.className = 'check';
      input.type = 'checkbox';
      wrap.append(input, label);
    } else {
      wrap.className = 'field';
      input.type = 'text';
      input.spellcheck = false;
      if (typeof value === 'number') input.inputMode = 'decimal';
      if (meta.unit) {
        const unit = document.createElement('span');
        unit.className = 'unit';
        unit.textContent = ` (${meta.unit})`;
        label.append(unit);
      }
      wrap.append(label, input);
    }
    if (meta.hint) {
      const hint = document.createElement('p');
      hint.className = 'hint';
      hint.id = `${id}-hint`;
      hint.textContent = meta.hint;
      input.setAttribute('aria-describedby', hint.id);
      wrap.append(hint);
    }
    (path.startsWith('allocator.') ? allocator : device).append(wrap);
  }
  box.replaceChildren(allocator, device);
}

export function readRuntime() {
  const runtime = {};
  for (const input of $$('#runtime-fields [data-runtime]')) {
    const keys = input.dataset.runtime.split('.');
    let at = runtime;
    for (const key of keys.slice(0, -1)) at = (at[key] ??= {});
    const defaultValue = keys.reduce((o, k) => o?.[k], state.options.defaultSetup.runtime);
    at[keys[keys.length - 1]] = input.type === 'checkbox' ? input.checked
      : typeof defaultValue === 'number' ? numberValue(input) : input.value;
  }
  return runtime;
}

export function fillRuntime(runtime) {
  const values = mergeSetup(state.options.defaultSetup.runtime, isPlainObject(runtime) ? runtime : {});
  for (const input of $$('#runtime-fields [data-runtime]')) {
    const value = input.dataset.runtime.split('.').reduce((o, k) => o?.[k], values);
    if (input.type === 'checkbox') input.checked = Boolean(value);
    else input.value = displayNumber(value);
  }
  // A setup that changes the runtime opens the fold, so nothing that moves the figure is hidden.
  if (JSON.stringify(values) !== JSON.stringify(state.options.defaultSetup.runtime)) $('#runtime-fold').open = true;
}
