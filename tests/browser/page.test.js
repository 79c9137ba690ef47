// Browser tests of the single-file page (dist/gpumem.html) in headless Chromium.
//
// Run after assembling: node scripts/assemble-web.mjs && node --test tests/browser/
// Environment: CHROMIUM (browser binary, default /usr/bin/chromium), GPUMEM_PAGE (page to open,
// default dist/gpumem.html), GPUMEM_CLI (native CLI for the cross-check, default
// build/native/cli/gpumem).
//
// The page is opened from file:// because that is how the single file is meant to be used, and
// every request it makes is recorded: anything other than file:, data: or blob: fails the test.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { tmpdir } from 'node:os';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';
import { gpt2SafetensorsHeader, safetensorsFileStart, llamaIndex } from '../js/fixtures.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const pagePath = resolve(process.env.GPUMEM_PAGE ?? join(root, 'dist/gpumem.html'));
const pageUrl = pathToFileURL(pagePath).href;
const cliPath = resolve(process.env.GPUMEM_CLI ?? join(root, 'build/native/cli/gpumem'));
const screenshotDir = join(root, 'build/screenshots');
const workDir = mkdtempSync(join(tmpdir(), 'gpumem-browser-'));

const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage',
];
const ALLOWED_SCHEMES = new Set(['file:', 'data:', 'blob:']);
const WAIT = { timeout: 10000 };

let browser;

before(async () => {
  assert.ok(existsSync(pagePath), `${pagePath} is missing: run node scripts/assemble-web.mjs first`);
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS });
  mkdirSync(screenshotDir, { recursive: true });
});

after(async () => {
  await browser?.close();
});

// Opens the page in a fresh context and records what a test must check at its end: requests
// (network isolation), console errors and uncaught exceptions.
// The page opens a first visit on a preset (web/first-screen.js); these tests start from the
// core's DefaultSetup (quick mode, 1.5e9 parameters), given in the link as a person's link would.
const coreApi = await (async () => {
  const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
  const factory = createRequire(import.meta.url)(join(root, 'build/wasm/wasm/gpumem_core.cjs'));
  return loadGpumem({ factory });
})();
const coreDefaults = coreApi.defaultSetup();
const coreOptions = coreApi.options();
const defaultsUrl = `${pageUrl}#s=${Buffer.from(JSON.stringify(coreDefaults)).toString('base64url')}`;

async function openPage({ url = defaultsUrl, viewport = { width: 1280, height: 900 }, colorScheme = 'light' } = {}) {
  const context = await browser.newContext({ viewport, colorScheme, acceptDownloads: true });
  const page = await context.newPage();
  const record = { requests: [], consoleErrors: [], pageErrors: [] };
  page.on('request', (request) => record.requests.push(request.url()));
  page.on('console', (message) => { if (message.type() === 'error') record.consoleErrors.push(message.text()); });
  page.on('pageerror', (error) => record.pageErrors.push(error.message));
  await page.goto(url);
  await page.waitForSelector('body[data-ready=true]', WAIT);
  const finish = async () => {
    const outside = record.requests.filter((u) => !ALLOWED_SCHEMES.has(new URL(u).protocol));
    assert.deepEqual(outside, [], 'the page must not make network requests');
    assert.deepEqual(record.pageErrors, [], 'uncaught exceptions');
    assert.deepEqual(record.consoleErrors, [], 'console errors');
    await context.close();
  };
  return { page, context, record, finish };
}

// Waits until an element's attribute has a value (the page re-estimates after a short delay).
async function waitForAttr(page, selector, name, value) {
  await page.waitForFunction(([s, n, v]) => document.querySelector(s)?.getAttribute(n) === v, [selector, name, value], WAIT);
}

async function selectExample(page, pattern) {
  const value = await page.$$eval('#example option', (options, source) => {
    const re = new RegExp(source, 'i');
    return options.find((o) => o.value && re.test(o.textContent))?.value;
  }, pattern.source);
  assert.ok(value, `an example matching ${pattern} is offered`);
  await page.selectOption('#example', value);
}

// The setup in the page's URL (#s=<base64url JSON>).
// The setup a link holds, as the form wrote it: links hold only what differs from the core's
// DefaultSetup, a preset by its id and a listed GPU by its id (web/link.js shortSetup), so the
// defaults, the preset's architecture and the GPU's size are put back here.
function setupFromUrl(url) {
  const value = new URLSearchParams(new URL(url).hash.slice(1)).get('s');
  assert.ok(value, `the URL carries the setup: ${url}`);
  const short = JSON.parse(Buffer.from(value, 'base64url').toString('utf8'));
  const merge = (base, over) => {
    if (typeof over !== 'object' || over === null || Array.isArray(over)) return over === undefined ? base : over;
    const out = { ...base };
    for (const [k, v] of Object.entries(over)) out[k] = typeof base?.[k] === 'object' && !Array.isArray(base?.[k]) && base?.[k] !== null ? merge(base[k], v) : v;
    return out;
  };
  const full = merge(coreDefaults, short);
  const model = full.model;
  const preset = coreOptions.presets.find((p) => p.id === short.model?.preset);
  if (preset) full.model = { kind: 'transformer', preset: preset.id, architecture: preset.architecture };
  else if (model.kind === 'parameterCount') full.model = { kind: model.kind, parameterCount: model.parameterCount, largestMatrices: model.largestMatrices };
  else if (model.kind === 'layers') full.model = { kind: model.kind, layers: model.layers, loss: model.loss };
  else full.model = { kind: model.kind, architecture: short.model.architecture };
  const gpu = coreOptions.gpus.find((g) => g.id === short.gpu?.id);
  full.gpu = gpu ? { id: gpu.id, memoryGiB: short.gpu.memoryGiB ?? gpu.memoryGiB } : { memoryGiB: full.gpu.memoryGiB };
  return full;
}

// The hash is written after the debounced update (#results is aria-busy until it runs; the
// pause grows for slow estimates); wait until it describes the current form.
async function settled(page) {
  await page.waitForFunction(() => {
    const results = document.querySelector('#results');
    return results.dataset.state !== 'empty' && results.getAttribute('aria-busy') !== 'true';
  }, null, WAIT);
  await page.waitForTimeout(200);
}

// Every value a person can set, for comparing the form before and after a reload.
async function formValues(page) {
  return page.evaluate(() => {
    const out = {};
    for (const el of document.querySelectorAll('#controls input, #controls select')) {
      if (!el.id || el.id === 'example' || el.id === 'add-layer-type' || el.type === 'file') continue;
      out[el.id] = el.type === 'checkbox' || el.type === 'radio' ? el.checked : el.value;
    }
    return out;
  });
}

function pageHasNoNaN(page) {
  return page.evaluate(() => {
    const values = [...document.querySelectorAll('input, select')].map((e) => e.value).join(' ');
    const attrs = [...document.querySelectorAll('[data-bytes], [data-count]')].map((e) => e.dataset.bytes ?? e.dataset.count).join(' ');
    return !/NaN|undefined|Infinity/.test(`${document.body.innerText} ${values} ${attrs}`);
  });
}

