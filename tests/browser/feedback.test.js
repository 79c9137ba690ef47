// Feedback and words (issue 13): Solve and Apply from the keyboard keep the focus where the
// person is; Apply scrolls to and highlights the changed result with "was → now"; exported
// charts carry a title, the legend, the setup in one line and the gpumem version; suggestions
// that attack the same peak say so; the solver's hints read as sentences.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { useBrowser, openPage, coreEstimate, WAIT } from './harness.js';

useBrowser();

async function activeId(page) {
  return page.evaluate(() => {
    const el = document.activeElement;
    return el === document.body ? 'body' : el.id || `${el.tagName.toLowerCase()}:${el.getAttribute('aria-label') ?? el.textContent.trim()}`;
  });
}

test('keyboard only: Solve keeps the focus; Tab reaches Apply; Enter applies, scrolls to and highlights "was → now"', async () => {
  const { page, finish } = await openPage({ viewport: { width: 1366, height: 768 } });
  await page.waitForSelector('#verdict[data-verdict=doesNotFit]', WAIT);
  const before = Number(await page.getAttribute('#verdict', 'data-device-bytes'));
  await page.focus('#solve-run');
  await page.keyboard.press('Enter');
  await page.waitForSelector('#solve-results:not([hidden])', { ...WAIT, timeout: 30000 });
  await page.waitForFunction(() => !document.querySelector('#solve').hasAttribute('aria-busy'), null, WAIT);
  assert.equal(await activeId(page), 'solve-run', 'the focus stays on Solve');
  // The solver's hints: no empty clause, no "1 samples".
  const hints = await page.textContent('#solve-results');
  assert.doesNotMatch(hints, / · \./);
  assert.doesNotMatch(hints, /\b1 samples\b/);

  // Tab to the first suggestion's Apply button.
  let reached = '';
  for (let i = 0; i < 40 && !reached.startsWith('button:Apply'); i++) {
    await page.keyboard.press('Tab');
    reached = await activeId(page);
  }
  assert.match(reached, /^button:Apply: /, 'Tab reaches an Apply button');
  const applied = reached.slice('button:Apply: '.length);
  await page.keyboard.press('Enter');
  await page.waitForSelector('#change-note:not([hidden])', WAIT);
  const note = await page.textContent('#change-note');
  const after = Number(await page.getAttribute('#verdict', 'data-device-bytes'));
  assert.notEqual(after, before);
  assert.ok(note.includes(applied), `${note} names ${applied}`);
  assert.match(note, /device peak [\d.]+ [KMG]iB → [\d.]+ [KMG]iB/);
  assert.equal(await page.$eval('.summary', (el) => el.classList.contains('changed')), true, 'the result is highlighted');
  const top = await page.$eval('.summary', (el) => el.getBoundingClientRect().top);
  assert.ok(top >= 0 && top < 768, `the changed result is in view (${top})`);
  assert.equal(await activeId(page), reached, 'the focus stays on the Apply button pressed');
  // The next edit clears the note: it no longer describes what is shown.
  await page.fill('#batchSize', '2');
  await page.waitForSelector('#change-note', { ...WAIT, state: 'hidden' });
  await finish();
});

test('suggestions that save the same bytes say that they attack the same peak, and only then', async () => {
  // GPT-2, autocast bf16, 8 × 1024 on an RTX 4090: Adafactor and SGD save the same bytes (the
  // core's solve); Llama 3 8B at 4 × 4096 on an H100: every suggestion saves a different amount.
  for (const [search, same] of [['?preset=gpt2&batch-size=8&sequence-length=1024&precision=ampBf16&gpu=nvidia-rtx-4090', true],
    ['?preset=llama-3-8b&batch-size=4&sequence-length=4096&gpu=nvidia-h100-sxm&precision=ampBf16', false]]) {
    const { page, finish } = await openPage({ search });
    await page.waitForSelector('#verdict[data-verdict]', WAIT);
    await page.click('#solve-run');
    await page.waitForSelector('#solve-results:not([hidden])', { ...WAIT, timeout: 60000 });
    // Unsimulated changes (floors: their model states alone pass the GPU) say no saving measured.
    const saved = await page.$$eval('#solve-suggestions li[data-id][data-lower-bound="false"]', (items) => items.map((li) => li.querySelector('span').title.split(' B saved')[0]));
    const shared = saved.filter((x, i) => saved.indexOf(x) !== i);
    assert.equal(shared.length > 0, same, `${search}: the case still has the savings it was chosen for (${saved.join(' | ')})`);
    assert.equal(await page.isVisible('#solve-same-peak'), same);
    if (same) assert.match(await page.textContent('#solve-same-peak'), /save the same [\d.]+ [KMG]iB: they attack the same peak/);
    await finish();
  }
});

