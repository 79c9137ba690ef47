// Shared links (issue 13): short (defaults omitted), with a version tag and a checksum; a link cut
// at 30, 60 or 90 % of its length, from another version, or naming an unknown preset or GPU shows
// a banner at the top and never a silent default with a verdict.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { useBrowser, openPage, waitForAttr, WAIT } from './harness.js';

useBrowser();

async function makeLink() {
  const { page, finish } = await openPage();
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  await page.fill('#batchSize', '2');
  await page.check('input[name=units][value=GB]');
  await page.click('#compare-pin');
  await page.fill('#batchSize', '3');
  await page.waitForFunction(() => location.hash.includes('compare='), null, WAIT);
  await page.waitForFunction(() => document.querySelector('#batchSize').value === '3' && !document.querySelector('#results').hasAttribute('aria-busy'), null, WAIT);
  await page.waitForTimeout(300);
  const url = page.url();
  const peak = await page.getAttribute('#peak-total', 'data-bytes');
  await finish();
  return { url, peak };
}

test('a shared link is short, tagged with the version, and reproduces the setup', async () => {
  const { page, finish } = await openPage();
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  const hash = new URL(page.url()).hash;
  assert.match(hash, /^#v=[^&]+&s=[^&]+&c=[0-9a-z]+$/);
  assert.ok(hash.length < 300, `the first visit's link is ${hash.length} characters`);
  const setup = JSON.parse(Buffer.from(new URLSearchParams(hash.slice(1)).get('s'), 'base64url').toString());
  assert.deepEqual(setup.model, { preset: 'llama-3.2-1b' }, 'a preset by its id alone');
  assert.deepEqual(setup.gpu, { id: 'nvidia-rtx-4090' });
  assert.equal(setup.runtime, undefined, 'defaults are omitted');
  assert.equal(setup.training.batchSize, undefined, 'defaults are omitted');
  await finish();

  const { url, peak } = await makeLink();
  const again = await openPage({ url });
  await waitForAttr(again.page, '#peak-total', 'data-bytes', peak);
  assert.equal(await again.page.inputValue('#batchSize'), '3');
  assert.equal(await again.page.isHidden('#link-banner'), true);
  assert.equal(await again.page.isVisible('#compare'), true);
  assert.equal(await again.page.isChecked('input[name=units][value=GB]'), true);
  await again.finish();
});

test('a link cut at 30, 60 or 90 % of its length shows the banner at the top, never a silent default', async () => {
  const { url } = await makeLink();
  const hashAt = url.indexOf('#');
  for (const share of [0.3, 0.6, 0.9]) {
    const cut = url.slice(0, hashAt + Math.floor((url.length - hashAt) * share));
    const { page, finish } = await openPage({ url: cut });
    await page.waitForSelector('#link-banner:not([hidden])', WAIT);
    const text = await page.textContent('#link-banner');
    assert.match(text, /This link is incomplete/, `${share * 100} %: ${text}`);
    const box = await page.$eval('#link-banner', (el) => el.getBoundingClientRect().top);
    assert.ok(box < 120, `${share * 100} %: the banner is at the top (${box} px)`);
    // Whatever it shows, the banner says it: what was read or what is shown instead.
    assert.match(text, /Showing what it could read|showing .* instead/i);
    await page.click('#link-banner button');
    assert.equal(await page.isHidden('#link-banner'), true);
    await finish();
  }
});

test('a link from another version says so; an edited link fails its checksum', async () => {
  const { url } = await makeLink();
  const other = url.replace(/#v=[^&]+/, '#v=0.0.1');
  const a = await openPage({ url: other });
  await a.page.waitForSelector('#link-banner:not([hidden])', WAIT);
  assert.match(await a.page.textContent('#link-banner'), /another version of gpumem \(0\.0\.1/);
  await a.finish();
  const edited = url.replace(/&units=GB/, '');
  const b = await openPage({ url: edited });
  await b.page.waitForSelector('#link-banner:not([hidden])', WAIT);
  assert.match(await b.page.textContent('#link-banner'), /incomplete/);
  await b.finish();
});

test('unknown preset and GPU ids name themselves in the banner, and no estimate is shown', async () => {
  for (const [search, pattern] of [['?preset=llama-9-zillion', /preset .*"llama-9-zillion"/], ['?preset=gpt2&gpu=nvidia-x9000', /GPU .*"nvidia-x9000"/]]) {
    const { page, finish } = await openPage({ search });
    await page.waitForSelector('#link-banner:not([hidden])', WAIT);
    assert.match(await page.textContent('#link-banner'), pattern);
    assert.equal(await page.getAttribute('#results', 'data-state'), 'empty');
    assert.equal(await page.isVisible('#verdict'), false, 'no verdict for a setup the link did not name');
    await finish();
  }
  const bad = { model: { preset: 'no-such-model' }, gpu: { id: 'nvidia-rtx-4090' } };
  const { page, finish } = await openPage({ hash: `#s=${Buffer.from(JSON.stringify(bad)).toString('base64url')}` });
  await page.waitForSelector('#link-banner:not([hidden])', WAIT);
  assert.match(await page.textContent('#link-banner'), /"no-such-model"/);
  await finish();
});

test('a long setup goes in the link compressed (z=): short, and it reproduces the setup; an old #s= link to it still opens', async () => {
  // 1,000 linear layers, widths 64, 96, 128 in turn: ~65 KB of base64url JSON as #s=.
  const width = (i) => 64 + 32 * (i % 3);
  const layers = Array.from({ length: 1000 }, (_, i) => ({ type: 'linear', inFeatures: i === 0 ? 64 : width(i - 1), outFeatures: width(i) }));
  const setup = { model: { kind: 'layers', loss: 'mse', layers }, training: { batchSize: 4, sequenceLength: 1 } };
  const plain = `#s=${Buffer.from(JSON.stringify(setup)).toString('base64url')}`;
  const first = await openPage({ hash: plain });
  await first.page.waitForFunction(() => /[#&]z=/.test(location.hash), null, WAIT);
  const peak = await first.page.getAttribute('#peak-total', 'data-bytes');
  assert.ok(Number(peak) > 0);
  const url = first.page.url();
  const hash = new URL(url).hash;
  assert.match(hash, /^#v=[^&]+&z=[A-Za-z0-9_-]+&c=[0-9a-z]+$/);
  assert.ok(hash.length * 20 < plain.length, `the link's hash is ${hash.length} characters, against ${plain.length} as #s=`);
  await first.finish();

  const again = await openPage({ url });
  await waitForAttr(again.page, '#peak-total', 'data-bytes', peak);
  assert.equal(await again.page.isHidden('#link-banner'), true);
  const shown = JSON.parse(await again.page.inputValue('#layer-json'));
  assert.deepEqual(shown.map((l) => [l.type, l.inFeatures, l.outFeatures]), layers.map((l) => [l.type, l.inFeatures, l.outFeatures]));
  await again.finish();

  // Cut, the compressed link cannot be read: the banner says so, as for any cut link.
  const hashAt = url.indexOf('#');
  const cut = await openPage({ url: url.slice(0, hashAt + Math.floor((url.length - hashAt) * 0.6)) });
  await cut.page.waitForSelector('#link-banner:not([hidden])', WAIT);
  assert.match(await cut.page.textContent('#link-banner'), /This link is incomplete/);
  await cut.finish();
});