test('page loads with no network, enables its inputs once the core is ready, logs no errors', async () => {
  const html = readFileSync(pagePath, 'utf8');
  assert.match(html, /<fieldset id="controls" disabled>/, 'controls start disabled until the core loads');
  assert.match(html, /http-equiv="Content-Security-Policy" content="default-src 'none';/);
  assert.doesNotMatch(html, /<script[^>]+src=/, 'everything is inlined');

  const { page, finish } = await openPage();
  assert.equal(await page.$eval('#controls', (f) => f.disabled), false);
  for (const id of ['#batchSize', '#sequenceLength', '#precision', '#optimizer', '#optimizerImplementation', '#memoryGiB', '#example', '#export']) {
    assert.equal(await page.isEnabled(id), true, `${id} is enabled`);
  }
  // Dropdowns are filled from the core's options.
  assert.ok((await page.$$('#precision option')).length >= 2);
  assert.ok((await page.$$('#optimizer option')).length >= 2);
  assert.ok((await page.$$('#example option')).length >= 2);
  // Every form control has a label.
  const unlabeled = await page.evaluate(() => [...document.querySelectorAll('input, select')]
    .filter((el) => !el.labels?.length && !el.getAttribute('aria-label')).map((el) => el.id || el.outerHTML));
  assert.deepEqual(unlabeled, []);
  // A result is shown for the defaults.
  await page.waitForFunction(() => Number(document.querySelector('#peak-total').dataset.bytes) > 0, null, WAIT);
  assert.equal(await pageHasNoNaN(page), true);
  await page.screenshot({ path: join(screenshotDir, 'page-light.png'), fullPage: true });
  await finish();
});

test('quick mode: 1.5e9 parameters, fp16 mixed, Adam → model states of 24,000,000,000 bytes', async () => {
  const { page, finish } = await openPage();
  await page.check('input[name=modelKind][value=parameterCount]');
  await page.selectOption('#precision', 'fp32');
  await page.fill('#parameterCount', '1e9');
  await waitForAttr(page, '#states-total', 'data-bytes', '16000000000');
  await page.fill('#parameterCount', '1.5e9');
  await page.selectOption('#precision', 'fp16Mixed');
  await page.selectOption('#optimizer', 'adam');
  await waitForAttr(page, '#states-total', 'data-bytes', '24000000000');
  assert.match(await page.textContent('#states-table'), /24,000,000,000 B/);
  assert.match(await page.textContent('#param-count'), /1,500,000,000/);
  // Formulas come from the core and are shown beside the bytes.
  assert.match(await page.textContent('#states-table'), /1,500,000,000 parameters × 2 B/);
  // Quick mode's activations are labelled as a heuristic.
  assert.equal(await page.isVisible('#heuristic-note'), true);
  assert.match(await page.textContent('#heuristic-note'), /heuristic/i);
  await finish();
});

test('MLP example: 369,405,824 parameters and 5,910,493,184 bytes of fp32 Adam model states', async () => {
  const { page, finish } = await openPage();
  await selectExample(page, /MLP/);
  await waitForAttr(page, '#param-count', 'data-count', '369405824');
  await waitForAttr(page, '#states-total', 'data-bytes', '5910493184');
  assert.match(await page.textContent('#param-count'), /369,405,824/);
  assert.match(await page.textContent('#states-table'), /5,910,493,184 B/);
  assert.equal(await page.inputValue('#precision'), 'fp32');
  assert.equal(await page.inputValue('#optimizer'), 'adam');
  assert.equal(await page.isVisible('#layers-panel'), true);
  assert.ok((await page.$$('#layer-list > li')).length >= 3, 'the layer editor shows the example layers');
  assert.equal(await page.isVisible('#heuristic-note'), false, 'a layer list is counted exactly');
  // Which category is live in which phase: Adam's states appear in step 1's optimizer step, so
  // they are absent at init and held through step 2's forward; gradients exist only from
  // backward to zero_grad.
  const matrixBytes = (category, phase) =>
    page.$eval(`#phase-matrix tr[data-category="${category}"] td[data-phase="${phase}"]`, (td) => td.dataset.bytes);
  assert.equal(await matrixBytes('optimizerStates', 'init'), '0');
  assert.equal(await matrixBytes('optimizerStates', 'forward'), '2955246592');
  assert.equal(await matrixBytes('gradients', 'forward'), '0');
  assert.equal(await matrixBytes('gradients', 'backward'), '1477623296');
  assert.equal(await matrixBytes('parameters', 'init'), '1477623296');
  await finish();
});

test('the peak shown equals the native CLI\'s estimate.peak.totalBytes for the same setup', async (t) => {
  if (!existsSync(cliPath)) {
    t.skip(`native CLI not found at ${cliPath}: build it (cmake --build build/native --target gpumem) or set GPUMEM_CLI`);
    return;
  }
  const { page, finish } = await openPage();
  const cases = [
    ['defaults', async () => {}],
    ['MLP example', async () => selectExample(page, /MLP/)],
    ['edited quick mode', async () => {
      await page.check('input[name=modelKind][value=parameterCount]');
      await page.fill('#parameterCount', '7e9');
      await page.fill('#batchSize', '4');
      await page.selectOption('#optimizer', 'adafactor');
      await page.selectOption('#optimizerImplementation', 'perParameter');
    }],
    ['GPT-2 preset, every block checkpointed, autocast bf16', async () => {
      await page.check('input[name=modelKind][value=transformer]');
      await page.selectOption('#preset', 'gpt2');
      await page.fill('#batchSize', '2');
      await page.selectOption('#optimizer', 'adamw');
      await page.selectOption('#optimizerImplementation', 'forEach');
      await page.selectOption('#precision', 'ampBf16');
      await page.selectOption('#checkpointing', 'everyBlock');
    }],
  ];
  for (const [name, act] of cases) {
    await act();
    await settled(page);
    const setup = setupFromUrl(page.url());
    const file = join(workDir, `setup-${name.replace(/\W+/g, '-')}.json`);
    writeFileSync(file, JSON.stringify(setup));
    const cli = JSON.parse(execFileSync(cliPath, ['--json', file], { encoding: 'utf8' }));
    assert.equal(cli.ok, true, `${name}: the CLI estimates the page's setup`);
    const shown = await page.$eval('#peak-total', (el) => el.dataset.bytes);
    assert.equal(Number(shown), cli.estimate.peak.totalBytes, `${name}: peak total`);
    const rows = await page.$$eval('#peak-table tbody tr', (trs) => trs.map((tr) => [tr.dataset.category, Number(tr.querySelector('[data-bytes]').dataset.bytes)]));
    assert.deepEqual(rows, cli.estimate.peak.byCategory.map((r) => [r.category, r.bytes]), `${name}: breakdown at the peak`);
    const states = await page.$eval('#states-total', (el) => Number(el.dataset.bytes));
    assert.equal(states, cli.estimate.modelStates.totalBytes, `${name}: model states`);
  }
  await finish();
});

test('bad input shows an error naming the field, keeps the last result greyed out, never shows NaN', async () => {
  const { page, finish } = await openPage();
  await page.waitForFunction(() => document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  const lastPeak = await page.textContent('#peak-total');

  await page.fill('#batchSize', '-1');
  await page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.match(await page.textContent('#errors'), /Batch size/);
  assert.doesNotMatch(await page.textContent('#errors'), /training\.batchSize/, 'errors name the label, not the JSON path');
  assert.equal(await page.getAttribute('#batchSize', 'aria-invalid'), 'true');
  assert.match(await page.textContent('#batchSize ~ .field-error'), /at least 1/);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'stale');
  assert.equal(await page.isVisible('#stale-note'), true);
  assert.equal(await page.textContent('#peak-total'), lastPeak, 'the last good result stays');
  assert.equal(await pageHasNoNaN(page), true);

  await page.fill('#batchSize', 'abc');
  await page.waitForFunction(() => /string|number/i.test(document.querySelector('#errors').textContent), null, WAIT);
  assert.match(await page.textContent('#errors'), /Batch size.*“abc” is not a number: type digits/);
  await page.fill('#batchSize', '');
  await page.waitForFunction(() => /is empty: type a number/.test(document.querySelector('#errors').textContent), null, WAIT);
  assert.equal(await pageHasNoNaN(page), true);

  await page.fill('#batchSize', '1');
  await page.waitForSelector('#errors[hidden]', { ...WAIT, state: 'attached' });
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'ok');
  assert.equal(await page.getAttribute('#batchSize', 'aria-invalid'), null);

  // A layer whose input width does not match the layer before it.
  await selectExample(page, /MLP/);
  await page.waitForSelector('#layer-2-inFeatures', WAIT);
  await page.fill('#layer-2-inFeatures', '1000');
  await page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.match(await page.textContent('#errors'), /In features/);
  assert.equal(await page.getAttribute('#layer-2-inFeatures', 'aria-invalid'), 'true');
  assert.equal(await pageHasNoNaN(page), true);
  await page.screenshot({ path: join(screenshotDir, 'page-error.png'), fullPage: false });
  await finish();
});

test('the verdict flips to "does not fit" when the GPU memory is set below the peak', async () => {
  const { page, finish } = await openPage();
  await page.fill('#memoryGiB', '80');
  await waitForAttr(page, '#verdict', 'data-fits', 'true');
  const peak = Number(await page.$eval('#peak-total', (el) => el.dataset.bytes));
  const below = Math.floor(peak / 2 ** 30) - 1;
  assert.ok(below > 0, 'the default peak is above 1 GiB');

  await page.fill('#memoryGiB', String(below));
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  assert.match(await page.textContent('#verdict'), /does not fit/i);
  assert.match(await page.textContent('#verdict'), /short/i);
  // Headroom is the device figure's: capacity − (allocator reserved + CUDA context).
  const device = Number(await page.$eval('#verdict', (el) => el.dataset.deviceBytes));
  assert.ok(device > peak, 'the device figure is above the allocated peak');
  assert.equal(Number(await page.$eval('#verdict', (el) => el.dataset.headroomBytes)), below * 2 ** 30 - device);
  assert.match(await page.textContent('#verdict-why'), /found no free block/);
  assert.match(await page.textContent('#device-table'), /CUDA context/);

  await page.fill('#memoryGiB', String(Math.ceil(device / 2 ** 30) + 1));
  await waitForAttr(page, '#verdict', 'data-fits', 'true');
  assert.match(await page.textContent('#verdict'), /fits/i);
  assert.match(await page.textContent('#verdict'), /headroom/i);
  await finish();
});

test('the URL carries the setup: reloading it reproduces every value', async () => {
  const { page, finish } = await openPage();
  await page.check('input[name=modelKind][value=parameterCount]');
  await page.fill('#parameterCount', '6700000000');
  await page.fill('#largestMatrices', '4096×32000, 11008×4096');
  await page.fill('#batchSize', '8');
  await page.fill('#sequenceLength', '2048');
  await page.selectOption('#precision', 'bf16Mixed');
  await page.selectOption('#optimizer', 'adamw');
  await page.selectOption('#optimizerImplementation', 'fused');
  await page.setChecked('#zeroGradSetToNone', false);
  await page.fill('#memoryGiB', '40');
  await settled(page);
  const before = await formValues(page);
  const peakBefore = await page.$eval('#peak-total', (el) => el.dataset.bytes);
  const url = page.url();
  const setup = setupFromUrl(url);
  assert.equal(setup.training.batchSize, 8);
  assert.deepEqual(setup.model.largestMatrices, [{ rows: 4096, cols: 32000 }, { rows: 11008, cols: 4096 }]);

  await page.reload();
  await page.waitForSelector('body[data-ready=true]', WAIT);
  await settled(page);
  assert.deepEqual(await formValues(page), before, 'reload');
  assert.equal(await page.$eval('#peak-total', (el) => el.dataset.bytes), peakBefore);
  await finish();

  // The same link in a new tab, and a layer-list setup edited by hand.
  const second = await openPage({ url });
  assert.deepEqual(await formValues(second.page), before, 'new tab');
  await selectExample(second.page, /MLP/);
  await second.page.selectOption('#add-layer-type', 'dropout');
  await second.page.click('#add-layer');
  await second.page.fill('#layer-5-p', '0.25');
  await second.page.click('#layer-list li:nth-child(2) button[data-action=remove]');
  await second.page.selectOption('#layer-2-type', 'tanh');
  await settled(second.page);
  const layersBefore = await formValues(second.page);
  const layerSetup = setupFromUrl(second.page.url());
  assert.equal(layerSetup.model.kind, 'layers');
  assert.deepEqual(layerSetup.model.layers.map((l) => l.type), ['linear', 'linear', 'tanh', 'linear', 'dropout']);
  assert.deepEqual(layerSetup.model.layers.at(-1), { type: 'dropout', p: 0.25 });
  assert.equal(await second.page.$eval('#results', (el) => el.dataset.state), 'ok');
  await second.page.reload();
  await second.page.waitForSelector('body[data-ready=true]', WAIT);
  await settled(second.page);
  assert.deepEqual(await formValues(second.page), layersBefore, 'layer list after reload');
  await second.finish();
});

test('export writes the schema JSON and import reads it back', async () => {
  const { page, finish } = await openPage();
  await selectExample(page, /MLP/);
  await page.fill('#batchSize', '16');
  await settled(page);
  const values = await formValues(page);
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export')]);
  assert.equal(download.suggestedFilename(), 'gpumem-setup.json');
  const file = join(workDir, 'exported.json');
  await download.saveAs(file);
  const exported = JSON.parse(readFileSync(file, 'utf8'));
  assert.deepEqual(exported, setupFromUrl(page.url()), 'export and URL hold the same setup');
  assert.equal(exported.schemaVersion, 1);
  assert.equal(exported.training.batchSize, 16);

  await page.click('#reset');
  await page.waitForFunction(() => document.querySelector('#batchSize').value !== '16', null, WAIT);
  await page.setInputFiles('#import-file', file);
  await page.waitForFunction(() => document.querySelector('#batchSize').value === '16', null, WAIT);
  await settled(page);
  assert.deepEqual(await formValues(page), values);

  // A file that is not a setup is refused with a message, leaving the form alone.
  const bad = join(workDir, 'bad.json');
  writeFileSync(bad, '{"training": ');
  await page.setInputFiles('#import-file', bad);
  await page.waitForFunction(() => /not JSON/.test(document.querySelector('#io-status').textContent), null, WAIT);
  assert.deepEqual(await formValues(page), values);
  await finish();
});

