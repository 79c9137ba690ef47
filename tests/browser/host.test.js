// Browser test of the host-memory block (web/host-panel.js) in the single-file page: hidden on one
// GPU without offloading; with ZeRO-2 and the optimizer offloaded over 8 ranks, every row and
// both totals are the core's figures (the core run under node for the same setup); choosing the
// offload in the Many GPUs fold shows it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { coreEstimate, openPage, root, useBrowser } from './harness.js';

useBrowser();
const WAIT = { timeout: 60000 };

function hashOf(setup) {
  return `#s=${Buffer.from(JSON.stringify(setup)).toString('base64url')}`;
}

async function drawnHost(page) {
  return page.evaluate(() => ({
    hidden: document.querySelector('#host').hidden,
    rows: [...document.querySelectorAll('#host-table tbody tr')].map((tr) => ({
      label: tr.children[0].textContent,
      bytes: Number(tr.children[2].dataset.bytes),
      memory: tr.dataset.memory,
    })),
    rank: Number(document.querySelector('#host-rank-total')?.dataset.bytes),
    node: Number(document.querySelector('#host-node-total')?.dataset.bytes),
  }));
}

const BASE = { model: { kind: 'parameterCount', parameterCount: 1.5e9 }, training: { precision: 'fp16Mixed', optimizer: 'adam' } };

test('host memory: hidden without offloading, the core\'s rows and totals with ZeRO-2 offload', async () => {
  const { page, finish } = await openPage({ hash: hashOf(BASE) });
  assert.equal((await drawnHost(page)).hidden, true, 'nothing offloaded: no host block');
  await page.click('#parallel-fold > summary');
  await page.fill('#parallel-dataParallel', '8');
  await page.fill('#parallel-zeroStage', '2');
  await page.selectOption('#parallel-offload', 'optimizer');
  await page.waitForFunction(() => document.querySelector('#host')?.hidden === false, null, WAIT);
  const est = await coreEstimate({ ...BASE, parallel: { dataParallel: 8, zeroStage: 2, offload: 'optimizer' } });
  assert.ok(est.host.rankBytes > 0);
  const drawn = await drawnHost(page);
  assert.deepEqual(drawn.rows, est.host.rows.map((r) => ({ label: r.label, bytes: r.bytes, memory: r.memory })));
  assert.equal(drawn.rank, est.host.rankBytes);
  assert.equal(drawn.node, est.host.nodeBytes);
  assert.equal(est.host.nodeBytes, 8 * est.host.rankBytes);
  await page.locator('#host').screenshot({ path: join(root, 'build/screenshots/host-memory.png') });
  await finish();
});

test('host memory: the runtime fold\'s host memory per node gives the core\'s verdict on it', async () => {
  const setup = { ...BASE, parallel: { dataParallel: 8, zeroStage: 2, offload: 'optimizer' } };
  const est = await coreEstimate(setup);
  // One GiB less than a node keeps: does not fit; twice as much: fits.
  const shortGiB = Math.floor(est.host.nodeBytes / 2 ** 30) - 1;
  const { page, finish } = await openPage({ hash: hashOf({ ...setup, runtime: { hostMemoryGiB: shortGiB } }) });
  await page.waitForFunction(() => document.querySelector('#host-verdict')?.hidden === false, null, WAIT);
  const short = await coreEstimate({ ...setup, runtime: { hostMemoryGiB: shortGiB } });
  assert.equal(short.host.fits, false);
  assert.equal(await page.getAttribute('#host-verdict', 'data-fits'), 'false');
  assert.match(await page.textContent('#host-verdict'), /Does not fit/);
  // A link with runtime values opens the fold itself.
  if (!(await page.$eval('#runtime-fold', (d) => d.open))) await page.click('#runtime-fold > summary');
  await page.fill('#runtime-hostMemoryGiB', String(2 * shortGiB + 4));
  await page.waitForFunction(() => document.querySelector('#host-verdict')?.dataset.fits === 'true', null, WAIT);
  assert.match(await page.textContent('#host-verdict'), /^Fits in the/);
  await finish();
});
