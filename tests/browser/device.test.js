// The device figure in the page (issue 10): the breakdown and bar of what nvidia-smi shows
// (allocated tensors, cuBLAS workspaces, allocator cache, CUDA context) against the GPU, the
// reserved line in the timeline, the runtime controls with their PYTORCH_CUDA_ALLOC_CONF names,
// and the fragmentation, out-of-memory and tight sentences. Every figure is compared with the
// core's estimate of the same setup run under node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { useBrowser, openPage, waitForAttr, coreEstimate, WAIT } from './harness.js';

useBrowser();

// Llama 3.2 1B, autocast bf16, SDPA, batch 8 × 1024 on an RTX 4090: the allocator fails at a
// 501 MiB request with 433 MiB free in fragments (the core's figures).
const LLAMA_4090 = '?preset=llama-3.2-1b&gpu=nvidia-rtx-4090&precision=ampBf16&attention=sdpa&batch-size=8&sequence-length=1024';
const LLAMA_SETUP = {
  model: { preset: 'llama-3.2-1b' },
  training: { precision: 'ampBf16', attention: 'sdpa', batchSize: 8, sequenceLength: 1024 },
  gpu: { id: 'nvidia-rtx-4090' },
};

async function bytesOf(page, selector) {
  return Number(await page.getAttribute(selector, 'data-bytes'));
}

test('device table and bar: reserved, cache, workspaces and context add up to the core\'s device peak', async () => {
  const { page, finish } = await openPage({ search: LLAMA_4090 });
  const est = await coreEstimate(LLAMA_SETUP);
  const d = est.device;
  await waitForAttr(page, '#device-total', 'data-bytes', String(d.peakDeviceBytes));
  const row = (part) => bytesOf(page, `#device-table tr[data-part=${part}] td:nth-child(3)`);
  assert.equal(await row('reserved'), d.peakReservedBytes);
  assert.equal(await row('cache'), d.fragmentationBytes);
  assert.equal(await row('workspaces'), d.workspaceBytes);
  assert.equal(await row('context'), d.contextBytes);
  assert.equal(await row('communication'), d.communicationBytes);
  assert.equal(d.peakReservedBytes + d.contextBytes + d.communicationBytes, d.peakDeviceBytes);
  // Each row expands to the core's formula.
  assert.match(await page.textContent('#device-table tr[data-part=context] td.formula'), /MiB|context/i);
  // The bar's parts: one rect per non-zero part, widths in proportion to their bytes.
  const parts = await page.$$eval('#device-bar rect[data-part]', (rects) => rects.map((r) => ({ part: r.dataset.part, width: Number(r.getAttribute('width')) })));
  assert.deepEqual(parts.map((p) => p.part), ['allocated', 'workspaces', 'cache', 'context']);
  const byPart = Object.fromEntries(parts.map((p) => [p.part, p.width]));
  const ratio = byPart.cache / byPart.context;
  assert.ok(Math.abs(ratio - d.fragmentationBytes / d.contextBytes) < 0.05 * ratio, `cache:context drawn ${ratio}`);
  assert.match(await page.textContent('#device-bar'), /GPU 24\.00 GiB/);
  assert.match(await page.textContent('#device-legend'), /Allocator cache/);
  await finish();
});

test('out of memory: the verdict and the OOM sentence name the failing request and the fragments', async () => {
  const { page, finish } = await openPage({ search: LLAMA_4090 });
  const est = await coreEstimate(LLAMA_SETUP);
  const oom = est.device.oom;
  assert.ok(oom, 'the core finds an OOM for this setup');
  await waitForAttr(page, '#verdict', 'data-verdict', 'doesNotFit');
  assert.match(await page.textContent('#verdict'), /Does not fit/);
  assert.match(await page.textContent('#verdict-why'), /501\.0 MiB request found no free block/);
  const note = await page.textContent('#oom-note');
  assert.match(note, new RegExp(`event #${oom.eventIndex}`));
  assert.ok(note.includes(oom.explanation), note);
  await finish();
});