test('phone width and dark scheme render the results without overflow', async () => {
  const phone = await openPage({ viewport: { width: 390, height: 844 } });
  await phone.page.waitForFunction(() => document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  const overflow = await phone.page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal scrolling at 390 px (overflow ${overflow} px)`);
  assert.ok(await phone.page.$('#timeline-chart svg'), 'timeline chart drawn');
  assert.ok(await phone.page.$('#capacity-bar svg'), 'capacity bar drawn');
  await phone.page.screenshot({ path: join(screenshotDir, 'page-phone-390.png'), fullPage: true });
  await phone.finish();

  const dark = await openPage({ colorScheme: 'dark' });
  await dark.page.waitForFunction(() => document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  const background = await dark.page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  assert.notEqual(background, 'rgb(255, 255, 255)', 'dark scheme has a dark background');
  await dark.page.screenshot({ path: join(screenshotDir, 'page-dark.png'), fullPage: true });
  await dark.finish();
});

// ---------- architecture mode ----------

async function choosePreset(page, id) {
  await page.check('input[name=modelKind][value=transformer]');
  await page.selectOption('#preset', id);
}

const peakBytes = (page) => page.$eval('#peak-total', (el) => Number(el.dataset.bytes));

test('architecture mode: presets fill the fields, the count and the published count are shown', async () => {
  const { page, finish } = await openPage();
  assert.equal(await page.isChecked('input[name=modelKind][value=parameterCount]'), true, 'the defaults open in quick mode');
  assert.equal(await page.isVisible('#arch-panel'), false);

  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  assert.match(await page.textContent('#param-count'), /124,439,808/);
  assert.match(await page.textContent('#param-source'), /parameter tensor/);
  assert.match(await page.textContent('#param-published'), /Published: 124,439,808 \(openai-community\/gpt2;.*matches/);
  assert.match(await page.textContent('#preset-hint'), /124,439,808.*openai-community\/gpt2/);
  assert.ok(await peakBytes(page) > 0, 'a peak is shown');
  assert.match(await page.textContent('#peak-total'), /[\d.]+ [KMG]iB/);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'ok');
  assert.equal(await page.isVisible('#heuristic-note'), false, 'an architecture is counted exactly');
  // GPT-2 shows its own fields only.
  assert.equal(await page.inputValue('#arch-family'), 'gpt2');
  assert.equal(await page.inputValue('#arch-hiddenSize'), '768');
  for (const hidden of ['#arch-numKeyValueHeads', '#arch-attentionBias', '#arch-numExperts', '#arch-typeVocabSize', '#arch-encoderHead']) {
    assert.equal(await page.isVisible(hidden), false, `${hidden} is hidden for GPT-2`);
  }
  assert.equal(await page.isVisible('#arch-maxPositionEmbeddings'), true);
  assert.equal(await page.isVisible('#attention'), true, 'transformer training options are shown');
  assert.equal(await page.isVisible('#checkpointInterval'), false, 'k only for every k-th block');

  // A Llama-family preset.
  await page.selectOption('#preset', 'qwen2.5-1.5b');
  await waitForAttr(page, '#param-count', 'data-count', '1543714304');
  assert.match(await page.textContent('#param-count'), /1,543,714,304/);
  assert.match(await page.textContent('#param-published'), /1,543,714,304 \(Qwen\/Qwen2\.5-1\.5B/);
  assert.equal(await page.inputValue('#arch-family'), 'llama');
  assert.equal(await page.inputValue('#arch-numKeyValueHeads'), '2');
  assert.equal(await page.isChecked('#arch-attentionBias'), true);
  assert.equal(await page.isVisible('#arch-numExperts'), true);
  assert.equal(await page.isVisible('#arch-expertsPerToken'), false, 'expert details only with experts');
  assert.equal(await page.isVisible('#arch-maxPositionEmbeddings'), false, 'RoPE has no position table');

  // Editing keeps the values and marks the preset as modified.
  await page.fill('#arch-numLayers', '20');
  await page.waitForFunction(() => document.querySelector('#param-count').dataset.count !== '1543714304', null, WAIT);
  assert.equal(await page.inputValue('#preset'), '');
  assert.match(await page.textContent('#preset-hint'), /modified from Qwen2\.5 1\.5B/i);
  assert.equal(await page.inputValue('#arch-hiddenSize'), '1536');
  assert.equal(await page.isVisible('#param-published'), false, 'no published count for a modified preset');
  await page.fill('#arch-numExperts', '4');
  await page.waitForSelector('#arch-expertsPerToken', { ...WAIT, state: 'visible' });

  // A family switch loads that family's defaults and its own fields.
  await page.selectOption('#arch-family', 'bert');
  await page.waitForFunction(() => document.querySelector('#arch-hiddenSize').value === '768', null, WAIT);
  for (const shown of ['#arch-typeVocabSize', '#arch-encoderHead', '#arch-numLabels']) {
    assert.equal(await page.isVisible(shown), true, `${shown} is shown for BERT`);
  }
  assert.equal(await page.isVisible('#arch-numKeyValueHeads'), false);
  assert.equal(await page.isVisible('#arch-numExperts'), false);
  // BERT-base's position table has 512 rows, fewer than the default 1,024 tokens.
  await page.waitForFunction(() => /Sequence length/.test(document.querySelector('#errors').textContent), null, WAIT);
  await page.fill('#sequenceLength', '512');
  await page.waitForSelector('#errors[hidden]', { ...WAIT, state: 'attached' });
  await settled(page);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'ok');

  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  await settled(page);
  assert.equal(await pageHasNoNaN(page), true);
  await page.screenshot({ path: join(screenshotDir, 'page-architecture.png'), fullPage: true });
  await finish();
});

test('architecture errors name the field and highlight it', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  const lastPeak = await page.textContent('#peak-total');

  await page.fill('#arch-numHeads', '7');
  await page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.match(await page.textContent('#errors'), /Attention heads/);
  assert.match(await page.textContent('#errors'), /divide/);
  assert.equal(await page.getAttribute('#arch-numHeads', 'aria-invalid'), 'true');
  assert.match(await page.textContent('#arch-numHeads ~ .field-error'), /must divide/);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'stale');
  assert.equal(await page.textContent('#peak-total'), lastPeak, 'the last good result stays');
  await page.screenshot({ path: join(screenshotDir, 'page-architecture-error.png'), fullPage: false });

  await page.fill('#arch-numHeads', '12');
  await page.waitForSelector('#errors[hidden]', { ...WAIT, state: 'attached' });
  assert.equal(await page.getAttribute('#arch-numHeads', 'aria-invalid'), null);
  assert.equal(await page.inputValue('#preset'), 'gpt2', 'back to the preset\'s values: the preset is named again');

  // A sequence longer than GPT-2's position table names training.sequenceLength.
  await page.fill('#sequenceLength', '2048');
  await page.waitForFunction(() => /Sequence length/.test(document.querySelector('#errors').textContent), null, WAIT);
  assert.equal(await page.getAttribute('#sequenceLength', 'aria-invalid'), 'true');
  assert.equal(await pageHasNoNaN(page), true);
  await finish();

  // A link with a bad override of a preset shows the preset's other values and the bad field.
  const bad = { model: { preset: 'gpt2', architecture: { numHeads: 7 } }, training: { sequenceLength: 128 } };
  const linked = await openPage({ url: `${pageUrl}#s=${Buffer.from(JSON.stringify(bad)).toString('base64url')}` });
  await linked.page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.equal(await linked.page.isChecked('input[name=modelKind][value=transformer]'), true);
  assert.equal(await linked.page.inputValue('#arch-family'), 'gpt2');
  assert.equal(await linked.page.inputValue('#arch-vocabSize'), '50257');
  assert.equal(await linked.page.inputValue('#arch-numHeads'), '7');
  assert.equal(await linked.page.getAttribute('#arch-numHeads', 'aria-invalid'), 'true');
  assert.match(await linked.page.textContent('#preset-hint'), /modified from GPT-2/i);
  await linked.finish();
});

test('checkpointing every block lowers the peak shown', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  await settled(page);
  const before = await peakBytes(page);
  const beforeText = await page.textContent('#peak-exact');
  assert.equal(Number(beforeText.split(' B')[0].replace(/,/g, '')), before, 'the exact figure shown is the peak');

  await page.selectOption('#checkpointing', 'everyBlock');
  await page.waitForFunction((b) => Number(document.querySelector('#peak-total').dataset.bytes) !== b, before, WAIT);
  const after = await peakBytes(page);
  const afterText = await page.textContent('#peak-exact');
  assert.equal(Number(afterText.split(' B')[0].replace(/,/g, '')), after);
  assert.ok(after < before, `checkpointing lowers the peak (${after} < ${before})`);
  assert.equal(await page.isVisible('#checkpointInterval'), false);

  await page.selectOption('#checkpointing', 'everyKthBlock');
  assert.equal(await page.isVisible('#checkpointInterval'), true);
  await page.fill('#checkpointInterval', '4');
  await settled(page);
  assert.equal(setupFromUrl(page.url()).training.checkpointInterval, 4);
  await finish();
});

