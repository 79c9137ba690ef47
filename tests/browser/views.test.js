// Browser tests of the views panel and the Web Worker in the single-file page (dist/gpumem.html,
// opened from file:// in headless Chromium, as page.test.js does): each view renders the core's
// numbers for a preset, the heat map's hover shows a cell's peak, the GPU matrix's verdicts are
// the core's, the curves draw the capacity line, and the page keeps answering input while the
// solver runs in the worker. Timings measured in the page are printed (test output).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const pagePath = resolve(process.env.GPUMEM_PAGE ?? join(root, 'dist/gpumem.html'));
const pageUrl = pathToFileURL(pagePath).href;
const screenshotDir = join(root, 'build/screenshots');
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage',
];
const ALLOWED_SCHEMES = new Set(['file:', 'data:', 'blob:']);
// Today's engine takes 5–60 ms an estimate in wasm and a view runs ~20–80 of them.
const WAIT = { timeout: 60000 };

let browser;
let nodeCore;

before(async () => {
  assert.ok(existsSync(pagePath), `${pagePath} is missing: run node scripts/assemble-web.mjs first`);
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS });
  mkdirSync(screenshotDir, { recursive: true });
});

after(async () => {
  await browser?.close();
});

// The same core in node: the figures the page must show.
async function core() {
  if (!nodeCore) {
    const wasmJs = resolve(process.env.GPUMEM_WASM_JS ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
    const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
    nodeCore = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });
  }
  return nodeCore;
}

function urlFor(setup, query = '') {
  return `${pageUrl}${query}#s=${Buffer.from(JSON.stringify(setup)).toString('base64url')}`;
}

async function openPage(url) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const record = { requests: [], consoleErrors: [], pageErrors: [] };
  page.on('request', (request) => record.requests.push(request.url()));
  page.on('console', (message) => { if (message.type() === 'error') record.consoleErrors.push(message.text()); });
  page.on('pageerror', (error) => record.pageErrors.push(error.message));
  await page.goto(url);
  await page.waitForSelector('body[data-ready=true]', { timeout: 10000 });
  const finish = async () => {
    const outside = record.requests.filter((u) => !ALLOWED_SCHEMES.has(new URL(u).protocol));
    assert.deepEqual(outside, [], 'the page must not make network requests');
    assert.deepEqual(record.pageErrors, [], 'uncaught exceptions');
    assert.deepEqual(record.consoleErrors, [], 'console errors');
    await context.close();
  };
  return { page, finish };
}

async function viewsDone(page) {
  await page.waitForFunction(() => document.querySelector('#views')?.dataset.stale === 'false', null, WAIT);
  return page.evaluate(() => ({ ...document.querySelector('#views').dataset }));
}

const GPT2 = {
  model: { kind: 'transformer', preset: 'gpt2' },
  training: { batchSize: 16, sequenceLength: 1024, precision: 'ampBf16' },
  gpu: { id: 'nvidia-rtx-4090' },
};

