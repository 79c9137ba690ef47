// Browser test of the "Compare with a measurement" card in the single-file page (dist/gpumem.html
// from file://, headless Chromium): a PyTorch memory snapshot dropped on the card is measured by
// the core in the page — the measured peaks and the estimate shown are the core's own figures
// (compareSnapshot in node, same wasm) — and drawn under the estimated timeline; a pickle that
// would run code is refused with its opcode named.

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
const WAIT = { timeout: 30000 };
const snapshotPath = (name) => join(root, 'tests/data/snapshots', name);

let browser;
before(async () => {
  assert.ok(existsSync(pagePath), `${pagePath} is missing: run node scripts/assemble-web.mjs first`);
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS });
  mkdirSync(screenshotDir, { recursive: true });
});
after(async () => { await browser?.close(); });

async function nodeCore() {
  const wasmJs = resolve(process.env.GPUMEM_WASM_JS ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
  const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
  return loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });
}

async function drop(page, name) {
  const bytes = readFileSync(snapshotPath(name));
  const dataTransfer = await page.evaluateHandle(([b64, fileName]) => {
    const data = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([data], fileName, { type: 'application/octet-stream' }));
    return dt;
  }, [bytes.toString('base64'), name]);
  await page.dispatchEvent('#snapshot-card', 'dragover', { dataTransfer });
  await page.dispatchEvent('#snapshot-card', 'drop', { dataTransfer });
}

const SETUP = { model: { kind: 'transformer', preset: 'gpt2' }, training: { batchSize: 2, sequenceLength: 256 } };

test('snapshot: a dropped .pickle is measured and drawn under the estimate', async () => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const requests = [];
  const errors = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(`${pageUrl}#s=${Buffer.from(JSON.stringify(SETUP)).toString('base64url')}`);
  await page.waitForSelector('body[data-ready=true]', { timeout: 10000 });

  const api = await nodeCore();
  const expected = api.compareSnapshot(new Uint8Array(readFileSync(snapshotPath('simple.pickle'))), SETUP);
  assert.equal(expected.measured.peakAllocatedBytes, 22544384);  // tests/snapshot_test.cpp, by hand

  await drop(page, 'simple.pickle');
  await page.waitForSelector('#snapshot-peak-allocated', WAIT);
  const bytesOf = (id) => page.getAttribute(`#${id}`, 'data-bytes').then(Number);
  assert.equal(await bytesOf('snapshot-peak-allocated'), expected.measured.peakAllocatedBytes);
  assert.equal(await bytesOf('snapshot-peak-reserved'), expected.measured.peakReservedBytes);
  assert.equal(await bytesOf('snapshot-estimate-peak'), expected.estimate.peakAllocatedBytes);
  assert.equal(await bytesOf('snapshot-estimate-reserved'), expected.estimate.peakReservedBytes);
  assert.match(await page.textContent('#snapshot-peak-allocated'), /22,544,384/);
  assert.match(await page.textContent('#snapshot-peak-reserved'), /23,068,672/);
  // The chart: the estimate's panel, and the measured allocated and reserved lines under it.
  assert.equal(await page.locator('#snapshot-chart .snapshot-estimate-line').count(), 1);
  assert.equal(await page.locator('#snapshot-chart .snapshot-allocated-line').count(), 1);
  assert.equal(await page.locator('#snapshot-chart .snapshot-reserved-line').count(), 1);
  const allocatedPoints = await page.getAttribute('#snapshot-chart .snapshot-allocated-line', 'points');
  assert.equal(allocatedPoints.trim().split(/\s+/).length, expected.measured.timeline.length);
  await page.locator('#snapshot-card').screenshot({ path: join(screenshotDir, 'snapshot-card.png') });

  // A new setup: the estimate beside the same snapshot follows it.
  const bigger = { ...SETUP, training: { batchSize: 4, sequenceLength: 256 } };
  const expectedBigger = api.compareSnapshot(new Uint8Array(readFileSync(snapshotPath('simple.pickle'))), bigger);
  await page.evaluate((hash) => { location.hash = hash; }, `#s=${Buffer.from(JSON.stringify(bigger)).toString('base64url')}`);
  await page.waitForFunction((want) => document.querySelector('#snapshot-estimate-peak')?.dataset.bytes === want,
    String(expectedBigger.estimate.peakAllocatedBytes), WAIT);

  // A pickle that would call Python code: refused, named, and the figures hidden.
  await drop(page, 'hostile_reduce.pickle');
  await page.waitForSelector('#snapshot-error:not([hidden])', WAIT);
  assert.match(await page.textContent('#snapshot-error'), /STACK_GLOBAL/);
  assert.equal(await page.isHidden('#snapshot-result'), true);

  const outside = requests.filter((u) => !ALLOWED_SCHEMES.has(new URL(u).protocol));
  assert.deepEqual(outside, [], 'the page must not make network requests');
  assert.deepEqual(errors, [], 'no page or console errors');
  await context.close();
});

test('snapshot: the card downloads the script that measures the setup, or says why not', async () => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  await page.goto(`${pageUrl}#s=${Buffer.from(JSON.stringify(SETUP)).toString('base64url')}`);
  await page.waitForSelector('body[data-ready=true]', { timeout: 10000 });
  const api = await nodeCore();
  const expected = api.measureScript(SETUP);
  const [download] = await Promise.all([page.waitForEvent('download', WAIT), page.click('#measure-script')]);
  assert.equal(download.suggestedFilename(), 'gpumem_measure_gpt2.py');
  const saved = join(screenshotDir, download.suggestedFilename());
  await download.saveAs(saved);
  assert.equal(readFileSync(saved, 'utf8'), expected.script, 'the page hands over the core\'s script as it is');
  assert.equal(await page.isHidden('#measure-script-error'), true);

  // A setup the script cannot run: the card names the field instead.
  const parallel = { ...SETUP, parallel: { dataParallel: 4 } };
  await page.evaluate((hash) => { location.hash = hash; }, `#s=${Buffer.from(JSON.stringify(parallel)).toString('base64url')}`);
  const parallelDevice = String(api.estimate(parallel).device.peakDeviceBytes);
  await page.waitForFunction((want) => document.querySelector('#peak-device')?.dataset.bytes === want, parallelDevice, WAIT);
  await page.click('#measure-script');
  await page.waitForSelector('#measure-script-error:not([hidden])', WAIT);
  assert.match(await page.textContent('#measure-script-error'), /parallel: It measures one GPU/);
  assert.deepEqual(errors, [], 'no page or console errors');
  await context.close();
});
