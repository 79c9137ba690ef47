#!/usr/bin/env node
// How long the single-file page takes to answer a link, for each setup of the bounds test
// (tests/browser/bounds-cases.js: the estimator's limits and past them, each in a link as the
// page writes it: compressed when long), against issue 14's target: answered or refused within
// 2 s of the navigation's start. Each case is opened RUNS times, each in a fresh browser
// context; printed: the median and the fastest time to the answer on screen, and the median of
// where it went (the page's gpumem:* marks, web/app.js).
//
// Usage: NODE_PATH=/usr/share/nodejs node scripts/bench-page.mjs [RUNS] [--case SUBSTRING]
// Needs dist/gpumem.html (node scripts/assemble-web.mjs) and Chromium (CHROMIUM, default
// /usr/bin/chromium); GPUMEM_PAGE opens another page. Prints figures; exits 0 whatever they are.

import { existsSync } from 'node:fs';
import { cpus } from 'node:os';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS, TARGET_MS, boundsCases, chromiumPath, pagePath, settle } from '../tests/browser/bounds-cases.js';

const runs = Math.max(1, Number(process.argv.slice(2).find((a) => /^\d+$/.test(a)) ?? 3));
const only = process.argv.includes('--case') ? process.argv[process.argv.indexOf('--case') + 1] : null;
if (!existsSync(pagePath)) {
  console.error(`bench-page: ${pagePath} is missing: run node scripts/assemble-web.mjs first`);
  process.exit(2);
}

const median = (values) => {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b);
  return sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : NaN;
};
const fmt = (ms) => (Number.isFinite(ms) ? `${ms.toFixed(0)} ms` : '—');

const browser = await chromium.launch({ executablePath: chromiumPath, args: CHROMIUM_ARGS });
console.log(`page: ${pagePath}`);
console.log(`${browser.version()}, ${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), ${runs} opening(s) a case`);
console.log('Times from the navigation\'s start, medians: answer (on screen), fastest of the openings, script (the page\'s script starts:');
console.log('the browser has read the page and its link), module (the wasm ready), and the first update\'s estimate and render.');
console.log(`${'case'.padEnd(62)} ${'answer'.padStart(8)} ${'fastest'.padStart(8)} ${'script'.padStart(8)} ${'module'.padStart(8)} ${'estimate'.padStart(8)} ${'render'.padStart(8)}  target`);
let missed = 0;
for (const [name, setup, expected, , how] of boundsCases()) {
  if (only && !name.includes(only)) continue;
  const samples = [];
  for (let i = 0; i < runs; i += 1) {
    const opened = await settle(browser, setup, how);
    await opened.context.close();
    if (opened.state !== expected) console.log(`  ${name}: expected ${expected}, the page showed ${opened.state} ${opened.errors}`);
    samples.push(opened);
  }
  const answer = median(samples.map((s) => s.ms));
  const met = answer <= TARGET_MS;
  if (!met) missed += 1;
  const column = (values) => fmt(median(values)).padStart(8);
  console.log(`${name.slice(0, 62).padEnd(62)} ${fmt(answer).padStart(8)} ${fmt(Math.min(...samples.map((s) => s.ms))).padStart(8)} `
    + `${column(samples.map((s) => s.marks.start))} ${column(samples.map((s) => s.marks['module-ready']))} `
    + `${column(samples.map((s) => s.estimateMs))} ${column(samples.map((s) => s.renderMs))}  ${met ? `≤ ${TARGET_MS} ms met` : `> ${TARGET_MS} ms MISSED`}`);
}
await browser.close();
console.log(missed ? `${missed} case(s) missed the ${TARGET_MS} ms target` : `every case within ${TARGET_MS} ms`);
