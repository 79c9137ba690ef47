// The memory-savers fold (issue 11 item 5): built from the core's options.savers, each control
// says which framework option it is, and a change is estimated by the core. The figures are
// compared with the core's estimate of the same setup run under node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { useBrowser, openPage, waitForAttr, coreEstimate, WAIT } from './harness.js';

useBrowser();

const SEARCH = '?preset=llama-3.2-1b&gpu=nvidia-rtx-4090&precision=ampBf16&attention=sdpa&batch-size=1&sequence-length=1024';
const SETUP = {
  model: { preset: 'llama-3.2-1b' },
  training: { precision: 'ampBf16', attention: 'sdpa', batchSize: 1, sequenceLength: 1024 },
  gpu: { id: 'nvidia-rtx-4090' },
};

test('savers: each control names its framework option, and the optimizer in backward and the chunked loss are estimated by the core', async () => {
  const { page, finish } = await openPage({ search: SEARCH });
  const plain = await coreEstimate(SETUP);
  await waitForAttr(page, '#device-total', 'data-bytes', String(plain.device.peakDeviceBytes));
  await page.click('#savers-fold > summary');
  const hint = await page.textContent('#saver-optimizerInBackward-hint');
  assert.match(hint, /optimizer_in_bwd=True/);
  assert.match(await page.textContent('#saver-lossImplementation-hint'), /CEWithChunkedOutputLoss/);

  await page.check('#saver-optimizerInBackward');
  const inBackward = await coreEstimate({ ...SETUP, training: { ...SETUP.training, optimizerInBackward: true } });
  assert.ok(inBackward.device.peakDeviceBytes < plain.device.peakDeviceBytes, 'the case saves memory');
  await waitForAttr(page, '#device-total', 'data-bytes', String(inBackward.device.peakDeviceBytes));

  await page.selectOption('#saver-lossImplementation', 'chunked');
  const both = await coreEstimate({ ...SETUP, training: { ...SETUP.training, optimizerInBackward: true, lossImplementation: 'chunked' } });
  await waitForAttr(page, '#device-total', 'data-bytes', String(both.device.peakDeviceBytes));
  await finish();
});

test('savers: a link that sets a saver opens the fold with the control set', async () => {
  const { page, finish } = await openPage({ search: SEARCH });
  const plain = await coreEstimate(SETUP);
  await waitForAttr(page, '#device-total', 'data-bytes', String(plain.device.peakDeviceBytes));
  assert.equal(await page.getAttribute('#savers-fold', 'open'), null, 'closed while every saver is off');
  await page.click('#savers-fold > summary');
  await page.check('#saver-optimizerInBackward');
  const inBackward = await coreEstimate({ ...SETUP, training: { ...SETUP.training, optimizerInBackward: true } });
  await waitForAttr(page, '#device-total', 'data-bytes', String(inBackward.device.peakDeviceBytes));
  // The state lives in the hash; the query that opened the first page is left behind.
  const url = new URL(page.url());
  url.search = '';
  await finish();
  const again = await openPage({ url: url.href });
  await waitForAttr(again.page, '#device-total', 'data-bytes', String(inBackward.device.peakDeviceBytes));
  assert.equal(await again.page.isChecked('#saver-optimizerInBackward'), true);
  assert.notEqual(await again.page.getAttribute('#savers-fold', 'open'), null, 'opened by the link');
  await again.finish();
});

test('savers: torch_empty_cache_steps is a number the core estimates, and a wrong one is refused by its field', async () => {
  const { page, finish } = await openPage({ search: SEARCH });
  const plain = await coreEstimate(SETUP);
  await waitForAttr(page, '#device-total', 'data-bytes', String(plain.device.peakDeviceBytes));
  await page.click('#savers-fold > summary');
  assert.match(await page.textContent('#saver-emptyCacheSteps-hint'), /torch_empty_cache_steps/);
  await page.fill('#saver-emptyCacheSteps', '1');
  const emptied = await coreEstimate({ ...SETUP, training: { ...SETUP.training, emptyCacheSteps: 1 } });
  assert.notEqual(emptied.device.peakDeviceBytes, plain.device.peakDeviceBytes, 'the case moves the device figure');
  await waitForAttr(page, '#device-total', 'data-bytes', String(emptied.device.peakDeviceBytes));
  await page.fill('#saver-emptyCacheSteps', '-2');
  await page.waitForSelector('#saver-emptyCacheSteps[aria-invalid=true]', WAIT);
  await finish();
});

test('savers: use_reentrant is on by default, and turning it off is estimated by the core', async () => {
  // Llama 3.2 1B checkpointed, pure bf16, SGD, the fused loss: a block's backward is the peak.
  const search = '?preset=llama-3.2-1b&gpu=nvidia-rtx-4090&precision=bf16&attention=sdpa&batch-size=8' +
    '&sequence-length=4096&optimizer=sgd&checkpointing=everyBlock';
  const training = { precision: 'bf16', attention: 'sdpa', batchSize: 8, sequenceLength: 4096, optimizer: 'sgd',
                     checkpointing: 'everyBlock', lossImplementation: 'fusedLinearCrossEntropy' };
  const setup = { model: { preset: 'llama-3.2-1b' }, training, gpu: { id: 'nvidia-rtx-4090' } };
  const { page, finish } = await openPage({ search });
  await page.click('#savers-fold > summary');
  await page.selectOption('#saver-lossImplementation', 'fusedLinearCrossEntropy');
  const reentrant = await coreEstimate(setup);
  await waitForAttr(page, '#device-total', 'data-bytes', String(reentrant.device.peakDeviceBytes));
  assert.equal(await page.isChecked('#saver-useReentrant'), true);
  assert.match(await page.textContent('#saver-useReentrant-hint'), /use_reentrant/);
  await page.uncheck('#saver-useReentrant');
  const plain = await coreEstimate({ ...setup, training: { ...training, useReentrant: false } });
  assert.ok(plain.device.peakDeviceBytes < reentrant.device.peakDeviceBytes, 'the case moves the device figure');
  await waitForAttr(page, '#device-total', 'data-bytes', String(plain.device.peakDeviceBytes));
  await finish();
});