test('fragmentation is explained in a sentence when a tenth of reserved sits in cached blocks, and only then', async () => {
  // BERT base, fp32, 32 × 512 on an A100 80 GB: most of what is reserved at its peak is cached
  // free blocks. Llama 3.2 1B at 4 × 1024: under a tenth, so no sentence.
  const cases = [
    { search: '?preset=bert-base-uncased&batch-size=32&sequence-length=512&precision=fp32&gpu=nvidia-a100-80',
      setup: { model: { preset: 'bert-base-uncased' }, training: { batchSize: 32, sequenceLength: 512, precision: 'fp32' }, gpu: { id: 'nvidia-a100-80' } }, shown: true },
    { search: '?preset=llama-3.2-1b&batch-size=4&sequence-length=1024&precision=ampBf16&gpu=nvidia-a100-80',
      setup: { model: { preset: 'llama-3.2-1b' }, training: { batchSize: 4, sequenceLength: 1024, precision: 'ampBf16' }, gpu: { id: 'nvidia-a100-80' } }, shown: false },
  ];
  for (const c of cases) {
    const d = (await coreEstimate(c.setup)).device;
    assert.equal(d.fragmentationBytes / d.peakReservedBytes >= 0.1, c.shown, 'the case still has the share it was chosen for');
    const { page, finish } = await openPage({ search: c.search });
    await waitForAttr(page, '#device-total', 'data-bytes', String(d.peakDeviceBytes));
    assert.equal(await page.isVisible('#fragmentation-note'), c.shown);
    if (c.shown) assert.equal(await page.textContent('#fragmentation-note'), d.fragmentationExplanation);
    await finish();
  }
});

test('tight: within 5 % or 1 GiB of capacity the verdict says "Fits, tight" and why', async () => {
  // Find a GPU memory size (GiB) where the core says tight for GPT-2 at batch 1: the device peak
  // plus half a GiB of headroom.
  const base = { model: { preset: 'gpt2' }, training: { batchSize: 1, sequenceLength: 1024 }, gpu: { memoryGiB: 80 } };
  const est = await coreEstimate(base);
  const gib = Math.ceil(((est.device.peakDeviceBytes + 2 ** 29) / 2 ** 30) * 100) / 100;
  const tightEst = await coreEstimate({ ...base, gpu: { memoryGiB: gib } });
  assert.equal(tightEst.device.verdict, 'tight');
  const { page, finish } = await openPage({ search: `?preset=gpt2&batch-size=1&sequence-length=1024&gpu-memory-gib=${gib}` });
  await waitForAttr(page, '#verdict', 'data-verdict', 'tight');
  assert.match(await page.textContent('#verdict .big'), /Fits, tight/);
  assert.match(await page.textContent('#verdict-why'), /under 5 % of the GPU or 1\.00 GiB/);
  await finish();
});

test('the timeline draws reserved beside allocated, and the readout names both', async () => {
  const { page, finish } = await openPage({ search: '?preset=gpt2&batch-size=4&sequence-length=512&gpu=nvidia-a100-80' });
  await page.waitForSelector('#timeline-chart path.reserved-line', WAIT);
  assert.match(await page.textContent('#timeline-chart .timeline-key'), /reserved by the caching allocator/);
  // The reserved line is never below the allocated line: compare the top of both paths (smaller y = more bytes).
  const tops = await page.$$eval('#timeline-chart path.line, #timeline-chart path.reserved-line', (paths) => paths.map((p) => {
    const ys = [...p.getAttribute('d').matchAll(/[V,]([\d.]+)/g)].map((m) => Number(m[1]));
    return Math.min(...ys);
  }));
  assert.ok(tops[1] <= tops[0] + 0.01, `reserved top ${tops[1]} vs allocated top ${tops[0]}`);
  await page.focus('#timeline-chart svg');
  await page.keyboard.press('End');
  assert.match(await page.textContent('#timeline-chart .chart-readout'), /reserved \d/);
  await finish();
});

