// Browser tests of the Many GPUs fold and the per-rank cluster picture in the single-file page
// (dist/gpumem.html from file://), driven as a person would: typing the data-parallel size and
// the ZeRO stage, pasting and dropping a DeepSpeed config, pasting Megatron-LM arguments, asking
// for the fewest GPUs (in the worker) and using the layout; and the <gpumem-calculator> element
// with the parallel attributes. Every drawn number is compared with the core run under node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';
import { openPage, pagePath, root, useBrowser } from './harness.js';

useBrowser();
// A view of 7B runs many estimates; the fewest-GPUs search a few dozen.
const WAIT = { timeout: 60000 };

let nodeCore;
async function core() {
  if (!nodeCore) {
    const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
    const glue = process.env.GPUMEM_GLUE ?? join(root, 'build/wasm/wasm/gpumem_core.cjs');
    nodeCore = await loadGpumem({ factory: createRequire(import.meta.url)(glue) });
  }
  return nodeCore;
}

function hashOf(setup) {
  return `#s=${Buffer.from(JSON.stringify(setup)).toString('base64url')}`;
}

// The cluster as drawn: the boxes, and for the simulated one each state's bytes and placement.
async function drawnCluster(page) {
  return page.evaluate(() => {
    const boxes = [...document.querySelectorAll('#cluster-picture .gpu-box')];
    const simulated = boxes.find((b) => b.dataset.simulated === 'true');
    const states = Object.fromEntries([...simulated.querySelectorAll('dd')].map((dd) => [dd.dataset.state, { bytes: Number(dd.dataset.bytes), placement: dd.dataset.placement }]));
    return {
      boxes: boxes.length,
      worldSize: Number(document.querySelector('#parallel-rank-where').dataset.worldSize),
      engine: document.querySelector('#parallel-rank-engine').textContent,
      why: document.querySelector('#parallel-rank-why').textContent,
      states,
      total: Number(simulated.querySelector('.gpu-total').dataset.bytes),
      hidden: document.querySelector('#cluster').hidden,
    };
  });
}

function assertClusterIs(drawn, est) {
  assert.equal(drawn.hidden, false);
  assert.equal(drawn.worldSize, est.rank.worldSize);
  assert.equal(drawn.boxes, Math.min(est.rank.worldSize, 64));
  assert.equal(drawn.engine, est.rank.engine);
  assert.ok(drawn.why.includes(est.rank.why));
  assert.equal(drawn.total, est.modelStates.totalBytes);
  for (const [key, bytesKey] of [['parameters', 'parametersBytes'], ['masterWeights', 'masterWeightsBytes'], ['gradients', 'gradientsBytes'], ['optimizerStates', 'optimizerStatesBytes']]) {
    assert.equal(drawn.states[key].bytes, est.modelStates[bytesKey], key);
    assert.equal(drawn.states[key].placement, est.rank.holds[key], key);
  }
}

const PAPER = { model: { kind: 'parameterCount', parameterCount: 7.5e9 }, training: { precision: 'fp16Mixed', optimizer: 'adam' } };

test('typing data parallel 64 and ZeRO stages 1-3 draws 64 GPUs holding the ZeRO paper\'s shards', async () => {
  const { page, finish } = await openPage({ hash: hashOf(PAPER) });
  assert.equal(await page.isHidden('#cluster'), true, 'one GPU: no cluster');
  await page.click('#parallel-fold > summary');
  await page.fill('#parallel-dataParallel', '64');
  await page.waitForFunction(() => document.querySelector('#parallel-rank-where')?.dataset.worldSize === '64', null, WAIT);
  const c = await core();
  assertClusterIs(await drawnCluster(page), c.estimate({ ...PAPER, parallel: { dataParallel: 64 } }));
  for (const stage of [1, 2, 3]) {
    await page.fill('#parallel-zeroStage', String(stage));
    await page.waitForFunction((s) => document.querySelector('#parallel-rank-engine')?.textContent === `DeepSpeed ZeRO-${s}`, stage, WAIT);
    const est = c.estimate({ ...PAPER, parallel: { dataParallel: 64, zeroStage: stage } });
    assertClusterIs(await drawnCluster(page), est);
  }
  // ZeRO-3: 1.875 GB of model states per GPU (ZeRO paper §3), drawn on the simulated GPU.
  const drawn = await drawnCluster(page);
  assert.equal(Object.values(drawn.states).reduce((sum, s) => sum + s.bytes, 0), 1_875_000_000);
  await page.screenshot({ path: join(root, 'build/screenshots/parallel-cluster.png'), fullPage: false });
  await finish();
});

