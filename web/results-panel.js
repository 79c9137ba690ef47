// The results: the peak, the verdict, the device figure, the breakdown tables and the charts.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { bytesTitle, capacityBar, formatBytes, formatBytesOther, formatExactBytes, formatInteger, segmentsChart, timelineChart } from './charts.js';
import { describeSetup, drawCompareChart, renderCompare } from './compare-panel.js';
import { gpuById } from './gpu-panel.js';
import { presetById } from './model-panel.js';
import { $, $$, LARGEST_EVENTS, state } from './page-state.js';
import { renderHost } from './host-panel.js';

// ---------- estimate and rendering ----------

export function phaseLabel(id) {
  return state.options.phases.find((p) => p.id === id)?.label ?? id;
}

// One colour class per category, cat-0 … cat-8 in index.html; a tenth category would reuse one.
const CATEGORY_COLOURS = 9;

export function categoryIndex(id) {
  const i = state.options.categories.findIndex((c) => c.id === id);
  return (i < 0 ? state.options.categories.length : i) % CATEGORY_COLOURS;
}

export function categoryLabel(row) {
  return row.label || state.options.categories.find((c) => c.id === row.category)?.label || row.category;
}

export function cell(text, className) {
  const td = document.createElement('td');
  if (className) td.className = className;
  if (text instanceof Node) td.append(text);
  else td.textContent = text;
  return td;
}

function bytesCells(bytes) {
  const human = cell(formatBytes(bytes), 'num');
  human.title = bytesTitle(bytes);
  const exact = cell(formatExactBytes(bytes), 'num');
  exact.dataset.bytes = String(bytes);
  return [human, exact];
}

function categoryCell(row, heuristic) {
  const frag = document.createDocumentFragment();
  const swatch = document.createElement('span');
  swatch.className = `swatch cat-${categoryIndex(row.category)}`;
  swatch.setAttribute('aria-hidden', 'true');
  frag.append(swatch, categoryLabel(row));
  if (heuristic && row.category === 'activations') {
    const badge = document.createElement('span');
    badge.className = 'badge';
    badge.textContent = 'heuristic';
    frag.append(' ', badge);
  }
  return cell(frag);
}

function fillBytesTable(table, rows, total, totalLabel, totalId, heuristic) {
  const body = $('tbody', table);
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement('tr');
    tr.dataset.category = row.category;
    tr.append(categoryCell(row, heuristic), ...bytesCells(row.bytes), explainCell(row));
    body.append(tr);
  }
  const foot = $('tfoot', table);
  const tr = document.createElement('tr');
  const [human, exact] = bytesCells(total);
  exact.id = totalId;
  tr.append(cell(totalLabel), human, exact, cell(''));
  foot.replaceChildren(tr);
}

// A formula cell: the core's formula (inputs substituted) as a one-line summary that expands,
// with the result it gives beneath. A <details>, so it opens with the keyboard too.
function explainCell(row, where = '') {
  const td = document.createElement('td');
  td.className = 'formula';
  if (!row.formula) return td;
  td.append(explainDetails(row.formula, [
    `${categoryLabel(row)}${where ? ` ${where}` : ''} = ${row.formula}`,
    ` = ${formatExactBytes(row.bytes)} (${formatBytes(row.bytes)})`,
  ]));
  return td;
}

function explainDetails(summaryContent, bodyContent) {
  const details = document.createElement('details');
  details.className = 'explain';
  details.open = state.explainAll;
  const summary = document.createElement('summary');
  summary.append(summaryContent);
  const body = document.createElement('div');
  body.className = 'explain-body';
  body.append(...bodyContent);
  details.append(summary, body);
  return details;
}

// What a snapshot (a phase's peak) holds, category by category, each with its formula.
function snapshotList(snapshot) {
  const list = document.createElement('ul');
  list.append(...snapshot.byCategory.map((row) => {
    const li = document.createElement('li');
    li.dataset.category = row.category;
    const bytes = document.createElement('strong');
    bytes.textContent = formatBytes(row.bytes);
    bytes.title = bytesTitle(row.bytes);
    const op = document.createElement('span');
    op.className = 'op';
    op.textContent = ` = ${row.formula}`;
    li.append(`${categoryLabel(row)}: `, bytes, op);
    return li;
  }));
  return list;
}

