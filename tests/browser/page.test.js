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
import { chromium } from 'playwright-core';

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
async function openPage({ url = pageUrl, viewport = { width: 1280, height: 900 }, colorScheme = 'light' } = {}) {
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
function setupFromUrl(url) {
  const value = new URLSearchParams(new URL(url).hash.slice(1)).get('s');
  assert.ok(value, `the URL carries the setup: ${url}`);
  return JSON.parse(Buffer.from(value, 'base64url').toString('utf8'));
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
  assert.match(await page.textContent('#errors'), /training\.batchSize/);
  assert.equal(await page.getAttribute('#batchSize', 'aria-invalid'), 'true');
  assert.match(await page.textContent('#batchSize ~ .field-error'), /training\.batchSize/);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'stale');
  assert.equal(await page.isVisible('#stale-note'), true);
  assert.equal(await page.textContent('#peak-total'), lastPeak, 'the last good result stays');
  assert.equal(await pageHasNoNaN(page), true);

  await page.fill('#batchSize', 'abc');
  await page.waitForFunction(() => /string|number/i.test(document.querySelector('#errors').textContent), null, WAIT);
  assert.match(await page.textContent('#errors'), /training\.batchSize/);
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
  assert.match(await page.textContent('#errors'), /model\.layers\[2\]\.inFeatures/);
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
  assert.equal(Number(await page.$eval('#verdict', (el) => el.dataset.headroomBytes)), below * 2 ** 30 - peak);

  await page.fill('#memoryGiB', String(Math.ceil(peak / 2 ** 30) + 1));
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
  await page.waitForFunction(() => /training\.sequenceLength/.test(document.querySelector('#errors').textContent), null, WAIT);
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
  assert.match(await page.textContent('#errors'), /model\.architecture\.numHeads/);
  assert.match(await page.textContent('#errors'), /divide/);
  assert.equal(await page.getAttribute('#arch-numHeads', 'aria-invalid'), 'true');
  assert.match(await page.textContent('#arch-numHeads ~ .field-error'), /model\.architecture\.numHeads/);
  assert.equal(await page.$eval('#results', (el) => el.dataset.state), 'stale');
  assert.equal(await page.textContent('#peak-total'), lastPeak, 'the last good result stays');
  await page.screenshot({ path: join(screenshotDir, 'page-architecture-error.png'), fullPage: false });

  await page.fill('#arch-numHeads', '12');
  await page.waitForSelector('#errors[hidden]', { ...WAIT, state: 'attached' });
  assert.equal(await page.getAttribute('#arch-numHeads', 'aria-invalid'), null);
  assert.equal(await page.inputValue('#preset'), 'gpt2', 'back to the preset\'s values: the preset is named again');

  // A sequence longer than GPT-2's position table names training.sequenceLength.
  await page.fill('#sequenceLength', '2048');
  await page.waitForFunction(() => /training\.sequenceLength/.test(document.querySelector('#errors').textContent), null, WAIT);
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
  for (const phase of ['Forward · step 1', 'Backward · step 1', 'Forward · step 2', 'Backward · step 2']) {
    assert.ok(bandLabels.includes(phase), `"${phase}" is labelled (labels: ${bandLabels.join(', ')})`);
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
