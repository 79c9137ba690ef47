// The first screen (issue 13): at 1366×768 the model, the GPU, what you will do and the verdict
// are in view without scrolling; the first visit is Llama 3.2 1B on an RTX 4090 with SDPA and the
// Trainer's bf16=True; presets are found by typing their name; precision options name their flag.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { useBrowser, openPage, waitForAttr, coreEstimate, screenshotDir, WAIT } from './harness.js';

useBrowser();

const LAPTOP = { width: 1366, height: 768 };

async function inView(page, selector) {
  return page.$eval(selector, (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight && r.left >= 0 && r.right <= window.innerWidth;
  });
}

test('first view at 1366×768: model, GPU, what you will do and the verdict in view; Llama 3.2 1B on an RTX 4090', async () => {
  const { page, finish } = await openPage({ viewport: LAPTOP });
  const expected = await coreEstimate({
    model: { preset: 'llama-3.2-1b' },
    training: { precision: 'ampBf16', attention: 'sdpa', sequenceLength: (await page.inputValue('#sequenceLength')) * 1 },
    gpu: { id: 'nvidia-rtx-4090' },
  });
  await waitForAttr(page, '#peak-total', 'data-bytes', String(expected.peak.totalBytes));
  assert.equal(await page.inputValue('#model-search'), 'Llama 3.2 1B');
  assert.equal(await page.inputValue('#gpu'), 'nvidia-rtx-4090');
  assert.equal(await page.inputValue('#precision'), 'ampBf16');
  assert.equal(await page.inputValue('#attention'), 'sdpa');
  assert.equal(await page.getAttribute('#verdict', 'data-verdict'), expected.device.verdict);
  assert.equal(await page.getAttribute('#peak-device', 'data-bytes'), String(expected.device.peakDeviceBytes), 'the device figure beside the peak');
  for (const selector of ['#model-search', '#gpu', '#training-mode', '#verdict', '#peak-total', '#peak-device', '#verdict-why']) {
    assert.ok(await inView(page, selector), `${selector} is in view without scrolling`);
  }
  assert.equal(await page.evaluate(() => window.scrollY), 0);
  // Quick mode, the layer list and the architecture's fields are "advanced": folded for a preset.
  assert.equal(await page.getAttribute('#model-details', 'open'), null);
  assert.equal(await page.isVisible('input[name=modelKind]'), false);
  await page.screenshot({ path: join(screenshotDir, 'first-view-1366x768.png') });
  await finish();
});

test('typing a model name finds its preset; SDPA follows the framework; an unknown name says what to do', async () => {
  const { page, finish } = await openPage({ viewport: LAPTOP });
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  await page.selectOption('#attention', 'eager');
  await page.fill('#model-search', 'qwen 0.5');
  await page.press('#model-search', 'Enter');
  assert.equal(await page.inputValue('#model-search'), 'Qwen2.5 0.5B');
  assert.equal(await page.inputValue('#preset'), 'qwen2.5-0.5b');
  assert.equal(await page.inputValue('#attention'), 'sdpa', 'transformers picks SDPA by default');
  const seq = Number(await page.inputValue('#sequenceLength'));
  const expected = await coreEstimate({ model: { preset: 'qwen2.5-0.5b' }, training: { precision: 'ampBf16', attention: 'sdpa', sequenceLength: seq }, gpu: { id: 'nvidia-rtx-4090' } });
  await waitForAttr(page, '#peak-total', 'data-bytes', String(expected.peak.totalBytes));
  // Focus stays in the search box after Enter.
  assert.equal(await page.evaluate(() => document.activeElement.id), 'model-search');

  await page.fill('#model-search', 't5-small');
  await page.press('#model-search', 'Enter');
  assert.match(await page.textContent('#model-search-status'), /No preset matches “t5-small”.*config\.json/);
  await waitForAttr(page, '#peak-total', 'data-bytes', String(expected.peak.totalBytes));

  // "paste or drop a config.json" opens the import box with the focus in it.
  await page.click('#open-import');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'config-text');
  await finish();
});

test('precision options name the framework flag; what you will do is built from the core', async () => {
  const { page, finish } = await openPage({ viewport: LAPTOP });
  const labels = await page.$$eval('#precision option', (options) => Object.fromEntries(options.map((o) => [o.value, o.textContent])));
  assert.match(labels.ampBf16, /Trainer bf16=True/);
  assert.match(labels.ampFp16, /Trainer fp16=True/);
  assert.match(labels.bf16, /torch_dtype=torch\.bfloat16/);
  assert.match(labels.fp32, /Trainer default/);
  const modes = await page.$$eval('#training-mode option', (options) => options.map((o) => o.value));
  assert.equal(modes[0], 'full');
  assert.equal(await page.inputValue('#training-mode'), 'full');
  await finish();
});