// The sentence naming the largest category at the peak, with its formula and the core's reason
// (estimate.peakDominant: category, bytes, share and reason, all from the core); the sizes are
// written here in the chosen units.
function showDominant(est) {
  const peak = est.peak;
  const el = $('#dominant');
  const dominant = est.peakDominant;
  const top = dominant ? peak.byCategory.find((r) => r.category === dominant.category) : null;
  if (!top || !(peak.totalBytes > 0)) {
    el.replaceChildren();
    delete el.dataset.category;
    return;
  }
  const share = dominant.sharePercent;
  const pct = share >= 99.5 && top.bytes < peak.totalBytes ? '>99' : share < 1 ? '<1' : String(Math.round(share));
  el.dataset.category = top.category;
  const name = document.createElement('strong');
  name.textContent = categoryLabel(top);
  const formula = document.createElement('span');
  formula.className = 'formula-inline';
  formula.textContent = top.formula;
  const size = document.createElement('span');
  size.textContent = `${formatBytes(top.bytes)} of ${formatBytes(peak.totalBytes)}`;
  size.title = `${formatExactBytes(top.bytes)} of ${formatExactBytes(peak.totalBytes)}`;
  el.replaceChildren('Largest at the peak: ', name, ` — ${pct} % of it (`, size, '). ', formula);
  if (dominant.reason) {
    const reason = document.createElement('span');
    reason.className = 'why';
    reason.textContent = `Why: ${dominant.reason}.`;
    el.append(document.createElement('br'), reason);
  }
  el.title = String(est.peakExplanation ?? '');
}

// A listed GPU's capacity is written in GiB whatever the units: its name says "80 GB" for 80 GiB
// (vendors' GB are binary), and "85.90 GB headroom on an 80 GB GPU" read as a contradiction.
function capacityWords(bytes) {
  const listed = Boolean(state.lastGoodSetup?.gpu?.id);
  return listed ? formatBytes(bytes, 'GiB') : formatBytes(bytes);
}

export function gpuCaption(gpuId, est) {
  const gpu = gpuById(gpuId);
  return gpu ? gpu.label : `custom ${formatBytes(est.gpu.capacityBytes)}`;
}