test('runtime controls: labelled with their PYTORCH_CUDA_ALLOC_CONF names, defaults from the core, applied and validated', async () => {
  const { page, finish } = await openPage({ search: LLAMA_4090 });
  await waitForAttr(page, '#verdict', 'data-verdict', 'doesNotFit');
  await page.click('#runtime-fold > summary');
  for (const name of ['expandable_segments:True', 'max_split_size_mb', 'roundup_power2_divisions', 'garbage_collection_threshold', 'CUDA context', 'CUBLAS_WORKSPACE_CONFIG']) {
    assert.ok(await page.getByLabel(name, { exact: false }).count() >= 1, `a control labelled ${name}`);
  }
  assert.match(await page.textContent('#runtime-fields legend'), /PYTORCH_CUDA_ALLOC_CONF/);
  assert.equal(await page.inputValue('#runtime-cudaContextMiB'), '0');
  assert.equal(await page.isChecked('#runtime-allocator-expandableSegments'), false);

  // expandable_segments:True: the figures follow the core's estimate with it.
  await page.check('#runtime-allocator-expandableSegments');
  const expandable = await coreEstimate({ ...LLAMA_SETUP, runtime: { allocator: { expandableSegments: true } } });
  await waitForAttr(page, '#device-total', 'data-bytes', String(expandable.device.peakDeviceBytes));
  assert.match(decodeURIComponent(page.url()), /s=/);

  // A measured context of 1000 MiB.
  await page.fill('#runtime-cudaContextMiB', '1000');
  await page.waitForFunction(() => document.querySelector('#device-table tr[data-part=context] td:nth-child(3)')?.dataset.bytes === String(1000 * 2 ** 20), null, WAIT);

  // A wrong value is refused by the core, named by the field, and the last result is kept.
  await page.fill('#runtime-allocator-garbageCollectionThreshold', '2');
  await page.waitForSelector('#errors:not([hidden])', WAIT);
  assert.equal(await page.getAttribute('#runtime-allocator-garbageCollectionThreshold', 'aria-invalid'), 'true');
  assert.equal(await page.getAttribute('#results', 'data-state'), 'stale');
  await page.fill('#runtime-allocator-garbageCollectionThreshold', '-1');
  await page.waitForSelector('#runtime-allocator-garbageCollectionThreshold[aria-invalid=true]', WAIT);
  await page.fill('#runtime-allocator-garbageCollectionThreshold', '0');
  await page.waitForSelector('#errors[hidden]', { ...WAIT, state: 'attached' });
  await finish();
});

test('"Make it fit" offers expandable_segments; Apply sets the runtime control and the device figure follows', async () => {
  // GPT-2, autocast bf16, 8 × 1024 on an RTX 4090: the core's solve offers expandable segments.
  const gpt2 = { model: { preset: 'gpt2' }, training: { batchSize: 8, sequenceLength: 1024, precision: 'ampBf16' }, gpu: { id: 'nvidia-rtx-4090' } };
  const { page, finish } = await openPage({ search: '?preset=gpt2&batch-size=8&sequence-length=1024&precision=ampBf16&gpu=nvidia-rtx-4090' });
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  await page.click('#solve-run');
  await page.waitForSelector('#solve-suggestions li[data-id=allocator-expandableSegments]', { ...WAIT, timeout: 60000 });
  await page.click('#solve-suggestions li[data-id=allocator-expandableSegments] button');
  await page.waitForFunction(() => document.querySelector('#runtime-allocator-expandableSegments').checked, null, WAIT);
  assert.equal(await page.getAttribute('#runtime-fold', 'open'), '', 'the runtime fold opens to show the changed setting');
  const expected = await coreEstimate({ ...gpt2, runtime: { allocator: { expandableSegments: true } } });
  await waitForAttr(page, '#device-total', 'data-bytes', String(expected.device.peakDeviceBytes));
  assert.match(await page.textContent('#change-note'), /device peak/);
  await finish();
});