test('the timeline chart: phases labelled, blocks ticked, the peak marked, keyboard steps through events', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  await settled(page);
  const chart = '#timeline-chart svg';
  const bandLabels = await page.$$eval(`${chart} .band-label`, (els) => els.map((e) => e.textContent));
  // A band too narrow for its whole name keeps the phase (the step is in its data-step below):
  // since foreach lists are one event per tensor, the optimizer steps take more of the axis.
  for (const phase of ['Forward · step 1', 'Backward · step 1', 'Forward · step 2', 'Backward · step 2']) {
    const named = bandLabels.includes(phase) || bandLabels.includes(phase.split(' · ')[0]);
    assert.ok(named, `"${phase}" is labelled (labels: ${bandLabels.join(', ')})`);
  }
  const bands = await page.$$eval(`${chart} .band`, (els) => els.map((e) => `${e.dataset.phase}:${e.dataset.step}`));
  assert.deepEqual(bands, ['init:0', 'forward:1', 'backward:1', 'optimizerStep:1', 'forward:2', 'backward:2', 'optimizerStep:2']);
  // One path for the running total, not one element per event.
  assert.equal((await page.$$(`${chart} path.line`)).length, 1);
  assert.ok((await page.$$(`${chart} *`)).length < 1500, 'the chart stays small for thousands of events');
  // Blocks 0 … 11 ticked along forward and backward.
  const layerLabels = await page.$$eval(`${chart} .layer-label`, (els) => els.map((e) => e.textContent));
  assert.ok(layerLabels.includes('0') && layerLabels.length >= 8, `block numbers shown: ${layerLabels.join(' ')}`);
  // The peak marker sits at the peak's event and names it.
  const peakEvent = await page.$eval('#peak-where', (el) => /event #(\d+)/.exec(el.textContent)[1]);
  assert.equal(await page.$eval(`${chart} .peak-marker`, (el) => el.dataset.event), peakEvent);
  assert.match(await page.textContent(`${chart} .peak-marker`), /peak [\d.]+ GiB/);

  // Keyboard: focus starts at the peak; → and ← step between phase starts and peaks.
  await page.focus(chart);
  assert.equal(await page.getAttribute(chart, 'aria-valuenow'), peakEvent);
  assert.match(await page.textContent('.chart-readout'), /the peak/);
  await page.keyboard.press('Home');
  assert.equal(await page.getAttribute(chart, 'aria-valuenow'), '0');
  await page.keyboard.press('ArrowRight');
  await page.keyboard.press('ArrowRight');
  const text = await page.getAttribute(chart, 'aria-valuetext');
  assert.match(text, /event #\d+/);
  assert.match(text, /total [\d.]+ [KMG]iB/);
  assert.ok(Number(await page.getAttribute(chart, 'aria-valuenow')) > 0);
  await page.keyboard.press('End');
  assert.match(await page.textContent('.chart-readout'), /last event/);

  // Hover shows an event too.
  const box = await page.$eval(chart, (el) => { const r = el.getBoundingClientRect(); return { x: r.x, y: r.y, w: r.width, h: r.height }; });
  await page.mouse.move(box.x + box.w * 0.35, box.y + box.h / 2);
  assert.match(await page.textContent('.chart-readout'), /event #\d+ · (Forward|Backward)/);

  // The largest allocations are listed as a table.
  assert.ok((await page.$$('#largest-events tbody tr')).length > 0);
  assert.match(await page.textContent('#largest-events'), /Adam|logits|log_softmax/);
  await finish();
});

test('an architecture setup survives the URL: a new page shows the same form and peak', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'qwen2.5-1.5b');
  await waitForAttr(page, '#param-count', 'data-count', '1543714304');
  await page.fill('#arch-numLayers', '6');
  await page.fill('#sequenceLength', '512');
  await page.selectOption('#precision', 'ampBf16');
  await page.selectOption('#attention', 'sdpa');
  await page.selectOption('#checkpointing', 'everyKthBlock');
  await page.fill('#checkpointInterval', '3');
  await settled(page);
  const values = await formValues(page);
  const peak = await peakBytes(page);
  const url = page.url();
  const setup = setupFromUrl(url);
  assert.equal(setup.model.kind, 'transformer');
  assert.equal(setup.model.preset, undefined, 'a modified preset is not named');
  assert.equal(setup.model.architecture.numLayers, 6);
  assert.equal(setup.model.architecture.numKeyValueHeads, 2);
  assert.deepEqual([setup.training.attention, setup.training.checkpointing, setup.training.checkpointInterval], ['sdpa', 'everyKthBlock', 3]);
  await finish();

  const second = await openPage({ url });
  await settled(second.page);
  assert.deepEqual(await formValues(second.page), values, 'same form');
  assert.equal(await peakBytes(second.page), peak, 'same peak');
  assert.match(await second.page.textContent('#preset-hint'), /custom/i);

  // An unmodified preset is named in the link and shown as that preset.
  await second.page.selectOption('#preset', 'gpt2');
  await waitForAttr(second.page, '#param-count', 'data-count', '124439808');
  await second.page.fill('#sequenceLength', '256');
  await settled(second.page);
  const presetUrl = second.page.url();
  assert.equal(setupFromUrl(presetUrl).model.preset, 'gpt2');
  const presetValues = await formValues(second.page);
  const presetPeak = await peakBytes(second.page);
  await second.finish();

  const third = await openPage({ url: presetUrl });
  await settled(third.page);
  assert.deepEqual(await formValues(third.page), presetValues);
  assert.equal(await peakBytes(third.page), presetPeak);
  assert.match(await third.page.textContent('#param-published'), /openai-community\/gpt2/);

  // Export and import carry the architecture as the URL does; a file may name just a preset.
  const [download] = await Promise.all([third.page.waitForEvent('download'), third.page.click('#export')]);
  const file = join(workDir, 'architecture.json');
  await download.saveAs(file);
  assert.deepEqual(JSON.parse(readFileSync(file, 'utf8')), setupFromUrl(presetUrl));
  const presetOnly = join(workDir, 'preset-only.json');
  writeFileSync(presetOnly, JSON.stringify({ model: { preset: 'mistral-7b-v0.1' }, training: { sequenceLength: 1024 } }));
  await third.page.setInputFiles('#import-file', presetOnly);
  await waitForAttr(third.page, '#param-count', 'data-count', '7241732096');
  assert.equal(await third.page.inputValue('#preset'), 'mistral-7b-v0.1');
  assert.equal(await third.page.inputValue('#arch-numKeyValueHeads'), '8');
  await third.page.setInputFiles('#import-file', file);
  await waitForAttr(third.page, '#param-count', 'data-count', '124439808');
  await settled(third.page);
  assert.deepEqual(await formValues(third.page), presetValues);
  await third.finish();
});

test('llama-2-7b at batch 1 × 4096: input to rendered result stays responsive', async (t) => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'llama-2-7b');
  await waitForAttr(page, '#param-count', 'data-count', '6738415616');
  await settled(page);
  await page.fill('#sequenceLength', '4096');
  await page.waitForFunction(() => document.querySelector('#results').dataset.inputToFrameMs !== undefined
    && new URLSearchParams(location.hash.slice(1)).get('s') !== null
    && document.querySelector('#sequenceLength').value === '4096'
    && document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  await settled(page);
  const timing = await page.$eval('#results', (el) => ({ ...el.dataset }));
  assert.equal(setupFromUrl(page.url()).training.sequenceLength, 4096);
  t.diagnostic(`llama-2-7b 1×4096: estimate ${timing.estimateMs} ms, render ${timing.renderMs} ms, input to next frame ${timing.inputToFrameMs} ms (includes the typing pause)`);
  // Loose bounds: a slow machine must not fail this, a regression to seconds must.
  assert.ok(Number(timing.estimateMs) + Number(timing.renderMs) < 2000);
  // A select change (no typing pause) also renders in one go.
  await page.selectOption('#attention', 'sdpa');
  await page.waitForFunction(() => new URLSearchParams(location.hash.slice(1)).get('s') && document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  await settled(page);
  const sdpa = await page.$eval('#results', (el) => ({ ...el.dataset }));
  t.diagnostic(`llama-2-7b 1×4096, attention sdpa: estimate ${sdpa.estimateMs} ms, render ${sdpa.renderMs} ms, input to next frame ${sdpa.inputToFrameMs} ms`);
  await finish();
});

