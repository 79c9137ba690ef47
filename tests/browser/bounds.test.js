// Every input answered or refused in bounded time and memory in the page (the single-file page
// from file://, as page.test.js opens it): setups at the estimator's limits are answered, and
// setups past them refused with the field named, without a hang; the solver's Cancel ends a
// search in flight and the page keeps working. How long each takes is a figure, printed here and
// measured by scripts/bench-page.mjs against issue 14's 2 s target: a timed assertion on a
// shared 2-core machine fails on the machine's load, not on the page (the brief: speed is
// measured by benchmark scripts, not by timed tests).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS, boundsCases, chromiumPath, layerList, llama, pagePath, settle as openOn } from './bounds-cases.js';

// Bounded: a setup the page neither answers nor refuses within this long hangs it (the slowest
// case took 2.9–3.7 s on this 2-core machine; the benchmark's figures are in docs/budget.md).
const HANG_MS = 15000;

let browser;

before(async () => {
  assert.ok(existsSync(pagePath), `${pagePath} is missing: run node scripts/assemble-web.mjs first`);
  browser = await chromium.launch({ executablePath: chromiumPath, args: CHROMIUM_ARGS });
});

after(async () => {
  await browser?.close();
});

async function settle(setup, { plain = false } = {}) {
  const opened = await openOn(browser, setup, { waitMs: HANG_MS + 15000, plain });
  assert.deepEqual(opened.pageErrors, [], 'no uncaught exceptions');
  return opened;
}

test('setups at the limits are answered and past them refused, none hanging the page', async () => {
  for (const [name, setup, expected, named, how] of boundsCases()) {
    const { context, ms, state, errors } = await settle(setup, how);
    assert.equal(state, expected, `${name}: ${errors}`);
    if (named) assert.match(errors, named, `${name}: the error names its field`);
    await context.close();
    console.log(`# ${name}: ${state} in ${ms.toFixed(0)} ms`);
    assert.ok(ms < HANG_MS, `${name}: answered only after ${ms.toFixed(0)} ms`);
  }
});

test('a long layer list is edited as JSON, and an edit there is estimated', async () => {
  const { page, context } = await settle(layerList(1000, () => ({ type: 'linear', inFeatures: 64, outFeatures: 64 })));
  assert.equal(await page.$eval('#layer-json', (el) => el.hidden), false, 'the JSON editor is shown');
  assert.equal(await page.$$eval('#layer-list > li', (rows) => rows.length), 0, 'no rows are built');
  const before = await page.$eval('#peak-total', (el) => el.textContent).catch(() => null);
  // Widen the last layer: the estimate follows the text.
  await page.$eval('#layer-json', (el) => {
    const layers = JSON.parse(el.value);
    layers[layers.length - 1].outFeatures = 4096;
    el.value = JSON.stringify(layers);
    el.dispatchEvent(new Event('input', { bubbles: true }));
  });
  await page.waitForFunction((b) => document.querySelector('#results').dataset.state === 'ok' &&
    document.querySelector('#peak-total')?.textContent !== b, before, { timeout: 10000 });
  await context.close();
});

test('Cancel ends a search in flight; the page solves again afterwards', async () => {
  // A deep model near the work budget: each estimate takes tens of milliseconds, a search a second or more.
  const { page, context } = await settle(llama({ vocabSize: 1000, hiddenSize: 64, numLayers: 560, numHeads: 4, intermediateSize: 128 },
    { checkpointing: 'everyBlock', attention: 'eager' }));
  await page.click('#solve-run');
  await page.waitForFunction(() => document.querySelector('#solve').getAttribute('aria-busy') === 'true');
  assert.equal(await page.$eval('#solve-cancel', (el) => el.disabled), false, 'Cancel is offered while solving');
  assert.equal(await page.$eval('#solve-progress', (el) => el.hidden), false, 'progress is shown');
  await page.click('#solve-cancel');
  assert.match(await page.textContent('#solve-status'), /Cancelled/);
  assert.equal(await page.$eval('#solve-run', (el) => el.disabled), false);
  assert.equal(await page.$eval('#solve-progress', (el) => el.hidden), true);
  // A fresh worker answers the next search.
  await page.click('#solve-run');
  await page.waitForFunction(() => /Solved in/.test(document.querySelector('#solve-status').textContent), null, { timeout: 60000 });
  await context.close();
});
