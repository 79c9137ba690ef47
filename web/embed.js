// <gpumem-calculator>: the calculator as one tag for documentation pages.
//
//   <script src="gpumem-embed.js"></script>
//   <gpumem-calculator preset="llama-2-7b" batch-size="4" sequence-length="2048"
//                      precision="bf16Mixed" optimizer="adamw" gpu="nvidia-h100-sxm"></gpumem-calculator>
//
// Attributes (all optional; docs/schema.md names the values): setup (a whole JSON setup, the
// base), preset, parameter-count, batch-size, sequence-length, precision, optimizer,
// optimizer-implementation, attention, checkpointing, gpu (an id from options.gpus) or
// gpu-memory-gib; many GPUs (docs/parallel.md): data-parallel, zero-stage, fsdp, offload,
// tensor-parallel, gradient-accumulation-steps, sequence-parallel (true / false), pipeline-parallel,
// pipeline-schedule, virtual-stages, pipeline-stage, pipeline-first-stage-layers,
// pipeline-last-stage-layers, context-parallel, expert-parallel, expert-tensor-parallel; units ("GB" for decimal units, GiB otherwise); theme ("light" or "dark";
// otherwise the system's); label (a title instead of the generated one); calculator-url (the
// full page to link to; default: gpumem.html beside this script).
//
// It shows the peak, whether it fits and by how much, a small stacked bar against the GPU and a
// link that opens the same setup in the calculator. Every number comes from the wasm core,
// bundled into dist/gpumem-embed.js with this file (scripts/assemble-web.mjs). After each
// estimate the element fires a "gpumem-estimate" event ({detail: {setup, estimate}}) and keeps
// the estimate in its `estimate` property; a bad setup fires "gpumem-error" ({detail: {errors}}).

import { loadGpumem, GpumemError } from './gpumem.js';
import { capacityBar, formatBytes, formatExactBytes, formatInteger, bytesTitle, setByteUnits } from './charts.js';
import { SETUP_PARAMS, setupFromParams, calculatorHash, compactCalculatorHash } from './setup-params.js';

// Where this script was loaded from, read while it runs (afterwards currentScript is gone): the
// default calculator link is gpumem.html beside it.
const scriptUrl = typeof document !== 'undefined' && document.currentScript && document.currentScript.src
  ? document.currentScript.src : '';

// The bundle defines GpumemCore (the wasm glue) in its own scope; loaded as separate files, the
// glue's <script> defines it globally.
function coreFactory() {
  // eslint-disable-next-line no-undef
  return typeof GpumemCore === 'function' ? GpumemCore : globalThis.GpumemCore;
}

let apiPromise = null;
function api() {
  if (!apiPromise) {
    apiPromise = loadGpumem({ factory: coreFactory() });
    apiPromise.catch(() => { apiPromise = null; });
  }
  return apiPromise;
}