export function render(est) {
  const peak = est.peak;
  const gpu = est.gpu;
  const heuristic = Boolean(est.activationsFromHeuristic);

  const total = $('#peak-total');
  total.textContent = formatBytes(peak.totalBytes);
  total.dataset.bytes = String(peak.totalBytes);
  total.title = bytesTitle(peak.totalBytes);
  $('#peak-exact').textContent = `${formatExactBytes(peak.totalBytes)} · ${formatBytesOther(peak.totalBytes)}`;
  // The headline is the tensors' peak; what decides the verdict is the device figure beside it.
  const onDevice = $('#peak-device');
  onDevice.hidden = !est.device;
  if (est.device) {
    onDevice.textContent = `${formatBytes(est.device.peakDeviceBytes)} on the device (nvidia-smi): with the allocator's cache, the workspaces and the CUDA context`;
    onDevice.dataset.bytes = String(est.device.peakDeviceBytes);
  }
  const stepText = peak.step > 0 ? ` of step ${peak.step}` : '';
  $('#peak-where').textContent = `During ${phaseLabel(peak.phase)}${stepText}, at event #${peak.eventIndex}: ${peak.label}`;
  $('#peak-where').dataset.phase = peak.phase;
  $('#heuristic-note').hidden = !heuristic;

  // The verdict is the core's device figure: the step through PyTorch's caching allocator at
  // the GPU's capacity, plus the CUDA context (est.device; docs/schema.md).
  const device = est.device;
  const verdict = $('#verdict');
  verdict.dataset.fits = String(Boolean(gpu.fits));
  verdict.dataset.verdict = device.verdict;
  verdict.dataset.headroomBytes = String(gpu.headroomBytes);
  verdict.dataset.deviceBytes = String(device.peakDeviceBytes);
  const headline = document.createElement('span');
  headline.className = 'big';
  headline.textContent = device.verdict === 'tight' ? 'Fits, tight' : gpu.fits ? 'Fits' : 'Does not fit';
  const sub = document.createElement('span');
  sub.className = 'sub';
  sub.id = 'verdict-amount';
  sub.textContent = gpu.fits
    ? `${formatBytes(gpu.headroomBytes)} headroom of ${capacityWords(gpu.capacityBytes)}`
    : `${formatBytes(Math.abs(gpu.headroomBytes))} short of ${capacityWords(gpu.capacityBytes)}`;
  sub.title = `${formatExactBytes(gpu.headroomBytes)} headroom (capacity ${formatExactBytes(gpu.capacityBytes)})`;
  const name = document.createElement('span');
  name.className = 'gpu-name';
  name.textContent = gpuCaption(state.lastGoodSetup?.gpu?.id, est);
  const why = document.createElement('span');
  why.className = 'sub verdict-why';
  why.id = 'verdict-why';
  // The one-line why, worded here from the core's figures so that the page's units apply.
  const oom = device.oom;
  why.textContent = oom
    ? `At ${formatBytes(device.capacityBytes)}, a ${formatBytes(oom.requestedBytes)} request found no free block of that size: `
      + `${formatBytes(oom.freeBytes)} was free in ${formatInteger(oom.freeFragments)} fragments, the largest ${formatBytes(oom.largestFreeBlockBytes)}.`
    : device.tight
      ? `Tight: only ${formatBytes(device.headroomBytes)} left, under 5 % of the GPU or ${formatBytes(2 ** 30)}; another process or a longer sample can tip it over.`
      : `${formatBytes(device.peakDeviceBytes)} on the device, ${formatBytes(device.headroomBytes)} to spare.`;
  why.title = device.why;
  verdict.replaceChildren(headline, sub, name, why);
  showPinnedVerdict(est, headline.textContent);

  // Breakdown at the peak.
  const segments = peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  const legend = $('#capacity-legend');
  legend.replaceChildren(...segments.filter((s) => s.bytes > 0).map((s) => {
    const li = document.createElement('li');
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${s.colorIndex}`;
    li.append(swatch, `${s.label} ${formatBytes(s.bytes)}`);
    li.title = bytesTitle(s.bytes);
    return li;
  }));
  showDominant(est);
  renderDevice(est);
  renderHost(est);
  fillBytesTable($('#peak-table'), peak.byCategory, peak.totalBytes, 'Total at the peak', 'peak-table-total', heuristic);

  // Model states.
  const states = est.modelStates;
  const count = $('#param-count');
  count.textContent = formatInteger(states.parameterCount);
  count.dataset.count = String(states.parameterCount);
  showParameterSource(states, state.lastContext ?? {});
  fillBytesTable($('#states-table'), states.rows, states.totalBytes, 'Model states', 'states-total', false);

  // What forward leaves for backward.
  const fe = est.forwardEnd;
  if (fe) {
    const feStep = fe.step > 0 ? ` of step ${fe.step}` : '';
    $('#forward-where').textContent = `At the end of ${phaseLabel(fe.phase)}${feStep} (event #${fe.eventIndex}: ${fe.label}), before backward starts. Everything here stays until backward frees it.`;
    fillBytesTable($('#forward-table'), fe.byCategory, fe.totalBytes, 'Total when backward starts', 'forward-total', heuristic);
  }

  // Phase peaks.
  const phaseBody = $('#phase-table tbody');
  phaseBody.replaceChildren(...est.phasePeaks.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.phase = p.phase;
    const size = cell(formatBytes(p.totalBytes), 'num');
    size.title = bytesTitle(p.totalBytes);
    size.dataset.bytes = String(p.totalBytes);
    const bar = document.createElement('div');
    bar.className = 'phase-bar';
    const share = peak.totalBytes > 0 ? (p.totalBytes / peak.totalBytes) * 100 : 0;
    bar.style.width = `${Math.max(0, Math.min(100, share)).toFixed(1)}%`;
    const where = p.step > 0 ? `step ${p.step}: ${p.label}` : p.label;
    const whereCell = cell(explainDetails(where, [
      `${phaseLabel(p.phase)} peaks at ${formatBytes(p.totalBytes)} (${formatExactBytes(p.totalBytes)}), event #${p.eventIndex}. It holds:`,
      snapshotList(p),
    ]));
    tr.append(cell(phaseLabel(p.phase)), size, cell(bar, 'bar-cell'), whereCell);
    return tr;
  }));

  // Which category is live in which phase: bytes of each category at each phase's peak.
  fillPhaseMatrix(est.phasePeaks);

  // Notes.
  $('#notes').replaceChildren(...est.notes.map((text) => {
    const li = document.createElement('li');
    li.textContent = text;
    return li;
  }));

  fillLargestEvents(est.timeline, est.timelineEventCount);
  renderCompare();
  // Every measurement before any drawing: a read after a write lays the page out again, and a
  // 300-layer model's page took ~170 ms a layout on a 2-core machine (three of them, before).
  const widths = chartWidths();
  markScrollingTables();
  drawCharts(est, widths);
  if (state.embed) {
    const d = describeSetup(state.lastGoodSetup, state.lastGoodSetup, est);
    const model = document.createElement('strong');
    model.textContent = d.model;
    $('#embed-setup').replaceChildren(model, ` · batch ${d.shape} · ${d.precision} · ${d.optimizer}`);
  }
}

// Where the parameter count comes from, and for a preset the count its model card publishes.
function showParameterSource(states, context) {
  const source = $('#param-source');
  const published = $('#param-published');
  const family = state.options.families?.find((f) => f.id === context.family)?.label ?? context.family;
  if (context.kind === state.archKind) {
    source.textContent = `Counted by the core: the elements of every parameter tensor of the ${family} architecture, with Hugging Face's tensor names and shapes (a tied output head is counted once): ${states.parameterFormula}.`;
  } else if (context.kind === state.layersKind) {
    source.textContent = `Counted by the core from the layer list: in × out (+ out for a bias) per linear layer, rows × width per embedding: ${states.parameterFormula}.`;
  } else {
    source.textContent = 'As entered (model.parameterCount).';
  }
  const preset = context.kind === state.archKind ? presetById(context.presetId) : null;
  published.hidden = !preset;
  if (!preset) {
    published.replaceChildren();
    delete published.dataset.count;
    return;
  }
  published.dataset.count = String(preset.publishedParameters);
  // The core says how far the count is from the published one (modelStates.preset).
  const difference = states.preset?.id === preset.id ? states.preset.differenceFromPublished : null;
  const verdict = document.createElement('span');
  verdict.className = difference === 0 ? 'match' : 'differs';
  verdict.textContent = difference === 0 ? 'the count above matches it'
    : difference === null ? 'the architecture above is not exactly this preset'
      : `the count above differs by ${difference > 0 ? '+' : '−'}${formatInteger(Math.abs(difference))}`;
  published.replaceChildren(`Published: ${formatInteger(preset.publishedParameters)} (${preset.source}; counted as ${preset.countedAs}) — `, verdict, '.');
}

// The biggest single allocations of the run: a keyboard- and screen-reader-readable companion
// to the chart. Steps 1 and 2 repeat most events, so equal events of both steps share a row.
// A long run's timeline lists only each stretch's highest and lowest totals, which the note says.
function fillLargestEvents(timeline, eventCount) {
  const listed = timeline.length;
  const note = $('#largest-note');
  note.hidden = !(eventCount > listed);
  note.textContent = eventCount > listed
    ? `Among the ${formatInteger(listed)} of ${formatInteger(eventCount)} events the estimate lists (for long runs the core keeps each stretch's highest and lowest total); the CLI's --timeline prints every event.`
    : '';
  const rows = new Map();
  timeline.forEach((p, k) => {
    if (!(p.deltaBytes > 0)) return;
    const i = Number.isInteger(p.index) ? p.index : k;
    const key = `${p.phase}|${p.layer}|${p.label}|${p.deltaBytes}`;
    const row = rows.get(key);
    if (row) row.steps.push(p.step);
    else rows.set(key, { ...p, index: i, steps: [p.step] });
  });
  const largest = [...rows.values()].sort((a, b) => b.deltaBytes - a.deltaBytes || a.index - b.index).slice(0, LARGEST_EVENTS);
  $('#largest-events tbody').replaceChildren(...largest.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.event = String(p.index);
    const steps = p.steps.filter((s) => s > 0);
    const when = steps.length ? `${phaseLabel(p.phase)} · step${steps.length > 1 ? 's' : ''} ${steps.join(', ')}` : phaseLabel(p.phase);
    const swatch = document.createElement('span');
    swatch.className = `swatch cat-${categoryIndex(p.category)}`;
    swatch.title = categoryLabel({ category: p.category });
    swatch.setAttribute('role', 'img');
    swatch.setAttribute('aria-label', `${swatch.title}: `);
    const what = cell(p.label, 'label-cell');
    what.prepend(swatch);
    const size = cell(formatBytes(p.deltaBytes), 'num');
    size.title = bytesTitle(p.deltaBytes);
    size.dataset.bytes = String(p.deltaBytes);
    const total = cell(formatBytes(p.totalBytes), 'num');
    total.title = bytesTitle(p.totalBytes);
    tr.append(cell(`#${p.index}`, 'num'), cell(when), cell(p.layer >= 0 ? String(p.layer) : '—', 'num'), what, size, total);
    return tr;
  }));
}

