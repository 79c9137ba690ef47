// Shared by the page's modules: the page state, DOM shortcuts, timings and number parsing.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

export const $ = (selector, root = document) => root.querySelector(selector);
export const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

export const TYPING_DELAY_MS = 150;
// An update (estimate + render) slower than this makes the page wait longer after the last
// keystroke, so typing "4096" runs one estimate, not four. A 32-block model traces ~14k events;
// its estimate takes 40–110 ms in headless Chromium, more on a slow machine.
export const SLOW_UPDATE_MS = 150;
export const MAX_TYPING_DELAY_MS = 600;
export const LARGEST_EVENTS = 8;
// The views wait this long after an estimate before asking the worker, so a burst of changes
// (a select scrolled with the keyboard) runs them once.
export const VIEWS_DELAY_MS = 120;
export const VIEW_KINDS = ['heatMap', 'curves', 'gpuMatrix'];

export const state = {
  api: null,
  options: null,
  quickKind: 'parameterCount',
  layersKind: 'layers',
  archKind: 'transformer',
  examples: [],       // [{id, label, setup}] from options()
  presetBase: '',     // the preset the architecture fields were last filled from
  lastGood: null,     // the last estimate rendered
  lastContext: null,  // {kind, presetId, family} of the setup behind lastGood
  lastHash: '',       // the hash this page wrote, to tell it from one a person pasted
  lastCostMs: 0,      // how long the last estimate and render took
  chartWidth: -1,     // the timeline chart's box width when last drawn
  segmentsIdle: null, // the allocator's segments, drawn once the answer is shown (results-panel.js)
  inputAt: 0,         // when the change being estimated was made (performance.now())
  timer: 0,
  units: 'GiB',       // 'GiB' or 'GB': how byte figures are shown (URL: units=GB)
  gpuId: '',          // the GPU chosen from options.gpus (setup's gpu.id), '' for a custom size
  hashSetup: null,    // the setup last written to the URL
  hashGeneration: 0,  // writes to the URL so far: a compressed one still to come that is older is dropped
  compare: null,      // {setup, shown, estimate, error}: the pinned setup A (URL: compare=)
  explainAll: false,  // every formula expanded
  embed: false,       // ?embed=1: compact layout without the editor
  solvedFor: '',      // the setup (JSON) the solve panel's results belong to
  engine: null,       // web/engine.js: the core's long calls in Web Workers
  views: {},          // {heatMap, curves, gpuMatrix}: the last results of each view
  viewsFor: '',       // the setup (JSON) the views were asked for
  viewsTimer: 0,
  solving: false,
};

// ---------- number input ----------

// Parses what a person types for a count or a size: "1.5e9", "1,500,000,000", "1.5B", "80".
// Returns NaN when it is not a number; the caller then hands the raw text to the core, whose
// error message names the field.
export function parseNumberText(text) {
  const t = String(text).trim().replace(/[\s,_']/g, '');
  const m = /^([+-]?(?:\d+\.?\d*|\.\d+))(?:e([+-]?\d+))?([kmbgt])?$/i.exec(t);
  if (!m) return NaN;
  const suffixPower = { k: 3, m: 6, b: 9, g: 9, t: 12 }[(m[3] || '').toLowerCase()] || 0;
  // Build one decimal literal so that "1.1B" parses to exactly 1100000000.
  return Number(`${m[1]}e${Number(m[2] || 0) + suffixPower}`);
}

export function numberValue(input) {
  const raw = input.value.trim();
  const n = parseNumberText(raw);
  return Number.isFinite(n) ? n : raw;
}

// "1024×50257, 512x1024" → [{rows, cols}]; an error message when an entry is not rows×cols.
export function parseMatrices(text) {
  const entries = text.split(/[,;\n]+/).map((s) => s.trim()).filter(Boolean);
  const matrices = [];
  for (const entry of entries) {
    const parts = entry.split(/\s*[×xX*]\s*/);
    const rows = parts.length === 2 ? parseNumberText(parts[0]) : NaN;
    const cols = parts.length === 2 ? parseNumberText(parts[1]) : NaN;
    if (!Number.isFinite(rows) || !Number.isFinite(cols)) {
      return { error: `"${entry}" is not rows×cols; write each matrix like 1024×50257, separated by commas` };
    }
    matrices.push({ rows, cols });
  }
  return { matrices };
}

export function displayNumber(value) {
  if (value === undefined || value === null) return '';
  return String(value);
}