// The page's colours (web/index.html), for the element's own shadow tree.
const STYLE = `
:host { display: block; max-width: 640px; margin: 12px 0; color-scheme: light dark;
  --gm-bg: #ffffff; --gm-fg: #1d232b; --gm-muted: #5b6673; --gm-line: #d5dbe2; --gm-panel: #f5f7f9;
  --gm-accent: #1f5fbf; --gm-ok: #17743a; --gm-ok-bg: #e3f4e8; --gm-bad: #b3261e; --gm-bad-bg: #fde7e5; --gm-track: #e9edf1;
  --c0: #4e79a7; --c1: #f28e2b; --c2: #e15759; --c3: #76b7b2; --c4: #59a14f; --c5: #d4b22a; --c6: #b07aa1; --c7: #9c755f; --c8: #d35fb7; }
@media (prefers-color-scheme: dark) {
  :host(:not([theme=light])) { --gm-bg: #14181d; --gm-fg: #e4e8ed; --gm-muted: #9aa6b3; --gm-line: #323a44; --gm-panel: #1c2128;
    --gm-accent: #7fb0ff; --gm-ok: #6fd49a; --gm-ok-bg: #143222; --gm-bad: #ff8a80; --gm-bad-bg: #3b1a18; --gm-track: #262d36;
    --c0: #6f9fd8; --c1: #f6a04d; --c2: #ee7b7d; --c3: #8fd0ca; --c4: #7dc270; --c5: #e6c84f; --c6: #c99bc0; --c7: #c09a80; --c8: #f29ad8; }
}
:host([theme=dark]) { --gm-bg: #14181d; --gm-fg: #e4e8ed; --gm-muted: #9aa6b3; --gm-line: #323a44; --gm-panel: #1c2128;
  --gm-accent: #7fb0ff; --gm-ok: #6fd49a; --gm-ok-bg: #143222; --gm-bad: #ff8a80; --gm-bad-bg: #3b1a18; --gm-track: #262d36;
  --c0: #6f9fd8; --c1: #f6a04d; --c2: #ee7b7d; --c3: #8fd0ca; --c4: #7dc270; --c5: #e6c84f; --c6: #c99bc0; --c7: #c09a80; --c8: #f29ad8; }
:host([hidden]) { display: none; }
.card { box-sizing: border-box; background: var(--gm-bg); color: var(--gm-fg); border: 1px solid var(--gm-line); border-radius: 8px;
  padding: 10px 12px; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.title { font-weight: 600; margin: 0 0 6px; overflow-wrap: anywhere; }
.setup { color: var(--gm-muted); font-size: .82rem; margin: -4px 0 8px; overflow-wrap: anywhere; }
.row { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: flex-start; justify-content: space-between; }
.label { font-size: .8rem; color: var(--gm-muted); }
.peak { font-size: 1.6rem; font-weight: 700; line-height: 1.1; font-variant-numeric: tabular-nums; }
.verdict { border-radius: 8px; padding: 6px 10px; font-weight: 600; }
.verdict .sub { display: block; font-weight: 400; font-size: .8rem; }
.verdict[data-fits=true] { background: var(--gm-ok-bg); color: var(--gm-ok); }
.verdict[data-fits=false] { background: var(--gm-bad-bg); color: var(--gm-bad); }
.bar { margin-top: 6px; }
.chart { display: block; overflow: visible; }
.chart text { fill: var(--gm-fg); font-size: 11px; font-family: inherit; }
.chart .chart-label.strong { font-weight: 700; }
.chart .bar-track { fill: var(--gm-track); }
.chart .capacity-line { stroke: var(--gm-fg); stroke-width: 1.5; stroke-dasharray: 4 3; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: .78rem; color: var(--gm-muted); margin: 2px 0 0; padding: 0; list-style: none; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
.cat-0 { fill: var(--c0); background: var(--c0); } .cat-1 { fill: var(--c1); background: var(--c1); }
.cat-2 { fill: var(--c2); background: var(--c2); } .cat-3 { fill: var(--c3); background: var(--c3); }
.cat-4 { fill: var(--c4); background: var(--c4); } .cat-5 { fill: var(--c5); background: var(--c5); }
.cat-6 { fill: var(--c6); background: var(--c6); } .cat-7 { fill: var(--c7); background: var(--c7); }
.cat-8 { fill: var(--c8); background: var(--c8); }
.foot { display: flex; flex-wrap: wrap; gap: 4px 12px; justify-content: space-between; align-items: baseline; margin-top: 8px; font-size: .8rem; }
.foot .by { color: var(--gm-muted); }
a { color: var(--gm-accent); }
a:focus-visible { outline: 2px solid var(--gm-accent); outline-offset: 2px; }
.error { color: var(--gm-bad); background: var(--gm-bad-bg); border-radius: 6px; padding: 6px 8px; font-size: .85rem; margin: 6px 0 0; overflow-wrap: anywhere; }
.error ul { margin: 2px 0 0; padding-left: 18px; }
.status { color: var(--gm-muted); font-size: .85rem; }
[hidden] { display: none !important; }
`;

