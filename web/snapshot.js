// The page's "Compare with a measurement" card: a PyTorch memory snapshot (the .pickle that
// torch.cuda.memory._dump_snapshot() writes) dropped or chosen, measured by the core
// (compareSnapshot: every figure here comes from it), and drawn under the estimated timeline.
// The file never leaves the page: its bytes go to the wasm core as a Uint8Array.
//
// The single-file page joins its modules into one scope, so top-level names here carry a
// snapshot prefix.

import { GpumemError } from './gpumem.js';
import { svgEl, formatBytes, formatExactBytes, formatInteger } from './charts.js';
import { downloadBlob } from './exports.js';

const snapshotSel = (selector, root = document) => root.querySelector(selector);

// Wires the card; returns { refresh() } for the page to call after each new estimate.
export function wireSnapshot({ api, getSetup }) {
  const card = snapshotSel('#snapshot-card');
  if (!card || typeof api.compareSnapshot !== 'function') return { refresh() {} };
  let loaded = null;  // { bytes: Uint8Array, name }

  function show() {
    if (!loaded) return;
    const setup = getSetup();
    let result;
    try {
      result = api.compareSnapshot(loaded.bytes, setup ?? undefined);
    } catch (error) {
      const errors = error instanceof GpumemError ? error.errors : [{ field: 'snapshot', message: String(error?.message ?? error) }];
      snapshotShowError(card, loaded.name, errors);
      return;
    }
    snapshotRender(card, loaded.name, result);
  }

  async function read(file) {
    if (!file) return;
    try {
      loaded = { bytes: new Uint8Array(await file.arrayBuffer()), name: file.name };
    } catch (error) {
      snapshotShowError(card, file.name, [{ field: 'snapshot', message: `The file could not be read: ${error.message}` }]);
      return;
    }
    show();
  }

  snapshotSel('#snapshot-file', card).addEventListener('change', (event) => read(event.target.files?.[0]));
  // The script that measures the current setup (the core writes it, or names what it cannot run).
  const scriptButton = snapshotSel('#measure-script', card);
  const scriptError = snapshotSel('#measure-script-error', card);
  if (scriptButton && typeof api.measureScript === 'function') {
    scriptButton.addEventListener('click', () => {
      const setup = getSetup();
      scriptError.hidden = true;
      let made;
      try {
        if (!setup) throw new GpumemError([{ field: '', message: 'There is no estimate to measure yet: fix the setup first.' }]);
        made = api.measureScript(setup);
      } catch (error) {
        const errors = error instanceof GpumemError ? error.errors : [{ field: '', message: String(error?.message ?? error) }];
        scriptError.hidden = false;
        scriptError.textContent = `No script for this setup: ${errors.map((e) => `${e.field ? `${e.field}: ` : ''}${e.message}`).join(' ')}`;
        return;
      }
      downloadBlob(new Blob([made.script], { type: 'text/x-python' }), made.fileName);
    });
  }
  const hasFiles = (event) => [...(event.dataTransfer?.types ?? [])].includes('Files');
  card.addEventListener('dragover', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = 'copy';
    card.classList.add('dragging');
  });
  card.addEventListener('dragleave', () => card.classList.remove('dragging'));
  card.addEventListener('drop', (event) => {
    if (!hasFiles(event)) return;
    event.preventDefault();
    event.stopPropagation();
    card.classList.remove('dragging');
    read(event.dataTransfer.files[0]);
  });
  return { refresh: show };
}

function snapshotShowError(card, name, errors) {
  snapshotSel('#snapshot-result', card).hidden = true;
  const box = snapshotSel('#snapshot-error', card);
  box.hidden = false;
  box.replaceChildren(`${name}: `, errors.map((e) => `${e.field ? `${e.field}: ` : ''}${e.message}`).join(' '));
}