test('exported charts carry a title, the legend, the setup in one line and the gpumem version', async () => {
  const { page, finish } = await openPage();
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  const version = await page.evaluate(() => document.querySelector('#version').textContent.replace('version ', ''));
  for (const [kind, legendText] of [['bar-svg', 'Parameters'], ['timeline-svg', 'reserved by the caching allocator']]) {
    const [download] = await Promise.all([page.waitForEvent('download'), page.click(`button[data-export=${kind}]`)]);
    const file = join(tmpdir(), `gpumem-${kind}-${process.pid}.svg`);
    await download.saveAs(file);
    const svg = readFileSync(file, 'utf8');
    assert.match(svg, /<text[^>]*font-weight="700"[^>]*>gpumem: /, `${kind}: a title`);
    assert.ok(svg.includes(legendText), `${kind}: the legend`);
    assert.match(svg, /Llama 3\.2 1B · batch 1 × \d+ tokens · .* · NVIDIA GeForce RTX 4090/, `${kind}: the setup in one line`);
    assert.ok(svg.includes(`gpumem ${version}`), `${kind}: the version`);
  }
  const [png] = await Promise.all([page.waitForEvent('download'), page.click('button[data-export=bar-png]')]);
  const pngFile = join(tmpdir(), `gpumem-bar-${process.pid}.png`);
  await png.saveAs(pngFile);
  const bytes = readFileSync(pngFile);
  assert.equal(bytes.subarray(1, 4).toString(), 'PNG');
  // The PNG is as tall as the framed SVG (title, chart, legend, footer) at twice the scale.
  const height = bytes.readUInt32BE(20);
  assert.ok(height > 2 * 64 + 2 * 40, `PNG height ${height}`);
  await finish();
});

test('"headroom" on a listed GPU is written in GiB whatever the units, as its name is', async () => {
  const { page, finish } = await openPage({ search: '?preset=gpt2&batch-size=1&gpu=nvidia-h100-sxm&units=GB' });
  await page.waitForSelector('#verdict[data-verdict=fits]', WAIT);
  assert.match(await page.textContent('#verdict-amount'), /headroom of 79\.18 GiB/);  // CUDA's measured total
  const est = await coreEstimate({ model: { preset: 'gpt2' }, training: { batchSize: 1 }, gpu: { id: 'nvidia-h100-sxm' } });
  assert.ok(est.device.fits);
  await finish();
});

test('the timeline\'s block numbers never touch, and the peak label never crosses the GPU line', async () => {
  for (const search of ['', '?preset=gpt2&batch-size=8&sequence-length=1024&gpu=nvidia-rtx-3060', '?preset=qwen2.5-0.5b&batch-size=4&gpu=nvidia-rtx-4090']) {
    const { page, finish } = await openPage({ search, viewport: { width: 1366, height: 900 } });
    await page.waitForSelector('#timeline-chart .peak-marker', WAIT);
    const { labels, capY, peakBoxes } = await page.evaluate(() => {
      const svg = document.querySelector('#timeline-chart svg');
      const labels = [...svg.querySelectorAll('.layer-label')].map((t) => { const b = t.getBBox(); return { text: t.textContent, x0: b.x, x1: b.x + b.width }; });
      const line = [...svg.querySelectorAll('line.capacity-line')][0];
      const peakBoxes = [...svg.querySelectorAll('.peak-marker text')].map((t) => { const b = t.getBBox(); return [b.y, b.y + b.height]; });
      return { labels, capY: line ? Number(line.getAttribute('y1')) : null, peakBoxes };
    });
    for (let i = 1; i < labels.length; i++) {
      assert.ok(labels[i].x0 > labels[i - 1].x1, `${search}: block numbers ${labels[i - 1].text} and ${labels[i].text} touch`);
    }
    if (capY !== null) for (const [top, bottom] of peakBoxes) assert.ok(capY < top || capY > bottom, `${search}: a peak label (${top}–${bottom}) crosses the GPU line at ${capY}`);
    await finish();
  }
});

test('a config the core cannot trace (t5) gets a way forward: its safetensors header or quick mode', async () => {
  const { page, finish } = await openPage();
  await page.click('#open-import');
  await page.fill('#config-text', JSON.stringify({ model_type: 't5', d_model: 512, num_layers: 6, num_heads: 8, vocab_size: 32128 }));
  await page.click('#import-config');
  await page.waitForSelector('#import-next', WAIT);
  assert.match(await page.textContent('#import-result'), /t5/);
  assert.match(await page.textContent('#import-next'), /\.safetensors.*Parameter count/);
  await finish();
});