// Constructable stylesheets are not inline <style>, so a documentation page with a strict
// style-src still styles the element; a <style> is the fallback for older browsers.
let sheet = null;
function adoptStyle(root) {
  try {
    if (!sheet) {
      sheet = new CSSStyleSheet();
      sheet.replaceSync(STYLE);
    }
    root.adoptedStyleSheets = [sheet];
  } catch {
    const style = document.createElement('style');
    style.textContent = STYLE;
    root.append(style);
  }
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function labelOf(list, id) {
  return (list ?? []).find((o) => o.id === id)?.label ?? String(id ?? '');
}

const CATEGORY_COLOURS = 9;

class GpumemCalculator extends HTMLElement {
  static get observedAttributes() {
    return [...SETUP_PARAMS, 'units', 'calculator-url', 'label'];
  }

  constructor() {
    super();
    const root = this.attachShadow({ mode: 'open' });
    adoptStyle(root);
    this.card = el('div', 'card');
    this.card.setAttribute('part', 'card');
    this.card.setAttribute('role', 'group');
    this.card.setAttribute('aria-label', 'GPU memory estimate');
    this.status = el('p', 'status', 'Loading the gpumem calculator…');
    this.status.setAttribute('role', 'status');
    this.card.append(this.status);
    root.append(this.card);
    this.estimate = null;
    this.setup = null;
    this.pending = false;
  }

  connectedCallback() {
    this.schedule();
  }

  attributeChangedCallback() {
    this.schedule();
  }

  // Attribute changes made together (a script setting three) give one estimate.
  schedule() {
    if (this.pending) return;
    this.pending = true;
    queueMicrotask(() => {
      this.pending = false;
      this.refresh();
    });
  }

  async refresh() {
    if (!this.isConnected) return;
    let gpumem;
    try {
      gpumem = await api();
    } catch (exception) {
      this.showErrors([{ message: `The calculator could not start: ${exception?.message ?? exception}` }]);
      return;
    }
    const options = gpumem.options();
    const units = (this.getAttribute('units') ?? '').toUpperCase() === 'GB' ? 'GB' : 'GiB';
    const { setup, problems } = setupFromParams((name) => this.getAttribute(name));
    this.setup = setup;
    if (problems.length) {
      this.showErrors(problems, null, units);
      return;
    }
    let estimate;
    let shown = setup;
    try {
      const checked = gpumem.validate(setup);
      if (checked.ok) shown = checked.setup;
      estimate = gpumem.estimate(setup);
    } catch (exception) {
      const errors = exception instanceof GpumemError ? exception.errors : [{ message: String(exception?.message ?? exception) }];
      this.showErrors(errors, setup, units);
      return;
    }
    this.estimate = estimate;
    this.render(options, setup, shown, estimate, units);
    this.dispatchEvent(new CustomEvent('gpumem-estimate', { detail: { setup, estimate } }));
  }

  calculatorLink(setup, units, hash = calculatorHash(setup, { units })) {
    const base = this.getAttribute('calculator-url') || new URL('gpumem.html', scriptUrl || document.baseURI).href;
    const url = new URL(base, document.baseURI);
    url.hash = hash.slice(1);
    return url.href;
  }

  footer(setup, units) {
    const foot = el('div', 'foot');
    const link = el('a', 'open', 'Open in the calculator ↗');
    link.href = this.calculatorLink(setup, units);
    // A long setup (a layer list) is linked compressed, as the calculator writes its own address:
    // a long address is slow to open and gets cut. The href follows a moment later, unless the
    // element has moved on to another setup.
    compactCalculatorHash(setup, { units }).then((hash) => {
      if (this.setup === setup) link.href = this.calculatorLink(setup, units, hash);
    }, () => {});
    link.target = '_blank';
    link.rel = 'noopener';
    link.setAttribute('part', 'link');
    foot.append(el('span', 'by', 'gpumem · computed in your browser'), link);
    return foot;
  }

  showErrors(errors, setup, units) {
    this.estimate = null;
    const box = el('div', 'error');
    box.setAttribute('role', 'alert');
    box.append('This setup cannot be estimated:');
    const list = el('ul');
    for (const e of errors) list.append(el('li', '', e.field && !String(e.message).includes(e.field) ? `${e.field}: ${e.message}` : String(e.message)));
    box.append(list);
    const parts = [el('div', 'title', this.getAttribute('label') || 'gpumem'), box];
    if (setup) parts.push(this.footer(setup, units));
    this.card.replaceChildren(...parts);
    this.dispatchEvent(new CustomEvent('gpumem-error', { detail: { errors } }));
  }

  render(options, setup, shown, est, units) {
    setByteUnits(units);
    const model = shown.model ?? {};
    const training = shown.training ?? {};
    const preset = (options.presets ?? []).find((p) => p.id === setup.model?.preset);
    const gpu = (options.gpus ?? []).find((g) => g.id === shown.gpu?.id);
    let title = this.getAttribute('label');
    if (!title) {
      if (preset) title = preset.label;
      else if (model.kind === 'parameterCount') title = `${formatInteger(model.parameterCount)} parameters (quick estimate)`;
      else if (model.kind === 'layers') title = `Layer list (${(model.layers ?? []).length} layers)`;
      else title = `${labelOf(options.families, model.architecture?.family)} (custom)`;
    }
    const facts = [
      `batch ${training.batchSize} × ${formatInteger(training.sequenceLength)} tokens`,
      labelOf(options.precisions, training.precision),
      labelOf(options.optimizers, training.optimizer),
    ];
    if (model.kind === 'transformer' && training.checkpointing && training.checkpointing !== 'none') {
      facts.push(`checkpointing ${labelOf(options.checkpointings, training.checkpointing)}`);
    }
    // Many GPUs: the estimate is one rank's; say which engine and how many GPUs (estimate.rank).
    if (est.rank) facts.push(`per rank of ${formatInteger(est.rank.worldSize)} GPUs, ${est.rank.engine}`);
    const heading = el('div', 'title', title);
    heading.setAttribute('part', 'title');
    const setupLine = el('div', 'setup', facts.join(' · '));

    const peakBox = el('div');
    const peak = el('div', 'peak', formatBytes(est.peak.totalBytes));
    peak.setAttribute('part', 'peak');
    peak.dataset.bytes = String(est.peak.totalBytes);
    peak.title = bytesTitle(est.peak.totalBytes);
    peakBox.append(el('div', 'label', 'Peak memory'), peak);

    const verdict = el('div', 'verdict');
    verdict.setAttribute('part', 'verdict');
    verdict.dataset.fits = String(Boolean(est.gpu.fits));
    verdict.dataset.headroomBytes = String(est.gpu.headroomBytes);
    const gpuName = gpu ? gpu.label : `${formatBytes(est.gpu.capacityBytes)} GPU`;
    const sub = el('span', 'sub', est.gpu.fits
      ? `${formatBytes(est.gpu.headroomBytes)} headroom on ${gpuName}`
      : `${formatBytes(Math.abs(est.gpu.headroomBytes))} short on ${gpuName}`);
    sub.title = `${formatExactBytes(est.gpu.headroomBytes)} headroom (capacity ${formatExactBytes(est.gpu.capacityBytes)})`;
    verdict.append(est.gpu.fits ? 'Fits' : 'Does not fit', sub);

    const row = el('div', 'row');
    row.append(peakBox, verdict);

    const categoryIndex = (id) => {
      const i = options.categories.findIndex((c) => c.id === id);
      return (i < 0 ? options.categories.length : i) % CATEGORY_COLOURS;
    };
    const segments = est.peak.byCategory.map((r) => ({ label: r.label, bytes: r.bytes, colorIndex: categoryIndex(r.category) }));
    const bar = el('div', 'bar');
    const width = Math.max(240, Math.min(640, Math.round(this.card.clientWidth || 480) - 26));
    bar.append(capacityBar(segments, est.gpu.capacityBytes, { width, peakLabel: `peak ${formatBytes(est.peak.totalBytes)}` }));
    const legend = el('ul', 'legend');
    for (const s of segments) {
      if (!(s.bytes > 0)) continue;
      const li = el('li');
      li.title = bytesTitle(s.bytes);
      li.append(el('span', `swatch cat-${s.colorIndex}`), `${s.label} ${formatBytes(s.bytes)}`);
      legend.append(li);
    }
    this.card.replaceChildren(heading, setupLine, row, bar, legend, this.footer(setup, units));
  }
}

if (typeof customElements !== 'undefined' && !customElements.get('gpumem-calculator')) {
  customElements.define('gpumem-calculator', GpumemCalculator);
}
