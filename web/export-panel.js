// Downloads: the breakdown as CSV, the charts as SVG and PNG.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { formatBytes } from './charts.js';
import { csvText, downloadBlob, standaloneSvg, svgToPngBlob } from './exports.js';
import { $, $$, state } from './page-state.js';
import { categoryLabel, gpuCaption, phaseLabel } from './results-panel.js';
import { describeSetup } from './compare-panel.js';

// ---------- exports ----------

export function announce(text) {
  const el = $('#export-status');
  el.textContent = '';
  requestAnimationFrame(() => { el.textContent = text; });
}

// The breakdown as CSV: the categories at the peak and the model states, each with its bytes
// and formula as the core gave them, and the totals.
function breakdownCsv(est) {
  const rows = [['section', 'category', 'label', 'bytes', 'formula']];
  for (const row of est.peak.byCategory) rows.push(['peak', row.category, categoryLabel(row), row.bytes, row.formula ?? '']);
  const step = est.peak.step > 0 ? ` of step ${est.peak.step}` : '';
  rows.push(['peak', 'total', 'Total at the peak', est.peak.totalBytes, `during ${phaseLabel(est.peak.phase)}${step}, event #${est.peak.eventIndex}: ${est.peak.label}`]);
  for (const row of est.modelStates.rows) rows.push(['modelStates', row.category, categoryLabel(row), row.bytes, row.formula ?? '']);
  rows.push(['modelStates', 'total', 'Model states', est.modelStates.totalBytes, `parameters: ${est.modelStates.parameterFormula ?? est.modelStates.parameterCount}`]);
  rows.push(['gpu', 'capacity', 'GPU capacity', est.gpu.capacityBytes, gpuCaption(state.lastGoodSetup?.gpu?.id, est)]);
  rows.push(['gpu', 'headroom', est.gpu.fits ? 'Headroom (fits)' : 'Headroom (does not fit)', est.gpu.headroomBytes, 'capacity − device peak']);
  // What the device holds at its peak (estimate.device), each figure with the core's formula.
  const d = est.device;
  if (d) {
    const f = d.formulas ?? {};
    rows.push(['device', 'peakAllocated', 'Allocated at the peak (caching allocator)', d.peakAllocatedBytes, f.peakAllocatedBytes ?? '']);
    rows.push(['device', 'peakReserved', 'Reserved by the caching allocator', d.peakReservedBytes, f.peakReservedBytes ?? '']);
    rows.push(['device', 'cache', 'Allocator cache at the reserved peak', d.fragmentationBytes, f.fragmentationBytes ?? '']);
    rows.push(['device', 'workspaces', 'cuBLAS / cuBLASLt workspaces', d.workspaceBytes, f.workspaceBytes ?? '']);
    rows.push(['device', 'context', 'CUDA context and kernel images', d.contextBytes, f.contextBytes ?? '']);
    rows.push(['device', 'communication', 'Communication buffers', d.communicationBytes, f.communicationBytes ?? '']);
    rows.push(['device', 'unified', 'Paged optimizer states resident (unified memory)', d.unifiedBytes ?? 0, f.unifiedBytes ?? '']);
    rows.push(['device', 'total', 'On the device at its peak (nvidia-smi)', d.peakDeviceBytes, f.peakDeviceBytes ?? '']);
  }
  return csvText(rows);
}

// What an exported chart carries besides the drawing: its legend (read from the page's legend,
// with the colours it shows), the setup in one line, and the gpumem version.
function exportFrame(base) {
  const legendOf = (selector) => $$(`${selector} li`).map((li) => ({
    label: li.textContent.trim(),
    colour: getComputedStyle(li.querySelector('.swatch') ?? li).backgroundColor,
  }));
  const legend = base === 'gpumem-timeline' ? legendOf('#timeline-chart .timeline-key') : legendOf('#capacity-legend');
  const d = describeSetup(state.lastGoodSetup, state.lastGoodSetup, state.lastGood);
  const one = (x) => `${x.model} · batch ${x.shape} · ${x.precision} · ${x.optimizer} · ${x.gpu}`;
  let setupLine = one(d);
  if (base === 'gpumem-comparison' && state.compare?.shown) {
    setupLine = `A: ${one(describeSetup(state.compare.setup, state.compare.shown, state.compare.estimate))}  |  B: ${one(d)}`;
  }
  return { legend, setupLine, footer: `gpumem ${state.options.version ?? ''} · computed in the browser by the gpumem core (WebAssembly)` };
}

async function exportChart(svg, base, format, title) {
  if (!svg) {
    announce('There is no chart to export yet.');
    return;
  }
  const { text, width, height } = standaloneSvg(svg, { title, ...exportFrame(base) });
  if (format === 'svg') {
    downloadBlob(new Blob([text], { type: 'image/svg+xml' }), `${base}.svg`);
    announce(`Downloaded ${base}.svg.`);
    return;
  }
  try {
    downloadBlob(await svgToPngBlob(text, width, height, 2), `${base}.png`);
    announce(`Downloaded ${base}.png.`);
  } catch (exception) {
    announce(`The PNG could not be made: ${exception.message}`);
  }
}

export function onExport(kind) {
  const est = state.lastGood;
  if (!est) return;
  const peakTitle = `gpumem: peak ${formatBytes(est.peak.totalBytes)} against ${formatBytes(est.gpu.capacityBytes)}`;
  switch (kind) {
    case 'csv':
      downloadBlob(new Blob([breakdownCsv(est)], { type: 'text/csv' }), 'gpumem-breakdown.csv');
      announce('Downloaded gpumem-breakdown.csv.');
      break;
    case 'bar-svg':
    case 'bar-png':
      exportChart($('#capacity-bar svg'), 'gpumem-peak', kind.slice(-3), peakTitle);
      break;
    case 'timeline-svg':
    case 'timeline-png':
      exportChart($('#timeline-chart svg'), 'gpumem-timeline', kind.slice(-3), `gpumem: memory through two training steps, ${peakTitle}`);
      break;
    case 'comparison-svg':
    case 'comparison-png':
      exportChart($('#compare-chart svg'), 'gpumem-comparison', kind.slice(-3), 'gpumem: A (pinned) and B compared');
      break;
    default:
  }
}

export function toggleExplainAll(button) {
  state.explainAll = button.getAttribute('aria-pressed') !== 'true';
  for (const b of $$('.explain-all')) {
    b.setAttribute('aria-pressed', String(state.explainAll));
    b.textContent = state.explainAll ? 'Hide the formulas' : 'Show every formula';
  }
  for (const details of $$('#results details.explain')) details.open = state.explainAll;
}