test('autocast weight copies get a ninth colour in light and dark; architecture mode fits a phone', async () => {
  for (const colorScheme of ['light', 'dark']) {
    const { page, finish } = await openPage({ colorScheme });
    await choosePreset(page, 'gpt2');
    // With SGD and a fused step the peak falls in backward, while the bf16 copies are alive.
    await page.selectOption('#precision', 'ampBf16');
    await page.selectOption('#optimizer', 'sgd');
    await page.selectOption('#optimizerImplementation', 'fused');
    await page.fill('#sequenceLength', '128');
    await page.fill('#batchSize', '4');
    await settled(page);
    await page.waitForSelector('#peak-table tr[data-category="weightCopies"]', WAIT);
    const colours = await page.evaluate(() => {
      const probe = (cls) => {
        const el = document.createElement('span');
        el.className = `swatch ${cls}`;
        document.body.append(el);
        const colour = getComputedStyle(el).backgroundColor;
        el.remove();
        return colour;
      };
      return Array.from({ length: 9 }, (_, i) => probe(`cat-${i}`));
    });
    assert.equal(new Set(colours).size, 9, `${colorScheme}: nine distinct category colours (${colours.join(' ')})`);
    const swatch = await page.$eval('#peak-table tr[data-category="weightCopies"] .swatch', (el) => [el.className, getComputedStyle(el).backgroundColor]);
    assert.match(swatch[0], /\bcat-8\b/);
    assert.equal(swatch[1], colours[8]);
    await finish();
  }

  const phone = await openPage({ viewport: { width: 390, height: 844 } });
  await choosePreset(phone.page, 'mixtral-8x7b');
  await waitForAttr(phone.page, '#param-count', 'data-count', '46702792704');
  await phone.page.waitForSelector('#arch-expertsPerToken', { ...WAIT, state: 'visible' });
  await settled(phone.page);
  const overflow = await phone.page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal scrolling at 390 px in architecture mode (overflow ${overflow} px)`);
  assert.ok(await phone.page.$('#timeline-chart svg .peak-marker'));
  await phone.page.screenshot({ path: join(screenshotDir, 'page-phone-architecture.png'), fullPage: true });
  await phone.finish();
});

// ---------- GPU list, units, comparison, explanations, exports, embeds, imports, solvers ----------

// The same core in node, for the figures a test expects (the page must show the core's numbers).
let nodeCore;
async function core() {
  if (!nodeCore) {
    const wasmJs = resolve(process.env.GPUMEM_WASM_JS ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
    const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
    nodeCore = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });
  }
  return nodeCore;
}

// The text of a download, and its file name.
async function download(page, selector) {
  const [file] = await Promise.all([page.waitForEvent('download'), page.click(selector)]);
  const path = join(workDir, file.suggestedFilename());
  await file.saveAs(path);
  return { name: file.suggestedFilename(), path, bytes: readFileSync(path) };
}

const GPU_CHOICE = '#gpu';

test('GPU list: choosing a GPU sets its memory, flips the verdict, and the link keeps its id', async () => {
  const { page, finish } = await openPage();
  const gpus = (await core()).options().gpus;
  const ids = await page.$$eval(`${GPU_CHOICE} option`, (os) => os.map((o) => o.value).filter(Boolean));
  assert.deepEqual(ids, gpus.map((g) => g.id), 'every GPU of options.gpus is offered');
  assert.ok(ids.length >= 15);
  await page.waitForFunction(() => document.querySelector('#results').dataset.state === 'ok', null, WAIT);
  const peak = await peakBytes(page);

  // The default quick setup (33.5 GiB) does not fit a 24 GB card …
  await page.selectOption(GPU_CHOICE, 'nvidia-rtx-4090');
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  // CUDA's total for the card sold as 24 GB: shown as PyTorch writes it, carried exact.
  const rtx4090 = 25393692672 / 2 ** 30;
  assert.equal(await page.inputValue('#memoryGiB'), '23.65');
  const verdict = await page.textContent('#verdict');
  assert.match(verdict, /Does not fit/);
  assert.match(verdict, /short of 23\.65 GiB/);
  assert.match(verdict, /RTX 4090/);
  const device = Number(await page.$eval('#verdict', (el) => el.dataset.deviceBytes));
  assert.ok(device > peak);
  assert.equal(Number(await page.$eval('#verdict', (el) => el.dataset.headroomBytes)), 25393692672 - device, 'short by capacity − device peak');
  await settled(page);
  assert.deepEqual(setupFromUrl(page.url()).gpu, { id: 'nvidia-rtx-4090', memoryGiB: rtx4090 });

  // … and fits an H100, with the headroom shown.
  await page.selectOption(GPU_CHOICE, 'nvidia-h100-sxm');
  await waitForAttr(page, '#verdict', 'data-fits', 'true');
  assert.match(await page.textContent('#verdict'), /headroom of 79\.18 GiB/);  // CUDA's measured total
  assert.match(await page.textContent('#gpu-hint'), /79\.18 GiB, the capacity CUDA reports/);
  assert.match(await page.textContent('#gpu-hint'), /H100 SXM/);
  await settled(page);
  const url = page.url();
  assert.equal(setupFromUrl(url).gpu.id, 'nvidia-h100-sxm');

  // Typing a size makes it a custom GPU.
  await page.fill('#memoryGiB', '40');
  await page.waitForFunction(() => document.querySelector('#gpu').value === '', null, WAIT);
  assert.match(await page.textContent('#gpu-hint'), /the total CUDA reports/, 'a custom size is CUDA\'s total, not the size sold');
  await settled(page);
  assert.deepEqual(setupFromUrl(page.url()).gpu, { memoryGiB: 40 });
  await finish();

  const again = await openPage({ url });
  await settled(again.page);
  assert.equal(await again.page.inputValue(GPU_CHOICE), 'nvidia-h100-sxm', 'the link restores the chosen GPU');
  // The H100 SXM's capacity is CUDA's measured total (85,017,493,504 B): shown to 2 decimals,
  // kept exact in the setup.
  assert.equal(await again.page.inputValue('#memoryGiB'), '79.18');
  assert.equal(setupFromUrl(again.page.url()).gpu.id, 'nvidia-h100-sxm');
  await again.finish();
});

test('units: GiB or GB for every figure, kept in the link; exact bytes stay in the titles', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  await settled(page);
  const peak = await peakBytes(page);
  assert.equal(await page.textContent('#peak-total'), `${(peak / 2 ** 30).toFixed(2)} GiB`);
  assert.match(await page.getAttribute('#peak-total', 'title'), new RegExp(`^${peak.toLocaleString('en-US')} B`));

  await page.check('input[name=units][value=GB]');
  await page.waitForFunction(() => /\bGB$/.test(document.querySelector('#peak-total').textContent), null, WAIT);
  assert.equal(await page.textContent('#peak-total'), `${(peak / 1e9).toFixed(2)} GB`);
  assert.match(await page.getAttribute('#peak-total', 'title'), new RegExp(`^${peak.toLocaleString('en-US')} B · [\\d.]+ GiB`));
  // Everywhere: the verdict, the legend, the tables, the chart axes and labels.
  const texts = await page.evaluate(() => ['#verdict', '#capacity-legend', '#peak-table tbody', '#states-table', '#phase-table', '#capacity-bar svg', '#timeline-chart svg']
    .map((s) => document.querySelector(s).textContent).join(' '));
  assert.doesNotMatch(texts, /[KMGT]iB/, 'no binary unit is left');
  assert.match(texts, /\d GB/);
  assert.equal(await page.getAttribute('#peak-table-total', 'data-bytes'), String(peak), 'exact bytes unchanged');
  await settled(page);
  const url = page.url();
  assert.equal(new URLSearchParams(new URL(url).hash.slice(1)).get('units'), 'GB');
  await finish();

  const again = await openPage({ url });
  await settled(again.page);
  assert.equal(await again.page.isChecked('input[name=units][value=GB]'), true);
  assert.match(await again.page.textContent('#peak-total'), / GB$/);
  await again.page.check('input[name=units][value=GiB]');
  await again.page.waitForFunction(() => / GiB$/.test(document.querySelector('#peak-total').textContent), null, WAIT);
  await settled(again.page);
  assert.equal(new URLSearchParams(new URL(again.page.url()).hash.slice(1)).get('units'), null);
  await again.finish();
});

test('comparison: pin A, change the setup, see both peaks, breakdowns and a two-bar chart; kept in the link; cleared', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await page.fill('#sequenceLength', '512');
  await page.selectOption(GPU_CHOICE, 'nvidia-rtx-4090');
  await settled(page);
  assert.equal(await page.isVisible('#compare'), false);
  const setupA = setupFromUrl(page.url());
  const peakA = await peakBytes(page);
  await page.click('#compare-pin');
  await page.waitForSelector('#compare:not([hidden])', WAIT);

  await page.fill('#batchSize', '32');
  await page.waitForFunction((a) => Number(document.querySelector('#peak-total').dataset.bytes) !== a, peakA, WAIT);
  await settled(page);
  const peakB = await peakBytes(page);
  const side = (row, s) => page.$eval(`#compare-table tr[data-row="${row}"] td[data-side="${s}"]`, (td) => ({ text: td.textContent, bytes: td.dataset.bytes, fits: td.dataset.fits }));
  assert.equal(Number((await side('peak', 'A')).bytes), peakA);
  assert.equal(Number((await side('peak', 'B')).bytes), peakB);
  assert.equal((await side('peak', 'B')).text, `${(peakB / 2 ** 30).toFixed(2)} GiB`);
  assert.equal((await side('fits', 'A')).fits, 'true');
  assert.equal((await side('fits', 'B')).fits, 'false', 'batch 32 does not fit 24 GiB');
  assert.match((await side('fits', 'B')).text, /Does not fit · [\d.]+ GiB short/);
  assert.match((await side('shape', 'A')).text, /^1 × 512/);
  assert.match((await side('shape', 'B')).text, /^32 × 512/);
  assert.equal(await page.$eval('#compare-table tr[data-row="shape"]', (tr) => tr.classList.contains('differs')), true);
  // Model states and the breakdown at the peak are the core's, for both.
  const c = await core();
  const estA = c.estimate(setupA);
  const estB = c.estimate(setupFromUrl(page.url()));
  assert.equal(Number((await side('states', 'A')).bytes), estA.modelStates.totalBytes);
  for (const row of estB.peak.byCategory) assert.equal(Number((await side(`cat-${row.category}`, 'B')).bytes), row.bytes, row.category);
  for (const row of estA.peak.byCategory) assert.equal(Number((await side(`cat-${row.category}`, 'A')).bytes), row.bytes, row.category);
  // Two stacked bars against the capacity.
  assert.deepEqual(await page.$$eval('#compare-chart svg .comparison-bar', (gs) => gs.map((g) => g.dataset.bar)), ['A', 'B']);
  assert.equal((await page.$$('#compare-chart svg .capacity-line')).length, 2);
  assert.match(await page.textContent('#compare-chart svg'), /does not fit/);

  // The link keeps A.
  const url = page.url();
  const compare = new URLSearchParams(new URL(url).hash.slice(1)).get('compare');
  assert.ok(compare, 'the link holds A');
  // A's setup in the link in its short form, read back as the page reads it.
  const compareAsSetup = `${url.split('#')[0]}#s=${compare}`;
  assert.deepEqual(setupFromUrl(compareAsSetup), setupA);
  await finish();

  const again = await openPage({ url });
  await settled(again.page);
  await again.page.waitForSelector('#compare:not([hidden])', WAIT);
  assert.equal(Number(await again.page.$eval('#compare-table tr[data-row="peak"] td[data-side="A"]', (td) => td.dataset.bytes)), peakA);
  assert.equal(Number(await again.page.$eval('#compare-table tr[data-row="peak"] td[data-side="B"]', (td) => td.dataset.bytes)), peakB);
  // "Load A into the editor" swaps: A's setup is edited, the one that was edited is pinned.
  await again.page.click('#compare-swap');
  await again.page.waitForFunction(() => document.querySelector('#batchSize').value === '1', null, WAIT);
  await settled(again.page);
  assert.equal(await peakBytes(again.page), peakA);
  assert.equal(Number(await again.page.$eval('#compare-table tr[data-row="peak"] td[data-side="A"]', (td) => td.dataset.bytes)), peakB);
  await again.page.click('#compare-clear');
  await again.page.waitForSelector('#compare', { ...WAIT, state: 'hidden' });
  await settled(again.page);
  assert.equal(new URLSearchParams(new URL(again.page.url()).hash.slice(1)).get('compare'), null);
  await again.finish();
});