function fillPhaseMatrix(phasePeaks) {
  const table = $('#phase-matrix');
  const head = document.createElement('tr');
  const corner = document.createElement('th');
  corner.scope = 'col';
  corner.textContent = 'Category';
  head.append(corner, ...phasePeaks.map((p) => {
    const th = document.createElement('th');
    th.scope = 'col';
    th.className = 'num';
    th.textContent = phaseLabel(p.phase);
    return th;
  }));
  $('thead', table).replaceChildren(head);
  const present = state.options.categories.filter((c) =>
    phasePeaks.some((p) => p.byCategory.some((row) => row.category === c.id)));
  $('tbody', table).replaceChildren(...present.map((c) => {
    const tr = document.createElement('tr');
    tr.dataset.category = c.id;
    tr.append(categoryCell({ category: c.id, label: c.label }, false), ...phasePeaks.map((p) => {
      const row = p.byCategory.find((r) => r.category === c.id);
      const td = cell(row ? formatBytes(row.bytes) : '—', 'num');
      td.dataset.phase = p.phase;
      td.dataset.bytes = String(row ? row.bytes : 0);
      if (row) td.title = `${formatExactBytes(row.bytes)} · ${formatBytesOther(row.bytes)}: ${row.formula}`;
      return td;
    }));
    return tr;
  }));
}

