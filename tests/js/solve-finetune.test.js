// "Make it fit" for fine-tuning (issue 11): Llama 3 8B on an RTX 4090 with the page's default
// training settings has an answer that fits, and the page's way of applying it (merging the
// suggestion's partial `change` into the setup) gives that answer. Run with `node --test
// tests/js/` after building the wasm.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem } from '../../wasm/gpumem.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
// web/setup-form.js mergeSetup, as the page applies a suggestion (that module needs the page's
// DOM): objects merge, arrays and values replace.
function mergeSetup(base, over) {
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const plain = (x) => x && typeof x === 'object' && !Array.isArray(x);
    out[k] = plain(v) && plain(base?.[k]) ? mergeSetup(base[k], v) : v;
  }
  return out;
}
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });

test('Llama 3 8B on a 24 GB card: the first suggestion is LoRA or QLoRA and applying it fits', () => {
  const setup = mergeSetup(gpumem.defaultSetup(), { model: { kind: 'transformer', preset: 'llama-3-8b' }, gpu: { id: 'nvidia-rtx-4090' } });
  delete setup.model.architecture;
  // The card's own 23.65 GiB (CUDA's total): the default setup's memoryGiB (80) would win over the id.
  delete setup.gpu.memoryGiB;
  assert.equal(gpumem.estimate(setup).gpu.capacityBytes, 25393692672);
  assert.equal(gpumem.estimate(setup).gpu.fits, false);
  const result = gpumem.solve(setup);
  const first = result.suggestions[0];
  assert.ok(first, 'a suggestion');
  assert.equal(first.fits, true, JSON.stringify(first));
  assert.match(first.id, /finetune-(q)?lora/);
  assert.equal(first.change.finetune.lora, true);
  const applied = gpumem.estimate(mergeSetup(setup, first.change));
  assert.equal(applied.gpu.fits, true);
  assert.equal(applied.device.peakDeviceBytes, first.peakBytes);
  for (const id of ['finetune-lora', 'finetune-qlora']) {
    const s = result.suggestions.find((x) => x.id === id);
    assert.ok(s, `${id} offered`);
    assert.equal(s.cost, 'changesResults');
    assert.deepEqual(s.change.finetune.targetModules, ['q_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'qkv_proj', 'gate_up_proj']);
    assert.equal(gpumem.estimate(mergeSetup(setup, s.change)).device.peakDeviceBytes, s.peakBytes, `${id}: its change gives its peak`);
  }
  const qlora = result.suggestions.find((x) => x.id === 'finetune-qlora');
  assert.deepEqual([qlora.change.finetune.quantization, qlora.change.finetune.doubleQuant, qlora.change.finetune.computeDType], ['nf4', true, 'bf16']);
});

test('one list of training modes: the page\'s options.trainingModes are what make it fit applies', () => {
  const modes = gpumem.options().trainingModes;
  assert.deepEqual(modes.map((m) => m.id), ['full', 'lora', 'qlora']);
  for (const m of modes) {
    assert.ok(m.label && m.source, `${m.id}: label and source`);
    assert.deepEqual(Object.keys(m.finetuneByFamily).sort(), ['bert', 'gpt2', 'gptNeox', 'llama']);
  }
  // full is the default finetune section.
  for (const section of Object.values(modes[0].finetuneByFamily)) assert.deepEqual(section, gpumem.defaultSetup().finetune);
  for (const [preset, family, gpu] of [['llama-3-8b', 'llama', { id: 'nvidia-rtx-4090' }], ['gpt2-xl', 'gpt2', { memoryGiB: 8 }],
    ['pythia-6.9b', 'gptNeox', { id: 'nvidia-rtx-4090' }]]) {
    const setup = mergeSetup(gpumem.defaultSetup(), { model: { kind: 'transformer', preset }, gpu });
    delete setup.model.architecture;
    const result = gpumem.solve(setup);
    for (const id of ['lora', 'qlora']) {
      const mode = modes.find((m) => m.id === id);
      const suggestion = result.suggestions.find((x) => x.id === `finetune-${id}`);
      assert.ok(suggestion, `${preset}: finetune-${id} offered`);
      // What the page's "What you will do" writes (the whole section) and what the solver's
      // suggestion gives once applied are the same finetune section.
      assert.deepEqual(mergeSetup(setup, suggestion.change).finetune, mode.finetuneByFamily[family], `${preset} ${id}`);
      assert.ok(suggestion.label.includes(mode.label), `${preset} ${id}: labelled as the mode`);
    }
  }
});