test('explanations: every row expands to its formula with its result; the dominant category is named', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await page.fill('#sequenceLength', '1024');
  await page.fill('#batchSize', '4');
  await settled(page);
  const est = (await core()).estimate(setupFromUrl(page.url()));

  // Peak table: a <details> per row, closed at first; opening it shows formula = bytes.
  const first = est.peak.byCategory[0];
  const row = `#peak-table tr[data-category="${first.category}"]`;
  assert.equal(await page.$eval(`${row} details.explain`, (d) => d.open), false);
  await page.click(`${row} details.explain summary`);
  assert.equal(await page.$eval(`${row} details.explain`, (d) => d.open), true);
  const body = await page.textContent(`${row} .explain-body`);
  assert.ok(body.includes(first.formula), body);
  assert.ok(body.includes(`${first.bytes.toLocaleString('en-US')} B`), body);
  assert.equal(await page.isVisible(`${row} .explain-body`), true);
  // With the keyboard: focus a summary, Enter opens it.
  const statesRow = '#states-table tbody tr:first-child details.explain';
  await page.focus(`${statesRow} summary`);
  await page.keyboard.press('Enter');
  assert.equal(await page.$eval(statesRow, (d) => d.open), true);

  // "Show every formula" opens them all: peak, model states, forward end, phase peaks.
  await page.click('#breakdown button.explain-all');
  assert.equal(await page.$$eval('#results details.explain', (ds) => ds.every((d) => d.open)), true);
  assert.equal(await page.getAttribute('#breakdown button.explain-all', 'aria-pressed'), 'true');
  assert.ok((await page.$$('#phase-table details.explain')).length === est.phasePeaks.length);
  const forwardRows = await page.$$eval('#forward-table tbody tr', (trs) => trs.map((tr) => [tr.dataset.category, Number(tr.querySelector('[data-bytes]').dataset.bytes)]));
  assert.deepEqual(forwardRows, est.forwardEnd.byCategory.map((r) => [r.category, r.bytes]), 'the forward-end table is the core\'s forwardEnd');
  assert.equal(Number(await page.getAttribute('#forward-total', 'data-bytes')), est.forwardEnd.totalBytes);
  const backward = est.phasePeaks.find((p) => p.phase === 'backward');
  const phaseText = await page.textContent('#phase-table tr[data-phase="backward"] .explain-body');
  for (const r of backward.byCategory) assert.ok(phaseText.includes(r.formula), `backward peak lists ${r.category}'s formula`);

  // The dominant category: the core's largest row at the peak, its share and its formula.
  const top = est.peak.byCategory.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  assert.equal(await page.getAttribute('#dominant', 'data-category'), top.category);
  const dominant = await page.textContent('#dominant');
  assert.ok(dominant.includes(top.label), dominant);
  assert.ok(dominant.includes(`${Math.round((top.bytes / est.peak.totalBytes) * 100)} %`), dominant);
  assert.ok(dominant.includes(top.formula), dominant);
  assert.match(dominant, /Why: /);
  await page.screenshot({ path: join(screenshotDir, 'page-explained.png'), fullPage: true });
  await finish();
});