// What the device holds at its peak, from estimate.device (the core's caching-allocator
// simulation and device overheads, docs/device.md): the rows of what nvidia-smi shows, each with
// the core's formula, and one sentence on fragmentation where it matters.
function deviceRows(device) {
  const f = device.formulas ?? {};
  return [
    { part: 'reserved', label: 'Reserved by the caching allocator', bytes: device.peakReservedBytes, formula: f.peakReservedBytes },
    { part: 'cache', label: 'of which allocator cache (free blocks in its segments)', bytes: device.fragmentationBytes, formula: f.fragmentationBytes, sub: true },
    { part: 'workspaces', label: 'of which cuBLAS / cuBLASLt workspaces', bytes: device.workspaceBytes, formula: f.workspaceBytes, sub: true },
    { part: 'context', label: 'CUDA context and kernel images', bytes: device.contextBytes, formula: f.contextBytes },
    { part: 'communication', label: 'Communication buffers (NCCL)', bytes: device.communicationBytes, formula: f.communicationBytes },
    { part: 'unified', label: 'Paged optimizer states (CUDA unified memory, outside the allocator)', bytes: device.unifiedBytes ?? 0, formula: f.unifiedBytes },
  ];
}

// The device bar's parts, summing to peakDeviceBytes: the reserved bytes split into the tensors
// allocated at the reserved peak, the workspaces and the cache (reserved = allocated + cache,
// workspaces inside allocated), then the context and communication outside the allocator.
function deviceSegments(device) {
  const f = device.formulas ?? {};
  const tensors = device.peakReservedBytes - device.fragmentationBytes - device.workspaceBytes;
  return [
    { part: 'allocated', className: 'dev dev-allocated', label: 'Allocated tensors', bytes: tensors,
      formula: `reserved − cache − workspaces at the reserved peak = ${formatExactBytes(tensors)}` },
    { part: 'workspaces', className: 'dev dev-workspaces', label: 'cuBLAS workspaces', bytes: device.workspaceBytes, formula: f.workspaceBytes },
    { part: 'cache', className: 'dev dev-cache', label: 'Allocator cache', bytes: device.fragmentationBytes, formula: f.fragmentationBytes },
    { part: 'context', className: 'dev dev-context', label: 'CUDA context', bytes: device.contextBytes, formula: f.contextBytes },
    { part: 'communication', className: 'dev dev-communication', label: 'NCCL buffers', bytes: device.communicationBytes, formula: f.communicationBytes },
    { part: 'unified', className: 'dev dev-unified', label: 'Paged optimizer states', bytes: device.unifiedBytes ?? 0, formula: f.unifiedBytes },
  ];
}

