// The phone layout (issue 13) at 390×844: the verdict stays in view while the form scrolls, no
// page-wide sideways scrolling, tables that scroll say so, touch targets of at least 44 px.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { useBrowser, openPage, waitForAttr, screenshotDir, WAIT } from './harness.js';

useBrowser();

const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true };

async function pinnedInView(page) {
  return page.$eval('#pinned-verdict', (el) => {
    const r = el.getBoundingClientRect();
    return !el.hidden && r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight;
  });
}

test('phone: the verdict stays pinned in view while the form scrolls, and follows each change', async () => {
  const { page, finish } = await openPage(PHONE);
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  const headline = await page.textContent('#verdict .big');
  assert.ok(await pinnedInView(page), 'in view at the top of the page');
  for (const selector of ['#gpu-fieldset', '#batchSize', '#model-fieldset', '#runtime-fold', '#export']) {
    await page.$eval(selector, (el) => el.scrollIntoView({ block: 'center' }));
    assert.ok(await page.evaluate(() => window.scrollY) > 0);
    assert.ok(await pinnedInView(page), `in view with ${selector} scrolled to`);
  }
  assert.match(await page.textContent('#pinned-verdict'), new RegExp(headline));
  // A change made far down the form shows in the pinned verdict.
  await page.$eval('#memoryGiB', (el) => el.scrollIntoView({ block: 'center' }));
  await page.fill('#memoryGiB', '80');
  await waitForAttr(page, '#pinned-verdict', 'data-fits', 'true');
  assert.match(await page.textContent('#pinned-verdict'), /Fits/);
  assert.ok(await pinnedInView(page));
  await page.screenshot({ path: join(screenshotDir, 'phone-pinned-verdict.png') });
  // Pressing it shows the full result.
  await page.tap('#pinned-verdict');
  await page.waitForFunction(() => document.querySelector('#verdict').getBoundingClientRect().top < window.innerHeight, null, WAIT);
  assert.equal(await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth <= 0), true, 'no sideways scrolling of the page');
  await finish();
});

test('phone: tables that do not fit scroll inside their box and say so', async () => {
  const { page, finish } = await openPage(PHONE);
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  const wraps = await page.$$eval('.table-wrap', (els) => els.filter((el) => el.offsetParent).map((el) => ({
    scrolls: el.scrollWidth > el.clientWidth + 1, marked: el.dataset.scrolls, note: getComputedStyle(el, '::before').content,
  })));
  assert.ok(wraps.length > 3);
  assert.ok(wraps.some((w) => w.scrolls), 'at least one table is wider than a phone');
  for (const w of wraps) {
    assert.equal(w.marked, String(w.scrolls));
    if (w.scrolls) assert.match(w.note, /Scroll sideways/);
  }
  await finish();
});

test('phone: every control of the form and the verdict is a touch target of at least 44 px', async () => {
  const { page, finish } = await openPage(PHONE);
  await page.waitForSelector('#verdict[data-verdict]', WAIT);
  await page.click('#runtime-fold > summary');
  const small = await page.evaluate(() => {
    const out = [];
    const controls = document.querySelectorAll('#controls input, #controls select, #controls button, #controls summary, #controls textarea, #pinned-verdict, .summary button');
    for (const el of controls) {
      if (!el.offsetParent && el.id !== 'pinned-verdict') continue;
      if (el.type === 'file' || el.closest('[hidden]')) continue;
      // A checkbox or radio is pressed through its label row.
      const target = el.matches('input[type=checkbox], input[type=radio]') ? el.closest('label, .check') ?? el : el;
      const r = target.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.height < 44) out.push(`${el.tagName.toLowerCase()}#${el.id || el.name || el.textContent.trim().slice(0, 20)} ${Math.round(r.height)} px`);
    }
    return out;
  });
  assert.deepEqual(small, [], 'touch targets under 44 px');
  await finish();
});