test('the FSDP select and offload: sharded parameters, no master, states on the host', async () => {
  const base = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed' } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  await page.fill('#parallel-dataParallel', '8');
  await page.selectOption('#parallel-fsdp', 'FULL_SHARD');
  await page.selectOption('#parallel-offload', 'optimizer');
  await page.waitForFunction(() => (document.querySelector('#parallel-rank-engine')?.textContent ?? '').includes('offload'), null, WAIT);
  const est = (await core()).estimate({ ...base, parallel: { dataParallel: 8, fsdp: 'FULL_SHARD', offload: 'optimizer' } });
  assertClusterIs(await drawnCluster(page), est);
  assert.match(await page.textContent('#cluster-picture .gpu-box[data-simulated=true] dd[data-state=optimizerStates]'), /host/);
  await finish();
});

const DS_CONFIG = JSON.stringify({ zero_optimization: { stage: 3, stage3_prefetch_bucket_size: 'auto', offload_optimizer: { device: 'cpu' } }, bf16: { enabled: true }, gradient_accumulation_steps: 2 });

test('pasting a DeepSpeed config sets the fields by the core\'s import, then the data-parallel size', async () => {
  const base = { model: { preset: 'llama-2-7b' } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  await page.fill('#parallel-deepspeed', DS_CONFIG);
  await page.click('#parallel-deepspeed-apply');
  await page.waitForFunction(() => document.querySelector('#parallel-import-status')?.dataset.state === 'ok', null, WAIT);
  const c = await core();
  const imported = c.importDeepSpeed(DS_CONFIG, base);
  assert.equal(await page.inputValue('#parallel-zeroStage'), '3');
  assert.equal(await page.inputValue('#parallel-offload'), 'optimizer');
  assert.equal(await page.inputValue('#parallel-gradientAccumulationSteps'), '2');
  assert.equal(await page.inputValue('#precision'), imported.setup.training.precision);
  // The notes say how "auto" was resolved (0.9·h² for h = 4096).
  assert.ok((await page.textContent('#parallel-import-status')).includes(String(Math.trunc(0.9 * 4096 * 4096))));
  await page.fill('#parallel-dataParallel', '16');
  await page.waitForFunction(() => document.querySelector('#parallel-rank-where')?.dataset.worldSize === '16', null, WAIT);
  assertClusterIs(await drawnCluster(page), c.estimate({ ...imported.setup, parallel: { ...imported.setup.parallel, dataParallel: 16 } }));
  // A bad config is an error in the panel, not an exception.
  await page.fill('#parallel-deepspeed', '{"zero_optimization": {"stage": 9}}');
  await page.click('#parallel-deepspeed-apply');
  await page.waitForFunction(() => document.querySelector('#parallel-import-status')?.dataset.state === 'error', null, WAIT);
  assert.match(await page.textContent('#parallel-import-status'), /stage/);
  await finish();
});

test('dropping a ds_config.json on the box imports it', async () => {
  const { page, finish } = await openPage({ hash: hashOf({ model: { preset: 'llama-2-7b' } }) });
  await page.click('#parallel-fold > summary');
  const transfer = await page.evaluateHandle((text) => {
    const data = new DataTransfer();
    data.items.add(new File([text], 'ds_config.json', { type: 'application/json' }));
    return data;
  }, DS_CONFIG);
  await page.dispatchEvent('#parallel-deepspeed', 'drop', { dataTransfer: transfer });
  await page.waitForFunction(() => document.querySelector('#parallel-import-status')?.dataset.state === 'ok', null, WAIT);
  assert.equal(await page.inputValue('#parallel-deepspeed'), DS_CONFIG);
  assert.equal(await page.inputValue('#parallel-zeroStage'), '3');
  await finish();
});

test('Megatron-LM arguments set tensor parallel; the cluster shows the tensor-parallel rank\'s states', async () => {
  const base = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed' } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  const args = '--tensor-model-parallel-size 4 --use-distributed-optimizer';
  await page.fill('#parallel-megatron', args);
  await page.click('#parallel-megatron-apply');
  await page.waitForFunction(() => document.querySelector('#parallel-rank-where')?.dataset.worldSize === '4', null, WAIT);
  assert.equal(await page.inputValue('#parallel-tensorParallel'), '4');
  const c = await core();
  const imported = c.importMegatron(args, base);
  assertClusterIs(await drawnCluster(page), c.estimate(imported.setup));
  await finish();
});

test('Fewest GPUs of this type runs the core\'s search in the worker; Use this layout applies it', async () => {
  const base = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed', batchSize: 1, sequenceLength: 1024 }, gpu: { memoryGiB: 40 } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  await page.click('#parallel-fewest');
  await page.waitForSelector('#parallel-fewest-result[data-state=done]', WAIT);
  const c = await core();
  const expected = c.fewestGpus(base);
  assert.equal(expected.found, true);
  assert.equal(Number(await page.getAttribute('#parallel-fewest-result', 'data-gpus')), expected.gpus);
  assert.equal(Number(await page.getAttribute('#parallel-fewest-result', 'data-peak-device-bytes')), expected.peakDeviceBytes);
  assert.ok((await page.textContent('#parallel-fewest-text')).includes(expected.layout));
  // The answer offloads: the host memory a node needs and the answer without offloading.
  assert.equal(expected.offload, true);
  assert.equal(Number(await page.getAttribute('#parallel-fewest-result', 'data-host-node-bytes')), expected.hostNodeBytes);
  const host = await page.textContent('#parallel-fewest-host');
  assert.ok(host.includes(`Without offloading: ${expected.withoutOffload.gpus} GPUs with ${expected.withoutOffload.layout}`), host);
  assert.equal(await page.getAttribute('#parallel-fewest-result', 'data-in-worker'), 'true', 'the search ran in the worker');
  await page.click('#parallel-fewest-use');
  await page.waitForFunction((p) => document.querySelector('#verdict')?.dataset.deviceBytes === String(p), expected.peakDeviceBytes, WAIT);
  assert.equal(await page.getAttribute('#verdict', 'data-fits'), 'true');
  assertClusterIs(await drawnCluster(page), c.estimate(expected.setup));
  await finish();
});

test('<gpumem-calculator> takes data-parallel, zero-stage and fsdp', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gpumem-parallel-'));
  const script = pathToFileURL(join(dirname(pagePath), 'gpumem-embed.js')).href;
  writeFileSync(join(dir, 'embed.html'), `<!doctype html><meta charset="utf-8"><title>embed</title>
<script src="${script}"></script>
<gpumem-calculator id="zero" preset="llama-2-7b" precision="bf16Mixed" data-parallel="8" zero-stage="3"></gpumem-calculator>
<gpumem-calculator id="fsdp" preset="llama-2-7b" precision="bf16Mixed" data-parallel="4" fsdp="SHARD_GRAD_OP" gradient-accumulation-steps="2"></gpumem-calculator>`);
  // harness.openPage waits for the calculator page's ready flag, which an embedding page has not.
  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--headless', '--no-sandbox', '--disable-gpu'] });
  try {
    const tab = await browser.newPage();
    const errors = [];
    tab.on('pageerror', (e) => errors.push(e.message));
    await tab.goto(pathToFileURL(join(dir, 'embed.html')).href);
    const c = await core();
    for (const [id, parallel] of [['zero', { dataParallel: 8, zeroStage: 3 }], ['fsdp', { dataParallel: 4, fsdp: 'SHARD_GRAD_OP', gradientAccumulationSteps: 2 }]]) {
      await tab.waitForSelector(`#${id} .peak[data-bytes]`, WAIT);
      const est = c.estimate({ model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed' }, parallel });
      assert.equal(Number(await tab.$eval(`#${id}`, (el) => el.shadowRoot.querySelector('.peak').dataset.bytes)), est.peak.totalBytes, id);
      assert.equal(await tab.$eval(`#${id}`, (el) => el.estimate.rank.worldSize), est.rank.worldSize);
      assert.ok((await tab.$eval(`#${id}`, (el) => el.shadowRoot.querySelector('.setup').textContent)).includes(`per rank of ${est.rank.worldSize} GPUs, ${est.rank.engine}`));
    }
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
  }
});

test('Layouts for N GPUs: the table is the core\'s ranking, run in the worker; clicking a row applies it', async () => {
  const base = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed', batchSize: 1, sequenceLength: 512 }, gpu: { memoryGiB: 40 } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  await page.fill('#parallel-layouts-gpus', '4');
  await page.click('#parallel-layouts-run');
  await page.waitForSelector('#parallel-layouts-result[data-state=done]', WAIT);
  const c = await core();
  const expected = c.layouts(base, { gpus: 4 });
  assert.ok(expected.rows.length > 1);
  assert.equal(await page.getAttribute('#parallel-layouts-result', 'data-in-worker'), 'true', 'the search ran in the worker');
  const drawn = await page.$$eval('#parallel-layouts-table tbody tr', (rows) => rows.map((r) => ({ peak: Number(r.dataset.peakDeviceBytes), comm: Number(r.dataset.communicationBytes) })));
  assert.deepEqual(drawn, expected.rows.map((r) => ({ peak: r.peakDeviceBytes, comm: r.cost.communicationBytes })));
  const hashBefore = await page.evaluate(() => location.hash);
  const pick = expected.rows[1];
  await page.click('#parallel-layouts-table tbody tr[data-index="1"]');
  await page.waitForFunction((p) => document.querySelector('#verdict')?.dataset.deviceBytes === String(p), pick.peakDeviceBytes, WAIT);
  assert.equal(await page.getAttribute('#verdict', 'data-fits'), 'true');
  assertClusterIs(await drawnCluster(page), c.estimate(pick.setup));
  assert.equal(await page.inputValue('#parallel-tensorParallel'), String(pick.tensorParallel));
  await page.waitForFunction((h) => location.hash !== h, hashBefore, WAIT);  // the layout is in the URL
  await finish();
});

test('An accelerate config pasted in the Many GPUs fold sets FSDP and the data-parallel size', async () => {
  const base = { model: { preset: 'gpt2' }, training: { sequenceLength: 256 } };
  const { page, finish } = await openPage({ hash: hashOf(base) });
  await page.click('#parallel-fold > summary');
  const yaml = 'distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_use_orig_params: true\n';
  await page.fill('#parallel-accelerate', yaml);
  await page.click('#parallel-accelerate-apply');
  await page.waitForFunction(() => document.querySelector('#parallel-rank-where')?.dataset.worldSize === '4', null, WAIT);
  assert.equal(await page.inputValue('#parallel-fsdp'), 'SHARD_GRAD_OP');
  assert.ok((await page.textContent('#parallel-import-status')).includes('fsdp_config.fsdp_use_orig_params'));
  const c = await core();
  assertClusterIs(await drawnCluster(page), c.estimate(c.importAccelerate(yaml, base).setup));
  await page.fill('#parallel-accelerate', 'a:\n  - 1\n');
  await page.click('#parallel-accelerate-apply');
  await page.waitForSelector('#parallel-import-status[data-state=error]', WAIT);
  await finish();
});