function renderDevice(est) {
  const device = est.device;
  const card = $('#device');
  if (!device) {
    card.hidden = true;
    return;
  }
  card.hidden = false;
  const segments = deviceSegments(device);
  $('#device-legend').replaceChildren(...segments.filter((s) => s.bytes > 0).map((s) => {
    const li = document.createElement('li');
    li.dataset.part = s.part;
    const swatch = document.createElement('span');
    swatch.className = `swatch ${s.className.replace('dev ', '')}`;
    li.append(swatch, `${s.label} ${formatBytes(s.bytes)}`);
    li.title = bytesTitle(s.bytes);
    return li;
  }));
  const body = $('#device-table tbody');
  body.replaceChildren(...deviceRows(device).map((row) => {
    const tr = document.createElement('tr');
    tr.dataset.part = row.part;
    if (row.sub) tr.className = 'sub-row';
    const td = document.createElement('td');
    td.className = 'formula';
    if (row.formula) td.append(explainDetails(row.formula, [`${row.label} = ${row.formula}`]));
    tr.append(cell(row.label), ...bytesCells(row.bytes), td);
    return tr;
  }));
  const foot = document.createElement('tr');
  const [human, exact] = bytesCells(device.peakDeviceBytes);
  exact.id = 'device-total';
  const formula = document.createElement('td');
  formula.className = 'formula';
  if (device.formulas?.peakDeviceBytes) formula.append(explainDetails(device.formulas.peakDeviceBytes, [`What nvidia-smi shows at the peak = ${device.formulas.peakDeviceBytes}`]));
  foot.append(cell('On the device at its peak (nvidia-smi)'), human, exact, formula);
  $('#device-table tfoot').replaceChildren(foot);
  // Fragmentation gets its sentence when it matters: a tenth or more of what is reserved sits in
  // cached free blocks, or the step fails with enough free memory in total.
  const note = $('#fragmentation-note');
  const share = device.peakReservedBytes > 0 ? device.fragmentationBytes / device.peakReservedBytes : 0;
  const oom = device.oom;
  const fragmentationDecided = oom && oom.freeBytes >= oom.requestedBytes;
  const matters = share >= 0.1 || fragmentationDecided;
  note.hidden = !matters;
  note.textContent = matters ? device.fragmentationExplanation : '';
  const oomNote = $('#oom-note');
  oomNote.hidden = !oom;
  oomNote.textContent = oom
    ? `Out of memory at event #${oom.eventIndex} (${oom.label}): ${oom.explanation}. ${device.numAllocRetries > 0 ? 'PyTorch would first free its cached segments and retry, as simulated; it still fails. ' : ''}`
      + 'torch.cuda.OutOfMemoryError would be raised there.'
    : '';
}

// The boxes' widths the charts are drawn to, read together (one layout).
export function chartWidths() {
  return {
    bar: $('#capacity-bar').clientWidth,
    device: $('#device-bar').clientWidth,
    timeline: $('#timeline-chart').clientWidth,
  };
}

export function drawCharts(est, widths = chartWidths()) {
  const barBox = $('#capacity-bar');
  const segments = est.peak.byCategory.map((row) => ({ label: categoryLabel(row), bytes: row.bytes, colorIndex: categoryIndex(row.category) }));
  barBox.replaceChildren(capacityBar(segments, est.gpu.capacityBytes, {
    width: Math.max(widths.bar, 280), peakLabel: `peak ${formatBytes(est.peak.totalBytes)}`,
  }));
  const deviceBox = $('#device-bar');
  if (est.device) {
    const device = est.device;
    deviceBox.replaceChildren(capacityBar(deviceSegments(device), device.capacityBytes, {
      width: Math.max(widths.device, 280),
      peakLabel: `device peak ${formatBytes(device.peakDeviceBytes)}`,
      ariaLabel: `On the device at the peak, ${formatBytes(device.peakDeviceBytes)}: allocated tensors, cuBLAS workspaces, allocator cache and CUDA context, against a GPU of ${formatBytes(device.capacityBytes)}`,
    }));
  }
  const chartBox = $('#timeline-chart');
  const width = Math.max(widths.timeline, 280);
  state.chartWidth = widths.timeline;
  // A person stepping through the chart with the keyboard keeps the focus across a redraw.
  const hadFocus = chartBox.contains(document.activeElement);
  chartBox.replaceChildren(timelineChart(est.timeline, {
    eventCount: est.timelineEventCount, peak: est.peak, phasePeaks: est.phasePeaks, forwardEnd: est.forwardEnd,
    phaseLabel, capacityBytes: est.gpu.capacityBytes,
    width, height: width < 500 ? 220 : 270,
  }));
  if (hadFocus) $('svg', chartBox)?.focus();
  scheduleSegments(est, width);
  drawCompareChart();
}