test('views: heat map, curves and GPU matrix show the core\'s numbers for a preset', async () => {
  const { page, finish } = await openPage(urlFor(GPT2));
  const timings = await viewsDone(page);
  assert.equal(timings.inWorker, 'true', 'the views ran in a Web Worker');
  // A pool of at least two workers shares them: the heat map in one part per worker, the curves
  // in two, merged on the page (the cells below are compared with one whole call in node).
  assert.ok(Number(timings.viewWorkers) >= 2, `view workers: ${timings.viewWorkers}`);
  assert.equal(timings.heatMapParts, timings.viewWorkers);
  assert.equal(timings.curvesParts, '2');
  assert.equal(timings.gpuMatrixParts, '1');
  console.log(`# gpt2 views in the page (${timings.viewWorkers} workers): heat map ${timings.heatMapCoreMs} ms core in ${timings.heatMapParts} parts / `
    + `${timings.heatMapMs} ms from request, curves ${timings.curvesCoreMs} / ${timings.curvesMs} ms, `
    + `GPU matrix ${timings.gpuMatrixCoreMs} / ${timings.gpuMatrixMs} ms, all three from request ${timings.viewsMs} ms`);
  const api = await core();
  const heat = api.heatMap(GPT2);
  const matrix = api.gpuMatrix(GPT2);
  const curves = api.curves(GPT2);

  // Heat map: one rect per cell, each with the core's peak; a boundary between fit and not.
  const cells = await page.$$eval('#heatmap rect.cell', (rects) => rects.map((r) => ({
    batch: Number(r.dataset.batchSize), sequence: Number(r.dataset.sequenceLength), peak: Number(r.dataset.peakBytes), fits: r.dataset.fits === 'true',
  })));
  assert.equal(cells.length, heat.batchSizes.length * heat.sequenceLengths.length);
  for (const cell of cells) {
    const i = heat.batchSizes.indexOf(cell.batch);
    const j = heat.sequenceLengths.indexOf(cell.sequence);
    assert.equal(cell.peak, heat.cells[i][j].peakBytes, `cell ${cell.batch} × ${cell.sequence}`);
    assert.equal(cell.fits, heat.cells[i][j].fits);
  }
  assert.ok(cells.some((c) => c.fits) && cells.some((c) => !c.fits), 'this setup has a boundary to draw');
  assert.ok(await page.locator('#heatmap .fit-boundary line').count() > 0, 'the capacity boundary is drawn');

  // Hover: the readout names the cell's peak (formatted as the page formats bytes) and what dominates.
  const target = page.locator('#heatmap rect.cell[data-batch-size="16"][data-sequence-length="1024"]');
  await target.hover();
  const i = heat.batchSizes.indexOf(16);
  const j = heat.sequenceLengths.indexOf(1024);
  const expectedCell = heat.cells[i][j];
  await page.waitForFunction((peak) => document.querySelector('#heatmap-readout').dataset.peakBytes === String(peak), expectedCell.peakBytes, WAIT);
  const readout = await page.textContent('#heatmap-readout');
  assert.match(readout, /Batch 16 × 1,024 tokens: peak /);
  assert.match(readout, new RegExp(`${expectedCell.dominant.label} dominate`));
  assert.match(readout, expectedCell.fits ? /fits/ : /does not fit by/);
  // Keyboard: focus the map, move one cell left (1,024 is GPT-2's last column), read it.
  await page.focus('#heatmap svg');
  await page.keyboard.press('ArrowLeft');
  assert.match(await page.textContent('#heatmap-readout'), /Batch 16 × 512 tokens: peak /);
  assert.equal(await page.getAttribute('#heatmap-readout', 'data-peak-bytes'), String(heat.cells[i][heat.sequenceLengths.indexOf(512)].peakBytes));

  // GPU matrix: every GPU, the core's verdict and settings.
  const rows = await page.$$eval('#gpu-matrix tbody tr', (trs) => trs.map((tr) => ({ id: tr.dataset.gpuId, fits: tr.dataset.fits === 'true', tier: tr.dataset.tier, text: tr.textContent })));
  assert.equal(rows.length, api.options().gpus.length);
  assert.deepEqual(rows.map((r) => r.id), matrix.gpus.map((g) => g.id));
  for (const [k, row] of rows.entries()) {
    const gpu = matrix.gpus[k];
    assert.equal(row.fits, gpu.fits, gpu.id);
    assert.equal(row.tier, gpu.fits ? matrix.candidates[gpu.choice].tier : 'none');
    assert.match(row.text, gpu.fits ? /fits/ : /does not fit with any of these/);
  }
  assert.ok(rows.some((r) => r.tier === 'asIs') && rows.some((r) => r.tier !== 'asIs'), 'some GPUs need changes');

  // Curves: both charts, with the capacity line at the capacity and the core's points.
  assert.equal(await page.locator('#curves svg.curve-chart').count(), 2);
  assert.equal(await page.locator('#curves .capacity-line').count(), 2);
  const batchPoints = await page.$$eval('#curves svg[data-field="training.batchSize"] circle.curve-point', (cs) => cs.map((c) => Number(c.dataset.peakBytes)));
  assert.deepEqual(batchPoints, curves.batch.points.map((p) => p.peakBytes));
  assert.match(await page.textContent('#curves'), new RegExp(`Largest micro-batch that fits: ${curves.batch.largestFitting.value}\\b`));
  await page.locator('#views').screenshot({ path: join(screenshotDir, 'views-gpt2.png') });

  // Clicking a cell uses its batch and sequence.
  await page.click('#heatmap rect.cell[data-batch-size="2"][data-sequence-length="256"]');
  assert.equal(await page.inputValue('#batchSize'), '2');
  assert.equal(await page.inputValue('#sequenceLength'), '256');
  await finish();
});

