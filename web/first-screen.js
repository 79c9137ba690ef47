// The first screen: the three things people bring (the model, the GPU, what they will do) at the
// top of the form, the answer beside them. The lists come from the core's options; the words
// naming each precision by its framework flag are the page's.

import { $, $$, state } from './page-state.js';
import { presetById, onPresetChange } from './model-panel.js';
import { setSelectValue } from './setup-form.js';

// The setup a first visit shows: a real model on a real GPU with what most people run. Llama
// 3.2 1B on an RTX 4090 under the Trainer's bf16=True (autocast bf16 over fp32 weights) with
// SDPA attention (below). Every other field is the core's DefaultSetup; the core validates the
// ids, and a core without them leaves the page on its DefaultSetup.
export const FIRST_VISIT = { presetId: 'llama-3.2-1b', gpuId: 'nvidia-rtx-4090', precision: 'ampBf16', attention: 'sdpa' };

export function firstVisitSetup() {
  const o = state.options;
  const ok = o.presets?.some((p) => p.id === FIRST_VISIT.presetId) && o.gpus?.some((g) => g.id === FIRST_VISIT.gpuId)
    && o.precisions?.some((p) => p.id === FIRST_VISIT.precision) && o.attentions?.some((a) => a.id === FIRST_VISIT.attention);
  if (!ok) return o.defaultSetup;
  const preset = presetById(FIRST_VISIT.presetId);
  return {
    ...o.defaultSetup,
    model: { kind: state.archKind, preset: preset.id, architecture: preset.architecture },
    training: {
      ...o.defaultSetup.training,
      precision: FIRST_VISIT.precision,
      attention: FIRST_VISIT.attention,
      ...(preset.defaultSequenceLength ? { sequenceLength: preset.defaultSequenceLength } : {}),
    },
    gpu: { id: FIRST_VISIT.gpuId },
  };
}

// Which framework setting each precision is, so people can match what they run:
//   transformers TrainingArguments bf16 / fp16 (trainer.py: `torch.autocast` via accelerate's
//   `Accelerator(mixed_precision=...)`, weights stay fp32; fp16 adds a GradScaler);
//   `from_pretrained(torch_dtype=torch.bfloat16)` trains the bf16 weights directly;
//   DeepSpeed `bf16`/`fp16` and Megatron `--bf16`/`--fp16` keep 16-bit weights with fp32 master
//   copies (DeepSpeed BF16_Optimizer / FP16_Optimizer; Megatron Float16OptimizerWithFloat16Params).
const PRECISION_FLAGS = {
  fp32: 'Trainer default (no bf16/fp16 flag)',
  ampBf16: 'Trainer bf16=True',
  ampFp16: 'Trainer fp16=True',
  bf16: 'torch_dtype=torch.bfloat16, no autocast',
  bf16Mixed: 'DeepSpeed / Megatron bf16',
  fp16Mixed: 'DeepSpeed / Megatron fp16, Apex O2',
};

export function precisionItems(precisions) {
  return precisions.map((p) => ({ id: p.id, label: PRECISION_FLAGS[p.id] ? `${PRECISION_FLAGS[p.id]} — ${p.label}` : p.label }));
}

export function buildFirstScreen() {
  const list = $('#preset-names');
  list.replaceChildren(...(state.options.presets ?? []).map((p) => {
    const option = document.createElement('option');
    option.value = p.label;
    option.label = p.id;
    return option;
  }));
  // What you will do: full training until the fine-tuning panel fills it from the core's
  // training modes (finetune-panel.js, options.trainingModes: they set the finetune section).
  const select = $('#training-mode');
  select.replaceChildren(new Option('Full training (every parameter learns)', ''));
  select.disabled = true;
}

// The preset a search text names: its label or id exactly, else the one preset whose label or id
// contains every word typed.
export function presetForSearch(text) {
  const t = text.trim().toLowerCase();
  if (!t) return null;
  const presets = state.options.presets ?? [];
  const exact = presets.find((p) => p.label.toLowerCase() === t || p.id.toLowerCase() === t);
  if (exact) return exact;
  const words = t.split(/\s+/);
  const matches = presets.filter((p) => words.every((w) => `${p.label} ${p.id}`.toLowerCase().includes(w)));
  return matches.length === 1 ? matches[0] : null;
}

// Choosing a preset from the search: the transformer mode, the preset's architecture and length,
// and SDPA attention, which transformers picks by default for these models (modeling_utils.py,
// PreTrainedModel._check_and_adjust_attn_implementation: "sdpa" when torch supports it).
// Returns whether the text named a preset.
export function onModelSearch({ final = false } = {}) {
  const input = $('#model-search');
  const preset = presetForSearch(input.value);
  const hint = $('#model-search-status');
  if (!preset) {
    hint.textContent = final && input.value.trim() ? `No preset matches “${input.value.trim()}”; try a family name (llama, qwen, gpt2), or import its config.json.` : '';
    return false;
  }
  hint.textContent = '';
  input.value = preset.label;
  for (const radio of $$('input[name=modelKind]')) radio.checked = radio.value === state.archKind;
  setSelectValue($('#preset'), preset.id);
  onPresetChange();
  if (state.options.attentions?.some((a) => a.id === 'sdpa')) setSelectValue($('#attention'), 'sdpa');
  return true;
}

// The search box follows the form: a preset's name, or empty with a word on what the model is.
export function syncModelSearch() {
  const input = $('#model-search');
  if (document.activeElement === input) return;
  const kind = $('input[name=modelKind]:checked')?.value;
  const preset = kind === state.archKind ? presetById($('#preset').value) : null;
  input.value = preset ? preset.label : '';
  const what = kind === state.archKind ? 'custom architecture (below)' : kind === state.layersKind ? 'layer list (below)' : 'parameter count, quick mode (below)';
  input.placeholder = preset ? 'Search presets: llama, qwen, gpt2…' : `${what}; search presets…`;
}