function snapshotRender(card, name, result) {
  const m = result.measured;
  const e = result.estimate;
  snapshotSel('#snapshot-error', card).hidden = true;
  snapshotSel('#snapshot-result', card).hidden = false;
  snapshotSel('#snapshot-source', card).textContent =
    `${name}: device ${m.device} of ${m.deviceCount}, ${formatInteger(m.traceEntries)} trace entries.`;
  const rows = [
    ['snapshot-peak-allocated', 'Measured peak allocated', m.peakAllocatedBytes, 'torch.cuda.max_memory_allocated() over the recorded window'],
    ['snapshot-peak-reserved', 'Measured peak reserved', m.peakReservedBytes, 'torch.cuda.max_memory_reserved(): segments from cudaMalloc'],
  ];
  if (e) {
    rows.push(['snapshot-estimate-peak', 'Estimated peak allocated', e.peakAllocatedBytes, 'this setup, simulated: tensors as the allocator rounds them, and workspaces'],
      ['snapshot-estimate-reserved', 'Estimated peak reserved', e.peakReservedBytes, 'this setup, the allocator simulated'],
      ['snapshot-diff-allocated', 'Estimate − measured allocated', result.comparison.estimateMinusPeakAllocatedBytes, ''],
      ['snapshot-diff-reserved', 'Estimate − measured reserved', result.comparison.estimateMinusPeakReservedBytes, '']);
  }
  const s = m.segments;
  rows.push(['snapshot-cached', 'Cached, not in use, at the snapshot', s.inactiveBytes,
    `${formatInteger(s.inactiveBlockCount)} free blocks in ${formatInteger(s.count)} segments; largest ${formatBytes(s.largestInactiveBlockBytes)}; fragmentation ${s.fragmentation.toFixed(2)}`]);
  snapshotSel('#snapshot-figures tbody', card).replaceChildren(...rows.map(([id, label, bytes, note]) => {
    const tr = document.createElement('tr');
    tr.id = id;
    tr.dataset.bytes = String(bytes);
    const cells = [label, formatBytes(bytes), formatExactBytes(bytes), note];
    tr.append(...cells.map((text, i) => {
      const cell = document.createElement(i === 0 ? 'th' : 'td');
      if (i === 0) cell.scope = 'row';
      if (i === 1 || i === 2) cell.className = 'num';
      cell.textContent = text;
      return cell;
    }));
    return tr;
  }));
  snapshotSel('#snapshot-notes', card).replaceChildren(...m.notes.map((n) => Object.assign(document.createElement('li'), { textContent: n })));
  const box = snapshotSel('#snapshot-chart', card);
  box.replaceChildren(snapshotChart(m, e, Math.max(box.clientWidth, 280)));
}

// Two panels on one byte scale: the estimate's running total over its simulated events on top,
// the measured allocated (solid) and reserved (dashed) over the trace's entries below. Their x
// axes differ (events vs trace entries), so each panel has its own.
function snapshotChart(m, e, width) {
  const panel = 110, gap = 26, left = 70, right = 10, top = 8;
  const panels = e ? 2 : 1;
  const height = top + panels * panel + (panels - 1) * gap + 22;
  const maxBytes = Math.max(1, m.peakReservedBytes, m.peakAllocatedBytes, e ? e.peakBytes : 0);
  const plotW = width - left - right;
  const line = (points, xOf, yOf, attrs) => svgEl('polyline', {
    points: points.map((p) => `${xOf(p).toFixed(1)},${yOf(p).toFixed(1)}`).join(' '), fill: 'none', 'stroke-width': 1.5, ...attrs,
  });
  const children = [];
  const drawPanel = (y0, label, series, lastIndex) => {
    const yOf = (bytes) => y0 + panel - (bytes / maxBytes) * panel;
    children.push(svgEl('line', { x1: left, x2: left + plotW, y1: y0 + panel, y2: y0 + panel, stroke: 'currentColor', 'stroke-opacity': 0.4 }));
    children.push(svgEl('text', { x: left - 6, y: y0 + 10, 'text-anchor': 'end', 'font-size': 11, fill: 'currentColor' }, formatBytes(maxBytes)));
    children.push(svgEl('text', { x: left - 6, y: y0 + panel, 'text-anchor': 'end', 'font-size': 11, fill: 'currentColor' }, '0'));
    children.push(svgEl('text', { x: left + 4, y: y0 + 12, 'font-size': 11, fill: 'currentColor' }, label));
    const xOf = (p) => left + (lastIndex > 0 ? (p.index / lastIndex) * plotW : 0);
    for (const { points, key, attrs } of series) children.push(line(points, xOf, (p) => yOf(p[key]), attrs));
  };
  let y = top;
  if (e) {
    const last = e.timeline.length ? e.timeline[e.timeline.length - 1].index : 0;
    drawPanel(y, `Estimated (peak ${formatBytes(e.peakBytes)})`, [{ points: e.timeline, key: 'totalBytes', attrs: { stroke: 'var(--accent, #2563eb)', class: 'snapshot-estimate-line' } }], last);
    y += panel + gap;
  }
  const lastEntry = m.timeline.length ? m.timeline[m.timeline.length - 1].index : 0;
  drawPanel(y, `Measured (peak allocated ${formatBytes(m.peakAllocatedBytes)}, reserved ${formatBytes(m.peakReservedBytes)})`, [
    { points: m.timeline, key: 'reservedBytes', attrs: { stroke: '#b45309', 'stroke-dasharray': '4 3', class: 'snapshot-reserved-line' } },
    { points: m.timeline, key: 'allocatedBytes', attrs: { stroke: '#059669', class: 'snapshot-allocated-line' } },
  ], lastEntry);
  children.push(svgEl('text', { x: left, y: height - 6, 'font-size': 11, fill: 'currentColor' },
    `trace entries 0 to ${formatInteger(lastEntry)}${e ? '; the estimate above runs over its own simulated events' : ''}`));
  return svgEl('svg', { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': 'Measured memory timeline under the estimated one' },
    svgEl('title', {}, 'Measured memory under the estimate'), ...children);
}