// Under the timeline: the caching allocator's segments at the reserved peak, as memory_viz
// draws them (estimate.device.segments, present with the labelled timeline the page asks for).
// Drawn when the page is next idle, after the frame that shows the answer: a big model's
// picture is thousands of SVG blocks (a 300-layer model: 146 segments, 2,745 elements, half of
// the first answer's layout), and it sits below the timeline, out of the first screen. Until
// then the box keeps the last picture, marked data-pending; a newer estimate replaces the
// drawing still to come.
function scheduleSegments(est, width) {
  let box = $('#segments-chart');
  if (!box) {
    box = document.createElement('div');
    box.id = 'segments-chart';
    $('#timeline-chart').after(box);
  }
  cancelIdle(state.segmentsIdle);
  box.dataset.pending = 'true';
  state.segmentsIdle = whenIdle(() => drawSegments(box, est, width));
}

// requestIdleCallback where the browser has it (it runs after the frame, once the tasks queued
// before it are done), else a timer; either way within SEGMENTS_LATEST_MS.
const SEGMENTS_LATEST_MS = 300;
function whenIdle(callback) {
  if (typeof requestIdleCallback === 'function') return { idle: requestIdleCallback(callback, { timeout: SEGMENTS_LATEST_MS }) };
  return { timer: setTimeout(callback, 50) };
}
function cancelIdle(handle) {
  if (handle?.idle !== undefined) cancelIdleCallback(handle.idle);
  if (handle?.timer !== undefined) clearTimeout(handle.timer);
}

function drawSegments(box, est, width) {
  const picture = est.device?.segments;
  box.hidden = !picture;
  box.replaceChildren(...(picture ? [segmentsChart(picture, { width })] : []));
  delete box.dataset.pending;
}

// On a phone the results come after the form: a bar fixed at the bottom of the screen keeps the
// answer in view while the form scrolls (the peak, the verdict, the GPU); it jumps to the results.
function showPinnedVerdict(est, headline) {
  const bar = $('#pinned-verdict');
  const device = est.device;
  bar.dataset.verdict = device?.verdict ?? (est.gpu.fits ? 'fits' : 'doesNotFit');
  bar.dataset.fits = String(Boolean(est.gpu.fits));
  $('#pinned-verdict-text').textContent = `${headline} · ${formatBytes(device?.peakDeviceBytes ?? est.peak.totalBytes)} on the device, GPU ${formatBytes(est.gpu.capacityBytes)}`;
  bar.hidden = false;
}

// A table wider than its box says so (a note and an edge shadow): on a phone the columns that
// do not fit scroll sideways instead of running off the page unseen.
export function markScrollingTables() {
  // Every table measured before any is marked (one layout, not one per table).
  const wraps = $$('.table-wrap').map((wrap) => [wrap, wrap.scrollWidth > wrap.clientWidth + 1]);
  for (const [wrap, scrolls] of wraps) {
    wrap.dataset.scrolls = String(scrolls);
    if (scrolls && !wrap.hasAttribute('tabindex')) {
      // A scrolling region is reachable from the keyboard (arrow keys scroll it).
      const heading = document.getElementById(wrap.querySelector('table')?.getAttribute('aria-labelledby') ?? '');
      wrap.tabIndex = 0;
      wrap.setAttribute('role', 'region');
      wrap.setAttribute('aria-label', `${heading?.textContent ?? 'Table'}, scrolls sideways`);
    }
  }
}
