// The page as scripts/serve serves it (the README's first command): build/web over http from
// scripts/serve.py on 127.0.0.1, the modules, the glue and worker.js as files of their own rather
// than the single-file page's inlined scripts. It answers with the core's figures, its views and
// solver run in Web Workers that load worker.js and the glue from the same server, every file it
// asks for is served with the type its loader needs, and it reaches no other origin.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { useBrowser, openPage, root, coreEstimate } from './harness.js';
import { calculatorHash } from '../../web/setup-params.js';

useBrowser();

const webDir = join(root, 'build/web');
const WAIT = { timeout: 60000 };
let server;
let origin;

// A port nobody listens on: the system picks one, and it is closed again for the server to take.
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

before(async () => {
  assert.ok(existsSync(join(webDir, 'index.html')), `${webDir}/index.html is missing: run scripts/build first`);
  const port = await freePort();
  origin = `http://127.0.0.1:${port}`;
  server = spawn('python3', [join(root, 'scripts/serve.py'), webDir, String(port)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  server.stderr.on('data', (chunk) => { stderr += chunk; });
  // Up when it answers; a server that exits or never answers fails here with what it printed.
  const deadline = Date.now() + 15000;
  for (;;) {
    assert.equal(server.exitCode, null, `scripts/serve.py exited: ${stderr}`);
    try {
      if ((await fetch(`${origin}/`)).ok) break;
    } catch { /* not listening yet */ }
    assert.ok(Date.now() < deadline, `scripts/serve.py did not answer within 15 s: ${stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(() => {
  server?.kill();
});

const GPT2 = {
  model: { kind: 'transformer', preset: 'gpt2' },
  training: { batchSize: 2, sequenceLength: 512, precision: 'ampBf16' },
  gpu: { id: 'nvidia-rtx-4090' },
};

test('served by scripts/serve, the page answers with the core\'s figures and runs its views and solver in workers', async () => {
  const { page, finish } = await openPage({ url: `${origin}/`, hash: calculatorHash(GPT2), origin });
  await page.waitForFunction(() => Number(document.querySelector('#peak-total')?.dataset.bytes) > 0, null, WAIT);
  const expected = await coreEstimate(GPT2);
  assert.equal(Number(await page.getAttribute('#peak-total', 'data-bytes')), expected.peak.totalBytes, 'peak total');
  assert.equal(await page.getAttribute('#verdict', 'data-verdict'), expected.device.verdict, 'verdict');

  // The views: in background workers, each a worker.js that loaded the glue beside it.
  await page.waitForFunction(() => document.querySelector('#views')?.dataset.stale === 'false', null, WAIT);
  const views = await page.evaluate(() => ({ ...document.querySelector('#views').dataset }));
  assert.equal(views.inWorker, 'true', `the views ran in Web Workers (status: ${await page.textContent('#views-status')})`);
  assert.ok(Number(views.viewWorkers) >= 1, `view workers: ${views.viewWorkers}`);
  assert.ok(await page.locator('#heatmap rect.current-cell').count() === 1, 'the heat map marks the setup');

  await page.click('#solve-run');
  await page.waitForFunction(() => {
    const solve = document.querySelector('#solve');
    return solve?.dataset.solveMs && solve.getAttribute('aria-busy') !== 'true';
  }, null, WAIT);
  assert.equal(await page.getAttribute('#solve', 'data-in-worker'), 'true', 'the solver ran in a worker');

  await finish();
});

test('scripts/serve.py gives each script the type its loader needs, revalidated on every load', async () => {
  // Module scripts and a worker's importScripts refuse a file whose type is not JavaScript
  // (Python's own table has none for .cjs; some versions give .js a legacy one).
  for (const path of ['/app.js', '/engine.js', '/worker.js', '/gpumem_core.cjs']) {
    const response = await fetch(`${origin}${path}`);
    assert.equal(response.status, 200, path);
    assert.match(response.headers.get('content-type') ?? '', /^text\/javascript/, `${path} served as ${response.headers.get('content-type')}`);
    // Revalidated on every load: a reload after scripts/build never mixes the old build's
    // modules with the new glue.
    assert.equal(response.headers.get('cache-control'), 'no-cache', `${path}: Cache-Control`);
    await response.arrayBuffer();
  }
  const page = await fetch(`${origin}/`);
  assert.match(page.headers.get('content-type') ?? '', /^text\/html/);
  assert.match(await page.text(), /<script[^>]+src="?app\.js/, 'the served page loads its modules as files');
});
