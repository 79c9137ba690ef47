// The setups at the estimator's limits and past them, as the page is opened on them (a link
// holding the setup as the page writes one): shared by the bounds test (tests/browser/bounds.test.js: each is
// answered or refused with its field named, and never hangs) and the page benchmark
// (scripts/bench-page.mjs: how long each takes, against issue 14's 2 s target).

import { readFileSync } from 'node:fs';
import { deflateRawSync } from 'node:zlib';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { LONG_SETUP_CHARS } from '../../web/setup-params.js';

export const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const pagePath = resolve(process.env.GPUMEM_PAGE ?? join(root, 'dist/gpumem.html'));
export const pageUrl = pathToFileURL(pagePath).href;
export const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage',
];
export const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';

// Issue 14's target: a setup opened in the page is answered or refused within 2 s of the
// navigation's start (scripts/bench-page.mjs prints each case against it).
export const TARGET_MS = 2000;

const layerList = (n, layer) => ({
  model: { kind: 'layers', loss: 'mse', layers: Array.from({ length: n }, (_, i) => layer(i)) },
  training: { batchSize: 4, sequenceLength: 1 },
});

// Quick mode listing `n` largest matrices (Adafactor factors each).
const quick = (n) => ({
  model: { kind: 'parameterCount', parameterCount: 1e12, largestMatrices: Array.from({ length: n }, () => ({ rows: 1000, cols: 1000 })) },
  training: { optimizer: 'adafactor' },
});

export const llama = (architecture, training = {}) => ({
  model: { kind: 'transformer', architecture: { family: 'llama', numKeyValueHeads: 4, ...architecture } },
  training: { batchSize: 1, sequenceLength: 128, attention: 'sdpa', ...training },
});

export { layerList };

// [name, setup, expected state ('ok' | 'error'), what the error must name, {plain}: opened as
// an #s= link whatever its length]
export function boundsCases() {
  const qwen3MoeLora = JSON.parse(readFileSync(join(root, 'tests/data/qwen3-30b-a3b-lora.json'), 'utf8'));
  return [
    ['deep model past the work budget', llama({ vocabSize: 1000, hiddenSize: 64, numLayers: 100000, numHeads: 4, intermediateSize: 128 }), 'error', /layers|numLayers/i],
    ['deep model inside the budget', llama({ vocabSize: 1000, hiddenSize: 64, numLayers: 300, numHeads: 4, intermediateSize: 128 },
      { checkpointing: 'everyBlock' }), 'ok'],
    ['many experts past the budget', llama({ vocabSize: 1000, hiddenSize: 64, numLayers: 6, numHeads: 4, intermediateSize: 128,
      numExperts: 100000, expertsPerToken: 2 }), 'error', /experts/i],
    ['long context with fused attention and checkpointing', { model: { preset: 'llama-3-8b' },
      training: { batchSize: 1, sequenceLength: 262144, attention: 'sdpa', checkpointing: 'everyBlock', precision: 'bf16Mixed' } }, 'ok'],
    ['the largest mixture-of-experts preset', { model: { preset: 'qwen1.5-moe-a2.7b' }, training: { batchSize: 1, sequenceLength: 4096, attention: 'sdpa' } }, 'ok'],
    // Qwen3-30B-A3B (48 layers × 128 experts) with LoRA: 1,258,256 predicted events, within the
    // page's single-estimate budget (1,500,000), past a search's.
    ['a fine-grained mixture of experts with LoRA', qwen3MoeLora, 'ok'],
    ['bad values everywhere', { training: { batchSize: -1, sequenceLength: 'x', precision: 'fp8' }, gpu: { memoryGiB: 0 } }, 'error', /batch/i],
    // A list may have 4,000 layers (kMaxListedLayers, setup.hpp): the longest is answered, one more refused.
    ['the longest layer list', layerList(4000, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 })), 'ok'],
    // As a link written before links were compressed (267 KB): it still opens.
    ['the longest layer list, as an uncompressed #s= link', layerList(4000, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 })), 'ok', undefined, { plain: true }],
    ['a layer list one layer past its limit', layerList(4001, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 })), 'error', /Layers: The list has 4,001 layers/],
    ['a layer list past the work budget', layerList(8000, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 })), 'error', /layers/],
    // Quick mode may list 8,000 matrices (kMaxListedMatrices, setup.hpp).
    ['the longest list of largest matrices', quick(8000), 'ok'],
    ['one matrix past it', quick(8001), 'error', /Largest weight matrices.*: 8,001 matrices are listed/],
    ['a long layer list of wrong types (thousands of errors, capped)',
      layerList(5000, () => ({ type: 'linear', inFeatures: 'x', outFeatures: 'y' })), 'error', /more errors|inFeatures/],
  ];
}

// The link to a setup as the page writes it (web/link.js, writeHash): its JSON in base64url
// (#s=), compressed (#z=, deflate-raw) past LONG_SETUP_CHARS; `plain` keeps #s= whatever its length.
export function urlFor(setup, { plain = false } = {}) {
  const text = JSON.stringify(setup);
  const s = Buffer.from(text).toString('base64url');
  if (plain || s.length <= LONG_SETUP_CHARS) return `${pageUrl}#s=${s}`;
  return `${pageUrl}#z=${deflateRawSync(Buffer.from(text)).toString('base64url')}`;
}

// Opens the page on a setup in a fresh context and waits until it settles: a result shown, or
// the errors (a refused setup keeps the results empty). ms: from the navigation's start (the
// estimate runs as the page loads) to the frame that shows the answer or the errors, as the
// page records it (#results data-shown-at-ms; the test's own polling is not the page's time);
// marks: the page's gpumem:* performance marks (web/app.js), ms since the navigation's start.
export async function settle(browser, setup, { waitMs = 30000, plain = false } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(error.message));
  await page.goto(urlFor(setup, { plain }));
  await page.waitForSelector('body[data-ready=true]', { timeout: waitMs });
  await page.waitForFunction(() => {
    const results = document.querySelector('#results');
    const shown = results.dataset.state === 'ok' && results.getAttribute('aria-busy') !== 'true';
    return (shown || !document.querySelector('#errors').hidden) && results.dataset.shownAtMs !== undefined;
  }, null, { timeout: waitMs });
  const ms = await page.$eval('#results', (el) => Number(el.dataset.shownAtMs));
  const errors = await page.$eval('#errors', (el) => (el.hidden ? '' : el.textContent));
  const state = errors ? 'error' : await page.$eval('#results', (el) => el.dataset.state);
  const timing = await page.evaluate(() => ({
    marks: Object.fromEntries(performance.getEntriesByType('mark').filter((m) => m.name.startsWith('gpumem:')).map((m) => [m.name.slice(7), m.startTime])),
    estimateMs: Number(document.querySelector('#results').dataset.estimateMs ?? NaN),
    renderMs: Number(document.querySelector('#results').dataset.renderMs ?? NaN),
  }));
  return { page, context, ms, state, errors, pageErrors, ...timing };
}
