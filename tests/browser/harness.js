// Shared harness of the browser tests: headless Chromium on the single-file page from file://,
// every request recorded (anything but file:, data: or blob: fails), console errors and
// uncaught exceptions failing the test at its end.
import { before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

export const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const pagePath = resolve(process.env.GPUMEM_PAGE ?? join(root, 'dist/gpumem.html'));
export const pageUrl = pathToFileURL(pagePath).href;
export const screenshotDir = join(root, 'build/screenshots');
export const WAIT = { timeout: 10000 };

const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage',
];
const ALLOWED_SCHEMES = new Set(['file:', 'data:', 'blob:']);

let browser;

// Registers the browser's start and stop with node:test; call once per test file.
export function useBrowser() {
  before(async () => {
    assert.ok(existsSync(pagePath), `${pagePath} is missing: run node scripts/assemble-web.mjs first`);
    browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS });
    mkdirSync(screenshotDir, { recursive: true });
  });
  after(async () => {
    await browser?.close();
  });
}

// Opens the page (optionally with a query and hash) in a fresh context; `finish` checks network
// isolation, console errors and uncaught exceptions, then closes the context. `origin`: the one
// http origin the page may also reach (the page served by scripts/serve, from that server).
export async function openPage({ url = pageUrl, search = '', hash = '', viewport = { width: 1280, height: 900 }, colorScheme = 'light', hasTouch = false, isMobile = false, origin = null } = {}) {
  const context = await browser.newContext({ viewport, colorScheme, acceptDownloads: true, hasTouch, isMobile });
  const page = await context.newPage();
  const record = { requests: [], consoleErrors: [], pageErrors: [] };
  page.on('request', (request) => record.requests.push(request.url()));
  page.on('console', (message) => { if (message.type() === 'error') record.consoleErrors.push(message.text()); });
  page.on('pageerror', (error) => record.pageErrors.push(error.message));
  await page.goto(`${url}${search}${hash}`);
  await page.waitForSelector('body[data-ready=true]', WAIT);
  const finish = async () => {
    const outside = record.requests.filter((u) => !ALLOWED_SCHEMES.has(new URL(u).protocol) && new URL(u).origin !== origin);
    assert.deepEqual(outside, [], 'the page must not make network requests');
    assert.deepEqual(record.pageErrors, [], 'uncaught exceptions');
    assert.deepEqual(record.consoleErrors, [], 'console errors');
    await context.close();
  };
  return { page, context, record, finish };
}

// The estimate the page last rendered is not exposed; tests read the numbers from the DOM's
// data-bytes attributes and compare them with the core run under node (tests/js) or the CLI.
export async function waitForAttr(page, selector, name, value) {
  await page.waitForFunction(([s, n, v]) => document.querySelector(s)?.getAttribute(n) === v, [selector, name, value], WAIT);
}

// Runs the core under node for the same setup, to compare the page's figures with it.
export async function coreEstimate(setup) {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const factory = require(process.env.GPUMEM_GLUE ?? join(root, 'build/wasm/wasm/gpumem_core.cjs'));
  const { loadGpumem } = await import(pathToFileURL(join(root, 'wasm/gpumem.js')).href);
  const gpumem = await loadGpumem({ factory });
  return gpumem.estimate(setup, { timeline: 'labelled' });
}