test('the page answers typing while the solver runs in the worker, and drops stale results', async () => {
  // Pure bf16: the model states (56 GB) fit the A100, so the solver simulates its searches and
  // changes (in bf16 mixed they pass 80 GB and the solver answers from their bounds at once).
  const big = { model: { kind: 'transformer', preset: 'llama-2-7b' }, training: { batchSize: 2, sequenceLength: 2048, precision: 'bf16' }, gpu: { id: 'nvidia-a100-80' } };
  const { page, finish } = await openPage(urlFor(big));
  // Solve starts from an estimated setup: on a loaded machine the first estimate may still run.
  await page.waitForSelector('#results[data-state=ok]', WAIT);
  // Watched from before the click, on every change of the attribute: a fast machine may finish
  // the search before a polling wait would look.
  await page.evaluate(() => {
    const solve = document.querySelector('#solve');
    new MutationObserver(() => { if (solve.getAttribute('aria-busy') === 'true') window.sawSolveBusy = true; })
      .observe(solve, { attributes: true, attributeFilter: ['aria-busy'] });
  });
  await page.click('#solve-run');
  await page.waitForFunction(() => window.sawSolveBusy === true, null, WAIT);
  // While the search runs, the page's thread is free: each keystroke's round trip is short.
  const gaps = [];
  await page.focus('#batchSize');
  await page.keyboard.press('End');
  for (const key of ['Backspace', '4']) {
    const started = Date.now();
    await page.keyboard.press(key);
    gaps.push(Date.now() - started);
  }
  const stillSolving = await page.evaluate(() => document.querySelector('#solve').getAttribute('aria-busy') === 'true');
  await page.waitForFunction(() => document.querySelector('#solve').getAttribute('aria-busy') !== 'true', null, WAIT);
  const solveMs = Number(await page.getAttribute('#solve', 'data-solve-ms'));
  console.log(`# llama-2-7b solve in the worker: ${solveMs} ms; keystrokes during it answered in ${gaps.join(', ')} ms (still solving after typing: ${stillSolving})`);
  assert.equal(await page.getAttribute('#solve', 'data-in-worker'), 'true');
  assert.ok(Math.max(...gaps) < 1000, `keystrokes answered while solving (${gaps.join(', ')} ms)`);
  assert.equal(await page.inputValue('#batchSize'), '4');
  if (stillSolving) {
    // The results belong to batch 2, so the panel says they are stale.
    assert.equal(await page.getAttribute('#solve-results', 'data-stale'), 'true');
  }
  // The views follow the last setup only: their heat map marks batch 4.
  await viewsDone(page);
  assert.equal(await page.locator('#heatmap rect.current-cell').count(), 1);
  const current = await page.evaluate(() => {
    const svg = document.querySelector('#heatmap svg');
    return svg.querySelectorAll('rect.cell[data-batch-size="4"][data-sequence-length="2048"]').length;
  });
  assert.equal(current, 1);
  await finish();
});

test('without a worker (?worker=0) the views run on the page and show the same numbers', async () => {
  const setup = { ...GPT2, training: { ...GPT2.training, batchSize: 8 } };
  const { page, finish } = await openPage(urlFor(setup, '?worker=0'));
  const timings = await viewsDone(page);
  assert.equal(timings.inWorker, 'false');
  const heat = (await core()).heatMap(setup);
  const first = await page.$eval('#heatmap rect.cell[data-batch-size="8"][data-sequence-length="512"]', (r) => Number(r.dataset.peakBytes));
  assert.equal(first, heat.cells[heat.batchSizes.indexOf(8)][heat.sequenceLengths.indexOf(512)].peakBytes);
  await finish();
});

test('views the search budget refuses say so, from every part, and the message stays', async () => {
  // Qwen3-30B-A3B with LoRA: 1,258,256 predicted events, inside the page's single-estimate
  // budget and past a search's (500,000): the estimate is shown, every view (each part of the
  // heat map and of the curves, and the GPU matrix) is refused, naming the field.
  const setup = JSON.parse(readFileSync(join(root, 'tests/data/qwen3-30b-a3b-lora.json'), 'utf8'));
  const { page, finish } = await openPage(urlFor(setup));
  const timings = await viewsDone(page);
  assert.equal(await page.getAttribute('#results', 'data-state'), 'ok');
  assert.ok(Number(timings.heatMapParts) >= 2, `heat map parts: ${timings.heatMapParts}`);
  const status = await page.$eval('#views-status', (el) => el.textContent);
  assert.match(status, /The views failed: .*500,000 each estimate of a search may take/);
  await finish();
});