test('the model details fold opens for quick mode, a layer list, and an error inside it', async () => {
  const { page, finish } = await openPage({ search: '?parameter-count=7e9' });
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  assert.equal(await page.getAttribute('#model-details', 'open'), '');
  assert.equal(await page.isChecked('input[name=modelKind][value=parameterCount]'), true);
  await finish();
  const second = await openPage();
  await second.page.waitForSelector('#verdict[data-verdict]', WAIT);
  assert.equal(await second.page.getAttribute('#model-details', 'open'), null);
  // An error in a folded field opens the fold and shows it there.
  await second.page.$eval('#arch-numHeads', (el) => { el.value = '7'; el.dispatchEvent(new Event('input', { bubbles: true })); });
  await second.page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.equal(await second.page.getAttribute('#model-details', 'open'), '');
  assert.equal(await second.page.isVisible('#arch-numHeads ~ .field-error'), true);
  await second.finish();
});

// The core's options, as the page reads them (options.trainingModes: the one list of modes).
async function coreOptions() {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const { root } = await import('./harness.js');
  const { pathToFileURL } = await import('node:url');
  const factory = require(process.env.GPUMEM_GLUE ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
  const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
  return (await loadGpumem({ factory })).options();
}

test('what you will do: LoRA and QLoRA set the core\'s fine-tuning fields; the estimate and the link follow', async () => {
  const { page, finish } = await openPage({ viewport: LAPTOP });
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  // The select is the core's list of training modes (and custom), labelled as the core labels them.
  const modes = (await coreOptions()).trainingModes;
  const shown = await page.$$eval('#training-mode option', (options) => options.map((o) => [o.value, o.textContent]));
  assert.deepEqual(shown, [...modes.map((m) => [m.id, m.label]), ['custom', 'Custom fine-tuning (see the fine-tuning fold)']]);
  const section = (id) => modes.find((m) => m.id === id).finetuneByFamily.llama;
  const seq = Number(await page.inputValue('#sequenceLength'));
  const base = { model: { preset: 'llama-3.2-1b' }, training: { precision: 'ampBf16', attention: 'sdpa', sequenceLength: seq }, gpu: { id: 'nvidia-rtx-4090' } };

  await page.selectOption('#training-mode', 'lora');
  const lora = await coreEstimate({ ...base, finetune: section('lora') });
  assert.deepEqual(section('lora').targetModules, ['q_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'qkv_proj', 'gate_up_proj']);
  assert.equal(await page.inputValue('#finetune-loraAlpha'), '16');
  await waitForAttr(page, '#peak-total', 'data-bytes', String(lora.peak.totalBytes));
  assert.equal(await page.isChecked('#finetune-lora'), true);
  assert.equal(await page.isVisible('#finetune-r'), true, 'the rank shows with LoRA');

  await page.selectOption('#training-mode', 'qlora');
  const qlora = await coreEstimate({ ...base, finetune: section('qlora') });
  await waitForAttr(page, '#peak-total', 'data-bytes', String(qlora.peak.totalBytes));
  assert.equal(await page.inputValue('#finetune-quantization'), 'nf4');
  assert.ok(qlora.peak.totalBytes < lora.peak.totalBytes, 'QLoRA holds less than LoRA');

  // Editing a field by hand makes it custom; the link keeps the section.
  await page.fill('#finetune-r', '16');
  await page.waitForFunction(() => document.querySelector('#training-mode').value === 'custom', null, WAIT);
  await page.waitForFunction(() => !document.querySelector('#results').hasAttribute('aria-busy'), null, WAIT);
  const url = page.url();
  const setup = JSON.parse(Buffer.from(new URLSearchParams(new URL(url).hash.slice(1)).get('s'), 'base64url').toString());
  assert.equal(setup.finetune.r, 16);
  assert.equal(setup.finetune.quantization, 'nf4');
  const peak = await page.getAttribute('#peak-total', 'data-bytes');
  await finish();
  const again = await openPage({ url, viewport: LAPTOP });
  await waitForAttr(again.page, '#peak-total', 'data-bytes', peak);
  assert.equal(await again.page.inputValue('#training-mode'), 'custom');
  assert.equal(await again.page.inputValue('#finetune-r'), '16');
  await again.finish();
});