test('exports: the breakdown as CSV with the peak total, the charts as SVG and PNG, all as downloads', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await page.fill('#sequenceLength', '256');
  await settled(page);
  const est = (await core()).estimate(setupFromUrl(page.url()));

  const csv = await download(page, 'button[data-export="csv"]');
  assert.equal(csv.name, 'gpumem-breakdown.csv');
  const lines = csv.bytes.toString('utf8').trimEnd().split('\r\n');
  assert.equal(lines[0], 'section,category,label,bytes,formula');
  assert.ok(lines.some((l) => l.startsWith(`peak,total,Total at the peak,${est.peak.totalBytes},`)), 'the peak total');
  for (const r of est.peak.byCategory) {
    assert.ok(lines.includes(`peak,${r.category},${r.label},${r.bytes},"${r.formula.replace(/"/g, '""')}"`)
      || lines.includes(`peak,${r.category},${r.label},${r.bytes},${r.formula}`), `peak row ${r.category}`);
  }
  assert.ok(lines.some((l) => l.startsWith(`modelStates,total,Model states,${est.modelStates.totalBytes},`)));
  assert.equal(lines.filter((l) => l.startsWith('modelStates,')).length, est.modelStates.rows.length + 1);
  // The device figure's parts, each with the core's bytes.
  for (const [id, bytes] of [['peakReserved', est.device.peakReservedBytes], ['cache', est.device.fragmentationBytes], ['context', est.device.contextBytes], ['total', est.device.peakDeviceBytes]]) {
    assert.ok(lines.some((l) => l.startsWith(`device,${id},`) && l.split(',')[3] === String(bytes)), `device row ${id}`);
  }

  const svg = await download(page, 'button[data-export="bar-svg"]');
  assert.equal(svg.name, 'gpumem-peak.svg');
  const svgText = svg.bytes.toString('utf8');
  assert.match(svgText, /^<\?xml/);
  assert.match(svgText, /<svg[^>]+xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
  assert.match(svgText, /peak [\d.]+ MiB|peak [\d.]+ GiB/);
  assert.match(svgText, /fill:\s*rgb\(/, 'colours are inlined: the file needs no stylesheet');
  assert.doesNotMatch(svgText, /var\(--/);
  const png = await download(page, 'button[data-export="bar-png"]');
  assert.equal(png.name, 'gpumem-peak.png');
  assert.deepEqual([...png.bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG');
  assert.ok(png.bytes.length > 1000);

  const timeline = await download(page, 'button[data-export="timeline-svg"]');
  assert.equal(timeline.name, 'gpumem-timeline.svg');
  assert.match(timeline.bytes.toString('utf8'), /class="|<path/);
  assert.doesNotMatch(timeline.bytes.toString('utf8'), /hit-area|tabindex/, 'no interactive parts');
  const timelinePng = await download(page, 'button[data-export="timeline-png"]');
  assert.equal(timelinePng.bytes.subarray(1, 4).toString('latin1'), 'PNG');

  await page.click('#compare-pin');
  await page.fill('#batchSize', '2');
  await settled(page);
  const comparison = await download(page, 'button[data-export="comparison-svg"]');
  assert.equal(comparison.name, 'gpumem-comparison.svg');
  assert.match(comparison.bytes.toString('utf8'), />A<\/text>[\s\S]*>B<\/text>/);
  const comparisonPng = await download(page, 'button[data-export="comparison-png"]');
  assert.equal(comparisonPng.bytes.subarray(1, 4).toString('latin1'), 'PNG');
  await finish();
});

const examplePath = resolve(process.env.GPUMEM_EXAMPLE ?? join(dirname(pagePath), 'example-embed.html'));

test('embed: the example page\'s <gpumem-calculator> elements show the core\'s peak; its ?embed=1 iframe renders', async () => {
  assert.ok(existsSync(examplePath), `${examplePath} is missing: run node scripts/assemble-web.mjs`);
  assert.ok(existsSync(join(dirname(examplePath), 'gpumem-embed.js')));
  const script = readFileSync(join(dirname(examplePath), 'gpumem-embed.js'), 'utf8');
  assert.doesNotMatch(script, /https?:\/\/(?!www\.w3\.org)/, 'the embed script names no server');

  for (const colorScheme of ['light', 'dark']) {
    const context = await browser.newContext({ viewport: { width: 900, height: 900 }, colorScheme });
    const page = await context.newPage();
    const requests = [];
    const errors = [];
    page.on('request', (r) => requests.push(r.url()));
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    await page.goto(pathToFileURL(examplePath).href);
    const c = await core();
    const elements = await page.$$eval('gpumem-calculator', (els) => els.map((el) => ({
      id: el.id, attrs: Object.fromEntries([...el.attributes].map((a) => [a.name, a.value])),
    })));
    assert.ok(elements.length >= 2);
    const { setupFromParams } = await import(pathToFileURL(join(root, 'web/setup-params.js')).href);
    for (const { id, attrs } of elements) {
      // Playwright's CSS selectors pierce the shadow root.
      await page.waitForSelector(`#${id} .peak[data-bytes]`, WAIT);
      const expected = c.estimate(setupFromParams((n) => attrs[n]).setup);
      assert.equal(Number(await page.$eval(`#${id}`, (el) => el.shadowRoot.querySelector('.peak').dataset.bytes)), expected.peak.totalBytes, `${id}: the core's peak`);
      assert.equal(await page.$eval(`#${id}`, (el) => el.estimate.peak.totalBytes), expected.peak.totalBytes, `${id}: the estimate property`);
      const fits = await page.$eval(`#${id}`, (el) => el.shadowRoot.querySelector('.verdict').dataset.fits);
      assert.equal(fits, String(expected.gpu.fits), `${id}: fits`);
      assert.ok(await page.$(`#${id} svg.capacity-bar`), `${id}: the stacked bar`);
      const href = await page.$eval(`#${id}`, (el) => el.shadowRoot.querySelector('a.open').href);
      assert.match(href, /\/gpumem\.html#s=/, `${id}: links to the calculator`);
    }
    const llama = elements.find((e) => e.attrs.preset);
    assert.match(await page.$eval(`#${llama.id}`, (el) => el.shadowRoot.textContent), new RegExp(c.options().presets.find((p) => p.id === llama.attrs.preset).label.replace(/[()]/g, '\\$&')));
    assert.match(await page.$eval('#example-gpt2', (el) => el.shadowRoot.querySelector('.peak').textContent), / GB$/, 'units="GB"');

    await page.screenshot({ path: join(screenshotDir, `embed-example-${colorScheme}.png`), fullPage: true });

    // Changing an attribute re-estimates.
    const before = await page.$eval('#example-gpt2', (el) => el.shadowRoot.querySelector('.peak').dataset.bytes);
    await page.$eval('#example-gpt2', (el) => el.setAttribute('batch-size', '1'));
    await page.waitForFunction((b) => document.querySelector('#example-gpt2').shadowRoot.querySelector('.peak')?.dataset.bytes !== b, before, WAIT);
    // A bad attribute shows the core's error naming the field.
    await page.$eval('#example-gpt2', (el) => el.setAttribute('batch-size', '-3'));
    await page.waitForFunction(() => /training\.batchSize/.test(document.querySelector('#example-gpt2').shadowRoot.textContent), null, WAIT);

    // The iframe: the page in embed mode.
    const frame = page.frames().find((f) => /embed=1/.test(f.url()));
    assert.ok(frame, 'the iframe is loaded');
    await frame.waitForSelector('body[data-ready=true]', WAIT);
    await frame.waitForFunction(() => Number(document.querySelector('#peak-total').dataset.bytes) > 0, null, WAIT);
    assert.equal(await frame.$eval('body', (b) => b.classList.contains('embed')), true);
    assert.equal(await frame.isVisible('#setup-form'), false);
    if (colorScheme === 'dark') {
      const bg = await page.$eval('#example-llama', (el) => getComputedStyle(el.shadowRoot.querySelector('.card')).backgroundColor);
      assert.notEqual(bg, 'rgb(255, 255, 255)', 'the element follows the dark scheme');
    }
    // A full-page screenshot leaves the file:// iframe (another process) blank; the frame's own box shows it.
    await page.locator('#example-iframe').screenshot({ path: join(screenshotDir, `embed-iframe-${colorScheme}.png`) });
    const outside = requests.filter((u) => !ALLOWED_SCHEMES.has(new URL(u).protocol));
    assert.deepEqual(outside, [], 'no network requests');
    assert.deepEqual(errors, []);
    await context.close();
  }
});

test('embed: a <gpumem-calculator> holding a long layer list links to the calculator compressed (z=), and the link reproduces its peak', async () => {
  const context = await browser.newContext({ viewport: { width: 900, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(pathToFileURL(examplePath).href);
  // 300 linear layers: 20,533 characters as #s=, past the page's 2,000 (247 as #z=).
  const layers = Array.from({ length: 300 }, (_, i) => ({ type: 'linear', inFeatures: 64, outFeatures: 64 }));
  const setup = { model: { kind: 'layers', loss: 'mse', layers }, training: { batchSize: 4, sequenceLength: 1 } };
  await page.evaluate((text) => {
    const el = document.createElement('gpumem-calculator');
    el.id = 'long-list';
    el.setAttribute('setup', text);
    document.body.append(el);
  }, JSON.stringify(setup));
  await page.waitForSelector('#long-list .peak[data-bytes]', WAIT);
  const peak = await page.$eval('#long-list', (el) => el.shadowRoot.querySelector('.peak').dataset.bytes);
  assert.equal(Number(peak), (await core()).estimate(setup).peak.totalBytes, 'the element shows the core\'s peak');
  await page.waitForFunction(() => /#z=/.test(document.querySelector('#long-list').shadowRoot.querySelector('a.open').href), null, WAIT);
  const href = await page.$eval('#long-list', (el) => el.shadowRoot.querySelector('a.open').href);
  assert.match(href, /\/gpumem\.html#z=[A-Za-z0-9_-]+$/);
  assert.ok(new URL(href).hash.length < 1000, `the link's hash is ${new URL(href).hash.length} characters`);
  assert.deepEqual(errors, []);
  await context.close();

  const opened = await openPage({ url: href });
  await waitForAttr(opened.page, '#peak-total', 'data-bytes', peak);
  assert.equal(await opened.page.isHidden('#link-banner'), true, 'the calculator reads the link whole');
  assert.equal(JSON.parse(await opened.page.inputValue('#layer-json')).length, 300);
  await opened.finish();
});

test('?embed=1: the compact page from link parameters, with the core\'s peak and a link to the full calculator', async () => {
  const params = 'embed=1&preset=gpt2&batch-size=4&sequence-length=512&gpu=nvidia-rtx-4090&units=GB';
  const { page, finish } = await openPage({ url: `${pageUrl}?${params}`, viewport: { width: 480, height: 700 } });
  await settled(page);
  const expected = (await core()).estimate({ model: { preset: 'gpt2' }, training: { batchSize: 4, sequenceLength: 512 }, gpu: { id: 'nvidia-rtx-4090' } });
  assert.equal(await peakBytes(page), expected.peak.totalBytes);
  assert.match(await page.textContent('#peak-total'), / GB$/);
  for (const hidden of ['#setup-form', '#timeline-chart', '#peak-table', '#compare-pin', '#solve']) {
    assert.equal(await page.isVisible(hidden), false, `${hidden} is not part of the embed`);
  }
  assert.equal(await page.isVisible('#capacity-bar svg'), true);
  assert.match(await page.textContent('#verdict'), /RTX 4090/);
  assert.match(await page.textContent('#embed-setup'), /GPT-2 \(124M\).*4 × 512/);
  const href = await page.getAttribute('#open-calculator', 'href');
  assert.doesNotMatch(href, /embed=1/);
  assert.match(href, /#v=[^&]+&s=/);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal scrolling (${overflow})`);
  await page.screenshot({ path: join(screenshotDir, 'page-embed.png'), fullPage: true });

  // The full calculator from that link shows the same setup and peak.
  await page.goto(href);
  await page.waitForSelector('body[data-ready=true]', WAIT);
  await settled(page);
  assert.equal(await page.$eval('body', (b) => b.classList.contains('embed')), false);
  assert.equal(await peakBytes(page), expected.peak.totalBytes);
  assert.equal(await page.inputValue('#preset'), 'gpt2');
  assert.equal(await page.inputValue('#gpu'), 'nvidia-rtx-4090');
  await finish();

  // A parameter the core refuses is shown in the embed, naming the field.
  const bad = await openPage({ url: `${pageUrl}?embed=1&preset=gpt2&gpu=no-such-gpu` });
  await bad.page.waitForSelector('#embed-error:not([hidden])', WAIT);
  assert.match(await bad.page.textContent('#embed-error'), /GPU: Unknown GPU "no-such-gpu"/);
  await bad.finish();
});

const LLAMA_CONFIG = join(root, 'tests/data/configs/llama-2-7b.json');

test('import: a pasted Llama config.json fills the architecture (editable); a dropped safetensors header gives the exact count', async () => {
  const { page, finish } = await openPage();
  assert.equal(await page.isVisible('#import-model'), true);
  await page.click('#import-model summary');
  await page.fill('#config-text', readFileSync(LLAMA_CONFIG, 'utf8'));
  await page.click('#import-config');
  await waitForAttr(page, '#param-count', 'data-count', '6738415616');
  assert.match(await page.textContent('#param-count'), /6,738,415,616/);
  assert.equal(await page.isChecked('input[name=modelKind][value=transformer]'), true);
  assert.equal(await page.getAttribute('#import-result', 'data-model-type'), 'llama');
  const ignored = (await core()).importConfig(readFileSync(LLAMA_CONFIG, 'utf8')).ignoredFields.length;
  assert.equal(await page.getAttribute('#import-result', 'data-ignored'), String(ignored));
  assert.match(await page.textContent('#import-result'), new RegExp(`model_type “llama”, ${ignored} fields ignored`));
  assert.equal(await page.inputValue('#arch-hiddenSize'), '4096');
  assert.equal(await page.inputValue('#preset'), 'llama-2-7b', 'the imported architecture is recognised as the preset');
  // The fields stay editable.
  await page.fill('#arch-numLayers', '16');
  await page.waitForFunction(() => document.querySelector('#param-count').dataset.count !== '6738415616', null, WAIT);
  await settled(page);
  assert.equal(setupFromUrl(page.url()).model.architecture.numLayers, 16);

  // A config missing required fields: the core's message, naming config.<key>.
  await page.fill('#config-text', '{"model_type": "llama", "hidden_size": 4096}');
  await page.click('#import-config');
  await page.waitForFunction(() => /config\.\w+/.test(document.querySelector('#import-result').textContent), null, WAIT);
  assert.equal(await page.getAttribute('#import-result', 'data-state'), 'error');

  // A .safetensors file dropped on the model section, in architecture mode: GPT-2.
  await choosePreset(page, 'gpt2');
  await waitForAttr(page, '#param-count', 'data-count', '124439808');
  await settled(page);
  const { text, parameterCount } = gpt2SafetensorsHeader();
  const file = safetensorsFileStart(text);
  const dataTransfer = await page.evaluateHandle(([b64, name]) => {
    const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([bytes], name, { type: 'application/octet-stream' }));
    return dt;
  }, [file.toString('base64'), 'model.safetensors']);
  await page.dispatchEvent('#model-fieldset', 'dragenter', { dataTransfer });
  assert.equal(await page.$eval('#model-fieldset', (f) => f.classList.contains('dragging')), true, 'the drop target shows itself');
  await page.dispatchEvent('#model-fieldset', 'drop', { dataTransfer });
  await waitForAttr(page, '#safetensors-count', 'data-count', String(parameterCount));
  assert.match(await page.textContent('#safetensors-count'), /124,439,808 \(exact\)/);
  assert.equal(await page.getAttribute('#safetensors-vs-arch', 'data-match'), 'true');
  assert.match(await page.textContent('#safetensors-vs-arch'), /equals the architecture's count \(124,439,808\)/);
  // A different architecture: the counts differ, and the page says by how much.
  await page.fill('#arch-numLayers', '11');
  await page.waitForFunction(() => document.querySelector('#safetensors-vs-arch')?.dataset.match === 'false', null, WAIT);
  assert.match(await page.textContent('#safetensors-vs-arch'), /differs .* by \+7,087,872/);
  // Using its count switches to quick mode with the exact number.
  await page.click('#safetensors-use');
  await waitForAttr(page, '#param-count', 'data-count', String(parameterCount));
  assert.equal(await page.isChecked('input[name=modelKind][value=parameterCount]'), true);

  // The shards of one checkpoint, picked together: their headers are counted together.
  const { header } = gpt2SafetensorsHeader();
  const names = Object.keys(header).filter((k) => k !== '__metadata__');
  const half = Math.floor(names.length / 2);
  const shard = (part) => {
    const h = { __metadata__: { format: 'pt' } };
    let offset = 0;
    for (const name of part) {
      const bytes = header[name].data_offsets[1] - header[name].data_offsets[0];
      h[name] = { ...header[name], data_offsets: [offset, offset + bytes] };
      offset += bytes;
    }
    return safetensorsFileStart(JSON.stringify(h));
  };
  await page.setInputFiles('#model-file', [
    { name: 'model-00001-of-00002.safetensors', mimeType: 'application/octet-stream', buffer: shard(names.slice(0, half)) },
    { name: 'model-00002-of-00002.safetensors', mimeType: 'application/octet-stream', buffer: shard(names.slice(half)) },
  ]);
  await page.waitForFunction(() => /2 shards/.test(document.querySelector('#import-result').textContent), null, WAIT);
  assert.match(await page.textContent('#safetensors-count'), /124,439,808 \(exact\)/);

  // An index through the file button: names and bytes, no count.
  await page.setInputFiles('#model-file', { name: 'model.safetensors.index.json', mimeType: 'application/json', buffer: Buffer.from(JSON.stringify(llamaIndex())) });
  await page.waitForFunction(() => document.querySelector('#import-result').dataset.source === 'index', null, WAIT);
  assert.match(await page.textContent('#safetensors-count'), /not in an index/);
  assert.match(await page.textContent('#import-result'), /Blocks\s*32/);
  // A file that is not a safetensors file.
  await page.setInputFiles('#model-file', { name: 'broken.safetensors', mimeType: 'application/octet-stream', buffer: Buffer.from([255, 255, 255, 255, 0, 0, 0, 0, 1, 2]) });
  await page.waitForFunction(() => document.querySelector('#import-result').dataset.state === 'error', null, WAIT);
  assert.match(await page.textContent('#import-result'), /not a safetensors file/);
  assert.equal(await pageHasNoNaN(page), true);
  await page.screenshot({ path: join(screenshotDir, 'page-import.png'), fullPage: false });
  await finish();
});

test('solve: the largest batch and sequence that fit, and what would make it fit, each applied with one press', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'gpt2');
  await page.fill('#sequenceLength', '512');
  await page.selectOption(GPU_CHOICE, 'nvidia-rtx-4090');
  await settled(page);
  const setup = setupFromUrl(page.url());
  const expected = (await core()).solve(setup);

  const solving = page.waitForFunction(() => document.querySelector('#solve').getAttribute('aria-busy') === 'true'
    || document.querySelector('#solve-run').disabled, null, WAIT);
  await page.click('#solve-run');
  await solving.catch(() => {});  // the busy state may already be over on a fast machine
  await page.waitForSelector('#solve-results:not([hidden])', WAIT);
  assert.equal(await page.isEnabled('#solve-run'), true);
  assert.equal(await page.getAttribute('#solve-batch', 'data-value'), String(expected.maxBatchSize.value));
  assert.match(await page.textContent('#solve-batch'), new RegExp(`${expected.maxBatchSize.value} samples`));
  assert.equal(await page.getAttribute('#solve-seq', 'data-value'), String(expected.maxSequenceLength.value));
  const ids = await page.$$eval('#solve-suggestions li', (lis) => lis.map((li) => li.dataset.id));
  assert.deepEqual(ids, expected.suggestions.map((s) => s.id));

  // Use the largest batch: the form takes it, the peak is the solver's, and it still fits.
  await page.click('#solve-batch button');
  await page.waitForFunction((v) => document.querySelector('#batchSize').value === String(v), expected.maxBatchSize.value, WAIT);
  await settled(page);
  // The solver's peaks are the device figure (what fits is decided on).
  assert.equal(Number(await page.getAttribute('#verdict', 'data-device-bytes')), expected.maxBatchSize.peakBytes);
  assert.equal(await page.getAttribute('#verdict', 'data-fits'), 'true');
  assert.equal(await page.getAttribute('#solve-results', 'data-stale'), 'true', 'the results say they belong to the previous setup');

  // A setup that does not fit: a suggestion that fits makes the verdict flip.
  await page.fill('#batchSize', String(expected.maxBatchSize.value + 8));
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  await settled(page);
  const tooBig = (await core()).solve(setupFromUrl(page.url()));
  await page.click('#solve-run');
  await page.waitForFunction(() => document.querySelector('#solve-results').dataset.stale === 'false', null, WAIT);
  const fitting = tooBig.suggestions.find((s) => s.fits);
  assert.ok(fitting, 'some change fits');
  assert.match(await page.textContent(`#solve-suggestions li[data-id="${fitting.id}"]`), /fits/);
  await page.click(`#solve-suggestions li[data-id="${fitting.id}"] button`);
  await waitForAttr(page, '#verdict', 'data-fits', 'true');
  await settled(page);
  assert.equal(Number(await page.getAttribute('#verdict', 'data-device-bytes')), fitting.peakBytes, 'the device peak the solver promised');
  const applied = setupFromUrl(page.url());
  for (const [k, v] of Object.entries(fitting.change.training ?? {})) assert.equal(applied.training[k], v, `training.${k}`);
  await page.screenshot({ path: join(screenshotDir, 'page-solve.png'), fullPage: false });
  await finish();
});

test('solve: Llama 3.1 405B on one H100 lists unsimulated changes as floors and points at many GPUs', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'llama-3.1-405b');
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  await settled(page);
  const expected = (await core()).solve(setupFromUrl(page.url()));
  const bounded = expected.suggestions.filter((s) => s.peakIsLowerBound);
  assert.ok(bounded.length >= 5, JSON.stringify(expected.suggestions.map((s) => [s.id, s.peakIsLowerBound])));
  assert.ok(expected.estimatesRun <= 3, `estimates run: ${expected.estimatesRun}`);
  await page.click('#solve-run');
  await page.waitForSelector('#solve-results:not([hidden])', WAIT);
  const ids = await page.$$eval('#solve-suggestions li', (lis) => lis.map((li) => li.dataset.id));
  assert.deepEqual(ids, expected.suggestions.map((s) => s.id));
  const text = await page.textContent(`#solve-suggestions li[data-id="${bounded[0].id}"]`);
  assert.match(text, /saves at most .* peak at least .* \(its model states alone\)/);
  const simulated = expected.suggestions.find((s) => !s.peakIsLowerBound);
  if (simulated) assert.doesNotMatch(await page.textContent(`#solve-suggestions li[data-id="${simulated.id}"]`), /at least/);
  assert.equal(await page.isVisible('#solve-many-gpus'), true);
  assert.match(await page.textContent('#solve-many-gpus'), /model states alone .* pass this GPU.*Fewest GPUs of this type/);
  // Floors share their bytes without attacking the same peak: no "save the same" note for them.
  assert.doesNotMatch(await page.textContent('#solve-same-peak'), new RegExp(bounded[0].label.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')));
  assert.equal(await pageHasNoNaN(page), true);
  await finish();
});

test('solve: Mixtral 8x22B at 8k tokens lists QLoRA by its forward-end floor, unsimulated', async () => {
  // The core's ForwardEndFloor: QLoRA's 4-bit states fit 80 GiB, but not with what its 56 blocks
  // keep at the end of forward (lowerBoundBasis "forwardEnd"); the page says which floor it shows.
  const short = { model: { preset: 'mixtral-8x22b' }, training: { batchSize: 1, sequenceLength: 8192, attention: 'sdpa' } };
  const { page, finish } = await openPage({ url: `${pageUrl}#s=${Buffer.from(JSON.stringify(short)).toString('base64url')}` });
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  await settled(page);
  const expected = (await core()).solve(setupFromUrl(page.url()));
  const qlora = expected.suggestions.find((s) => s.id === 'finetune-qlora');
  assert.ok(qlora && qlora.peakIsLowerBound && qlora.lowerBoundBasis === 'forwardEnd', JSON.stringify(qlora));
  await page.click('#solve-run');
  await page.waitForSelector('#solve-results:not([hidden])', WAIT);
  const item = `#solve-suggestions li[data-id="finetune-qlora"]`;
  assert.equal(await page.getAttribute(item, 'data-lower-bound'), 'true');
  assert.match(await page.textContent(item), /peak at least .* \(its model states and what its blocks keep at the end of forward\)/);
  // A floor of model states alone still says so.
  const statesOnly = expected.suggestions.find((s) => s.lowerBoundBasis === 'modelStates');
  if (statesOnly) assert.match(await page.textContent(`#solve-suggestions li[data-id="${statesOnly.id}"]`), /\(its model states alone\)/);
  assert.equal(await pageHasNoNaN(page), true);
  await finish();
});

test('solve: Llama 3 8B on a 4090 gets a fine-tuning answer that fits once applied', async () => {
  const { page, finish } = await openPage();
  await choosePreset(page, 'llama-3-8b');
  await page.selectOption(GPU_CHOICE, 'nvidia-rtx-4090');
  await waitForAttr(page, '#verdict', 'data-fits', 'false');
  await settled(page);
  const expected = (await core()).solve(setupFromUrl(page.url()));
  const first = expected.suggestions[0];
  assert.ok(first.fits && first.change.finetune?.lora, JSON.stringify(first));
  await page.click('#solve-run');
  await page.waitForSelector('#solve-results:not([hidden])', WAIT);
  await page.click(`#solve-suggestions li[data-id="${first.id}"] button`);
  await waitForAttr(page, '#verdict', 'data-fits', 'true');
  await settled(page);
  // The page keeps every field of the change, the savers without controls included.
  assert.equal(Number(await page.getAttribute('#verdict', 'data-device-bytes')), first.peakBytes);
  const applied = setupFromUrl(page.url());
  for (const [k, v] of Object.entries(first.change.training ?? {})) assert.equal(applied.training[k], v, `training.${k}`);
  for (const [k, v] of Object.entries(first.change.finetune ?? {})) assert.deepEqual(applied.finetune[k], v, `finetune.${k}`);
  await finish();
});

test('new controls are labelled and keyboard-reachable; light, dark and phone screenshots with everything open', async () => {
  for (const [colorScheme, viewport, name] of [['light', { width: 1280, height: 900 }, 'features-light'], ['dark', { width: 1280, height: 900 }, 'features-dark'], ['light', { width: 390, height: 844 }, 'features-phone'], ['dark', { width: 390, height: 844 }, 'features-phone-dark']]) {
    const { page, finish } = await openPage({ colorScheme, viewport });
    await choosePreset(page, 'llama-2-7b');
    await page.selectOption(GPU_CHOICE, 'nvidia-h100-sxm');
    await settled(page);
    await page.click('#compare-pin');
    await page.selectOption('#checkpointing', 'everyBlock');
    await page.click('#import-model summary');
    await settled(page);
    await page.click('#solve-run');
    await page.waitForSelector('#solve-results:not([hidden])', WAIT);
    await page.click('#breakdown button.explain-all');
    const unnamed = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea, button, summary, a[href]')]
      .filter((el) => !el.closest('[hidden]') && el.type !== 'file')
      .filter((el) => !(el.labels?.length || el.getAttribute('aria-label') || el.textContent.trim()))
      .map((el) => el.id || el.outerHTML.slice(0, 80)));
    assert.deepEqual(unnamed, [], 'every control has a name');
    if (viewport.width === 1280 && colorScheme === 'light') {
      // Tab reaches the new controls in order.
      const reached = new Set();
      await page.focus('#example');
      for (let i = 0; i < 160 && reached.size < 8; i++) {
        await page.keyboard.press('Tab');
        const id = await page.evaluate(() => document.activeElement?.id || document.activeElement?.dataset?.export || document.activeElement?.className || '');
        for (const want of ['gpu', 'memoryGiB', 'import-config', 'compare-pin', 'compare-clear', 'csv', 'solve-run', 'timeline-svg']) if (id === want) reached.add(want);
      }
      assert.deepEqual([...reached].sort(), ['compare-clear', 'compare-pin', 'csv', 'gpu', 'import-config', 'memoryGiB', 'solve-run', 'timeline-svg']);
      await page.focus('input[name=units][value=GiB]');
      await page.keyboard.press('ArrowRight');
      await page.waitForFunction(() => / GB$/.test(document.querySelector('#peak-total').textContent), null, WAIT);
    }
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `${name}: no horizontal scrolling (overflow ${overflow} px)`);
    if (colorScheme === 'dark') {
      const panel = await page.$eval('#compare-table', (el) => getComputedStyle(el).color);
      assert.notEqual(panel, 'rgb(29, 35, 43)', 'dark text colours in the comparison');
    }
    assert.equal(await pageHasNoNaN(page), true);
    await page.screenshot({ path: join(screenshotDir, `${name}.png`), fullPage: true });
    await finish();
  }
});
