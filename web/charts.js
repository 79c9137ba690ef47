// SVG charts and number formatting for the gpumem page.
//
// Everything here draws or formats numbers the core computed; nothing here derives a memory
// figure. Charts are built with DOM calls (never innerHTML) so labels from the core are text.

const SVG_NS = 'http://www.w3.org/2000/svg';

// The page's unit for byte figures: 'GiB' (binary, 2^30, what nvidia-smi and PyTorch report) or
// 'GB' (decimal, 10^9, how model sizes and some data sheets are quoted). Exact byte counts stay
// in titles and tooltips whatever the choice.
const UNIT_SYSTEMS = {
  GiB: { base: 1024, names: ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'] },
  GB: { base: 1000, names: ['B', 'kB', 'MB', 'GB', 'TB', 'PB', 'EB'] },
};
let byteUnits = 'GiB';

export function setByteUnits(units) {
  byteUnits = units === 'GB' ? 'GB' : 'GiB';
  return byteUnits;
}

export function getByteUnits() {
  return byteUnits;
}

// A byte count for people in the chosen unit system (or `units`), 3–4 significant digits.
// Anything that is not a finite number shows as a dash, so NaN never reaches the page.
export function formatBytes(bytes, units = byteUnits) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes)) return '—';
  const system = UNIT_SYSTEMS[units] ?? UNIT_SYSTEMS.GiB;
  const sign = bytes < 0 ? '−' : '';
  let v = Math.abs(bytes);
  let u = 0;
  while (v >= system.base && u < system.names.length - 1) { v /= system.base; u++; }
  if (u === 0) return `${sign}${v} B`;
  const digits = v >= 100 ? 1 : 2;
  return `${sign}${v.toFixed(digits)} ${system.names[u]}`;
}

// The same count in the unit system not chosen, for titles ("80.00 GiB" ↔ "85.90 GB").
export function formatBytesOther(bytes) {
  return formatBytes(bytes, byteUnits === 'GB' ? 'GiB' : 'GB');
}

// Exact bytes and the other unit, the tooltip of every byte figure.
export function bytesTitle(bytes) {
  return `${formatExactBytes(bytes)} · ${formatBytesOther(bytes)}`;
}

// The same count in decimal gigabytes, which is how model sizes are usually quoted.
export function formatGB(bytes) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes)) return '—';
  const v = bytes / 1e9;
  const digits = Math.abs(v) >= 100 ? 1 : Math.abs(v) >= 1 ? 2 : 3;
  return `${v < 0 ? '−' : ''}${Math.abs(v).toFixed(digits)} GB`;
}

// Exact whole number with thousands separators: "24,000,000,000 B".
export function formatExactBytes(bytes) {
  return `${formatInteger(bytes)} B`;
}

// One formatter for every call: toLocaleString with options builds a new Intl.NumberFormat each
// time, 0.3 s of the page's start on a 5,000-layer list (Chromium's profiler). Same text.
const INTEGER_FORMAT = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
export function formatInteger(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  return INTEGER_FORMAT.format(n);
}

// Builds one SVG element with attributes and children (elements or strings).
export function svgEl(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null && v !== false) el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === 'string' ? document.createTextNode(c) : c);
  }
  return el;
}

function titleEl(text) {
  return svgEl('title', {}, text);
}

// Axis ticks at 1, 2 or 5 × a power of the chosen unit's base (1024 or 1000), so labels read
// as round numbers of that unit.
function niceTicks(maxBytes, count = 4) {
  if (!(maxBytes > 0)) return [0];
  const raw = maxBytes / count;
  const base = UNIT_SYSTEMS[byteUnits].base;
  let unit = 1;
  while (unit * base <= raw) unit *= base;
  const candidates = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].map((m) => m * unit);
  const step = candidates.find((c) => c >= raw) ?? raw;
  const ticks = [];
  for (let t = 0; t <= maxBytes * 1.0001; t += step) ticks.push(t);
  return ticks;
}

// A horizontal stacked bar of the categories live at the peak, drawn against the GPU capacity.
// segments: [{label, bytes, colorIndex, className?, part?, formula?}]; the capacity is marked
// with a line. The device bar passes its parts (allocated, cache, workspaces, context) with
// their own classes.
export function capacityBar(segments, capacityBytes, { width = 640, peakLabel = '', ariaLabel = '' } = {}) {
  const total = segments.reduce((sum, s) => sum + Math.max(0, s.bytes), 0);
  const scaleMax = Math.max(total, capacityBytes, 1);
  const height = 64;
  const barTop = 22;
  const barHeight = 26;
  const x = (b) => (b / scaleMax) * (width - 2) + 1;
  const svg = svgEl('svg', {
    class: 'chart capacity-bar', viewBox: `0 0 ${width} ${height}`, width: '100%', height,
    role: 'img', 'aria-label': ariaLabel || `Memory at the peak, ${formatBytes(total)}, against a GPU of ${formatBytes(capacityBytes)}`,
  });
  svg.append(svgEl('rect', { class: 'bar-track', x: 1, y: barTop, width: width - 2, height: barHeight, rx: 3 }));
  let at = 0;
  for (const s of segments) {
    if (!(s.bytes > 0)) continue;
    const w = x(at + s.bytes) - x(at);
    svg.append(svgEl('rect', {
      class: s.className ?? `cat cat-${s.colorIndex}`, x: x(at), y: barTop, width: Math.max(w, 0.5), height: barHeight,
      'data-part': s.part,
    }, titleEl(`${s.label}: ${formatBytes(s.bytes)} (${formatExactBytes(s.bytes)})${s.formula ? `\n${s.formula}` : ''}`)));
    at += s.bytes;
  }
  const cx = x(capacityBytes);
  const capText = `GPU ${formatBytes(capacityBytes)}`;
  const anchorCap = cx > width * 0.7 ? 'end' : 'start';
  svg.append(
    svgEl('line', { class: 'capacity-line', x1: cx, x2: cx, y1: 14, y2: barTop + barHeight + 6 }),
    svgEl('text', { class: 'chart-label', x: anchorCap === 'end' ? cx - 4 : cx + 4, y: 12, 'text-anchor': anchorCap }, capText),
  );
  const px = x(total);
  const anchorPeak = px > width * 0.6 ? 'end' : 'start';
  svg.append(svgEl('text', {
    class: 'chart-label strong', x: anchorPeak === 'end' ? px - 2 : px + 2, y: barTop + barHeight + 14, 'text-anchor': anchorPeak,
  }, peakLabel || `peak ${formatBytes(total)}`));
  return svg;
}

// Two (or more) stacked bars on one scale, each against its own GPU capacity: the comparison of a
// pinned setup A with the live setup B.
//   bars: [{name, caption, segments: [{label, bytes, colorIndex}], capacityBytes, peakLabel}]
export function comparisonBars(bars, { width = 640 } = {}) {
  const left = 34;
  const right = 10;
  const rowHeight = 60;
  const top = 4;
  const barHeight = 22;
  const height = top + bars.length * rowHeight;
  const totals = bars.map((b) => b.segments.reduce((sum, s) => sum + Math.max(0, s.bytes), 0));
  const scaleMax = Math.max(1, ...totals, ...bars.map((b) => b.capacityBytes || 0));
  const innerW = Math.max(width - left - right, 40);
  const x = (b) => left + (b / scaleMax) * innerW;
  const summary = bars.map((b, i) => `${b.name}: peak ${formatBytes(totals[i])} against ${formatBytes(b.capacityBytes)}`).join('; ');
  const svg = svgEl('svg', {
    class: 'chart comparison-bars', viewBox: `0 0 ${width} ${height}`, width: '100%', height,
    role: 'img', 'aria-label': `Peak memory compared: ${summary}`,
  });
  bars.forEach((bar, i) => {
    const y0 = top + i * rowHeight;
    const barTop = y0 + 14;
    const g = svgEl('g', { class: 'comparison-bar', 'data-bar': bar.name });
    g.append(
      svgEl('text', { class: 'chart-label strong', x: 4, y: barTop + barHeight / 2 + 4 }, bar.name),
      svgEl('rect', { class: 'bar-track', x: left, y: barTop, width: innerW, height: barHeight, rx: 3 }),
    );
    let at = 0;
    for (const s of bar.segments) {
      if (!(s.bytes > 0)) continue;
      const w = x(at + s.bytes) - x(at);
      g.append(svgEl('rect', {
        class: `cat cat-${s.colorIndex}`, x: x(at), y: barTop, width: Math.max(w, 0.5), height: barHeight,
      }, titleEl(`${bar.name} · ${s.label}: ${formatBytes(s.bytes)} (${formatExactBytes(s.bytes)})`)));
      at += s.bytes;
    }
    const cx = x(bar.capacityBytes);
    const capAnchor = cx > left + innerW * 0.7 ? 'end' : 'start';
    // The GPU's name follows its size where there is room for it (about 6 px a character).
    const room = capAnchor === 'end' ? cx - 4 : width - cx - 4;
    const withName = `GPU ${formatBytes(bar.capacityBytes)}${bar.caption ? ` · ${bar.caption}` : ''}`;
    const capText = withName.length * 6 <= room ? withName : `GPU ${formatBytes(bar.capacityBytes)}`;
    g.append(
      svgEl('line', { class: 'capacity-line', x1: cx, x2: cx, y1: barTop - 4, y2: barTop + barHeight + 4 }),
      svgEl('text', { class: 'chart-label', x: capAnchor === 'end' ? cx - 4 : cx + 4, y: barTop - 4, 'text-anchor': capAnchor }, capText),
    );
    const px = x(totals[i]);
    const peakAnchor = px > left + innerW * 0.6 ? 'end' : 'start';
    g.append(svgEl('text', {
      class: 'chart-label strong', x: peakAnchor === 'end' ? px - 2 : px + 2, y: barTop + barHeight + 13, 'text-anchor': peakAnchor,
    }, bar.peakLabel || `peak ${formatBytes(totals[i])}`));
    svg.append(g);
  });
  return svg;
}

// ---------- the timeline ----------
//
// The estimate lists every event up to a limit; beyond it, only each short run's highest and
// lowest totals, each with its `index` in the full run (`timelineEventCount` events). So the x
// axis is the full event index, and a listed event's total holds until the next listed event.

// Groups the listed events by pixel column (consecutive events whose index falls in the same
// column), keeping each column's largest total (so no spike disappears).
//   idx(k): event index of list entry k; count: events in the full run.
function pixelColumns(timeline, columns, idx, count) {
  const out = [];
  for (let k = 0; k < timeline.length; k++) {
    const col = Math.floor((idx(k) / count) * columns);
    const last = out[out.length - 1];
    if (last && last.col === col) {
      last.k1 = k + 1;
      if (timeline[k].totalBytes > timeline[last.rep].totalBytes) last.rep = k;
    } else {
      out.push({ col, k0: k, k1: k + 1, rep: k });
    }
  }
  return out;
}

// Runs of consecutive entries of one phase and step: init, then forward, backward and optimizer
// step of step 1 and of step 2. start/end are list positions.
function phaseBands(timeline) {
  const bands = [];
  timeline.forEach((p, k) => {
    const last = bands[bands.length - 1];
    if (last && last.phase === p.phase && last.step === p.step) last.end = k + 1;
    else bands.push({ phase: p.phase, step: p.step, start: k, end: k + 1 });
  });
  return bands;
}

// Where each block (layer ≥ 0) starts inside a band, as list positions. Entries of no block
// (-1: embeddings, head, loss) in between do not start the same block again.
function blockStarts(timeline, band) {
  const out = [];
  let last = -1;
  for (let k = band.start; k < band.end; k++) {
    const layer = timeline[k].layer;
    if (layer >= 0 && layer !== last) {
      out.push({ k, layer });
      last = layer;
    }
  }
  return out;
}

// The last list position whose value is ≤ target, for a list sorted ascending by value(k).
function lastAtOrBefore(length, value, target) {
  let lo = 0;
  let hi = length - 1;
  if (hi < 0 || value(0) > target) return 0;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (value(mid) <= target) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

const LABEL_STRIDES = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 250, 500, 1000];

function truncate(text, maxChars) {
  if (text.length <= maxChars) return text;
  return maxChars > 1 ? `${text.slice(0, maxChars - 1)}…` : '';
}

// Memory after each event of the simulated run, drawn for thousands of events: the running total
// as one path (per pixel column, the column's largest total), phases shaded and labelled, blocks
// ticked along forward and backward where there is room, the peak marked with its event.
// Pointer hover and the keyboard (the chart is a slider over event indices: ← → jump between
// phase starts and peaks, Shift+← → move one column, Home/End) show an event in the readout.
//   timeline: estimate.timeline; eventCount: estimate.timelineEventCount; peak, phasePeaks,
//   forwardEnd: the estimate's snapshots; phaseLabel(id) → text; capacityBytes: drawn as a
//   dashed line when within the chart's range.
// Returns a <div> holding the SVG and its readout line.
export function timelineChart(timeline, {
  eventCount, peak, phasePeaks = [], forwardEnd, phaseLabel = (id) => id, capacityBytes = 0, width = 640, height = 260,
} = {}) {
  const margin = { top: 28, right: 12, bottom: 42, left: 62 };
  const innerW = Math.max(width - margin.left - margin.right, 40);
  const innerH = height - margin.top - margin.bottom;
  const bottom = margin.top + innerH;
  const n = timeline.length;
  const idx = (k) => (Number.isInteger(timeline[k].index) ? timeline[k].index : k);
  const count = Math.max(Number.isInteger(eventCount) ? eventCount : 0, n ? idx(n - 1) + 1 : 0);
  const until = (k) => (k + 1 < n ? idx(k + 1) : count);  // the event index where entry k's total ends
  const peakBytes = peak && Number.isFinite(peak.totalBytes) ? peak.totalBytes : 0;
  let maxY = Math.max(peakBytes, 1);
  for (const p of timeline) if (p.totalBytes > maxY) maxY = p.totalBytes;
  // The caching allocator's reserved bytes after each event (estimate.timeline[].reservedBytes,
  // the core's simulation of PyTorch's CUDACachingAllocator): drawn beside the allocated total.
  const reservedOf = (k) => (Number.isFinite(timeline[k].reservedBytes) ? timeline[k].reservedBytes : 0);
  const hasReserved = timeline.some((p) => Number.isFinite(p.reservedBytes) && p.reservedBytes > 0);
  if (hasReserved) for (const p of timeline) if (p.reservedBytes > maxY) maxY = p.reservedBytes;
  const showCapacity = capacityBytes > 0 && capacityBytes <= maxY * 1.3;
  const yMax = (showCapacity ? Math.max(maxY, capacityBytes) : maxY) * 1.08;
  const sx = (i) => margin.left + (count ? (i / count) * innerW : 0);
  const sy = (b) => margin.top + innerH - (b / yMax) * innerH;
  const bandText = (b) => (b.step > 0 ? `${phaseLabel(b.phase)} · step ${b.step}` : phaseLabel(b.phase));

  const figure = document.createElement('div');
  figure.className = 'timeline-figure';
  // The results are a live region; hover readouts inside it must not be read out on every move.
  figure.setAttribute('aria-live', 'off');
  const svg = svgEl('svg', {
    class: 'chart timeline', viewBox: `0 0 ${width} ${height}`, width: '100%', height, tabindex: n ? 0 : undefined,
  });
  const readout = document.createElement('p');
  readout.className = 'chart-readout';
  figure.append(svg, readout);
  if (hasReserved) {
    const key = document.createElement('ul');
    key.className = 'legend timeline-key';
    const item = (cls, text) => {
      const li = document.createElement('li');
      const swatch = document.createElement('span');
      swatch.className = `swatch ${cls}`;
      li.append(swatch, text);
      return li;
    };
    key.append(item('key-allocated', 'allocated (live tensors)'), item('key-reserved', 'reserved by the caching allocator'));
    figure.insertBefore(key, readout);
  }

  // Phase bands, labelled where the label fits; the <title> names every band.
  const bands = phaseBands(timeline);
  const phaseIds = [...new Set(bands.map((b) => b.phase))];
  for (const b of bands) {
    const x0 = sx(idx(b.start));
    const w = sx(until(b.end - 1)) - x0;
    const text = bandText(b);
    const g = svgEl('g', { class: `band phase-${phaseIds.indexOf(b.phase) % 4}`, 'data-phase': b.phase, 'data-step': b.step },
      svgEl('rect', { x: x0, y: margin.top, width: Math.max(w, 0.5), height: innerH }, titleEl(text)));
    const short = phaseLabel(b.phase);
    const initial = `${short.slice(0, 1)}${b.step > 0 ? b.step : ''}`;
    const label = w > text.length * 6.2 ? text : w > short.length * 6.2 ? short : w > initial.length * 7 + 4 ? initial : '';
    if (label) g.append(svgEl('text', { class: 'band-label', x: x0 + w / 2, y: margin.top - 8, 'text-anchor': 'middle' }, label));
    svg.append(g);
  }

  // Block ticks along forward and backward: a tick per block where blocks are at least 3 px
  // apart, a number every `stride` blocks so that numbers do not collide.
  let ticked = false;
  const ticks = svgEl('g', { class: 'layer-ticks' });
  // The right edge of the last number drawn: where a backward band starts right after a forward
  // one (… 14 15 | 15 14 …) the numbers would otherwise touch ("1515").
  let lastLabelRight = -Infinity;
  for (const b of bands) {
    if (b.phase !== 'forward' && b.phase !== 'backward') continue;
    const starts = blockStarts(timeline, b);
    if (!starts.length) continue;
    const spacing = (sx(until(b.end - 1)) - sx(idx(b.start))) / starts.length;
    if (spacing < 3) continue;
    const widest = String(Math.max(...starts.map((s) => s.layer))).length * 6 + 6;
    const stride = LABEL_STRIDES.find((k) => k * spacing >= widest);
    for (const s of starts) {
      const x = sx(idx(s.k));
      ticks.append(svgEl('line', { class: 'layer-tick', x1: x, x2: x, y1: bottom, y2: bottom + 4 }));
      const half = String(s.layer).length * 3 + 1;
      if (stride && s.layer % stride === 0 && x - half > lastLabelRight + 3) {
        ticks.append(svgEl('text', { class: 'layer-label', x, y: bottom + 13, 'text-anchor': 'middle' }, String(s.layer)));
        lastLabelRight = x + half;
      }
    }
    ticked = true;
  }

  // Y axis with binary-unit ticks.
  for (const t of niceTicks(yMax / 1.08)) {
    const y = sy(t);
    svg.append(
      svgEl('line', { class: 'grid', x1: margin.left, x2: margin.left + innerW, y1: y, y2: y }),
      svgEl('text', { class: 'axis-label', x: margin.left - 6, y: y + 4, 'text-anchor': 'end' }, formatBytes(t)),
    );
  }
  svg.append(ticks, svgEl('text', { class: 'axis-label', x: margin.left + innerW / 2, y: height - 6, 'text-anchor': 'middle' },
    `event index (0 … ${Math.max(count - 1, 0)})${ticked ? ' · numbers above: block (layer)' : ''}`));

  if (showCapacity) {
    const y = sy(capacityBytes);
    svg.append(
      svgEl('line', { class: 'capacity-line', x1: margin.left, x2: margin.left + innerW, y1: y, y2: y }),
      svgEl('text', { class: 'chart-label', x: margin.left + innerW - 4, y: y - 4, 'text-anchor': 'end' }, `GPU ${formatBytes(capacityBytes)}`),
    );
  }

  // The running total as a step line over pixel columns; a column shows its largest total.
  const columns = pixelColumns(timeline, Math.max(50, Math.floor(innerW)), idx, count || 1);
  let d = '';
  columns.forEach((c, j) => {
    const y = sy(timeline[c.rep].totalBytes).toFixed(2);
    d += j === 0 ? `M${sx(idx(c.k0)).toFixed(2)},${sy(0).toFixed(2)}V${y}` : `V${y}`;
    d += `H${sx(until(c.k1 - 1)).toFixed(2)}`;
  });
  if (d) svg.append(svgEl('path', { class: 'area', d: `${d}V${sy(0).toFixed(2)}Z` }), svgEl('path', { class: 'line', d }));
  // Reserved, per column its largest value, as a second step line over the same columns.
  if (hasReserved) {
    let r = '';
    columns.forEach((c, j) => {
      let most = 0;
      for (let k = c.k0; k < c.k1; k++) most = Math.max(most, reservedOf(k));
      const y = sy(most).toFixed(2);
      r += j === 0 ? `M${sx(idx(c.k0)).toFixed(2)},${y}` : `V${y}`;
      r += `H${sx(until(c.k1 - 1)).toFixed(2)}`;
    });
    svg.append(svgEl('path', { class: 'reserved-line', d: r }, titleEl('Reserved by the caching allocator (segments obtained with cudaMalloc)')));
  }

  const validIndex = (i) => Number.isInteger(i) && i >= 0 && i < count;
  const positionOf = (eventIndex) => lastAtOrBefore(n, idx, eventIndex);
  const at = (k) => ({ x: sx(idx(k) + 0.5), y: sy(timeline[k].totalBytes) });

  // Each phase's own peak, small; the overall peak, large and labelled with its event.
  for (const p of phasePeaks) {
    if (!validIndex(p.eventIndex) || p.eventIndex === peak?.eventIndex) continue;
    const x = sx(p.eventIndex + 0.5);
    svg.append(svgEl('g', { class: 'phase-peak', 'data-phase': p.phase },
      svgEl('circle', { cx: x, cy: sy(p.totalBytes), r: 3 }, titleEl(`Peak of ${phaseLabel(p.phase)}: ${formatBytes(p.totalBytes)}\n${p.label}`))));
  }
  if (peak && validIndex(peak.eventIndex)) {
    const px = sx(peak.eventIndex + 0.5);
    const py = sy(peak.totalBytes);
    const anchor = px > margin.left + innerW * 0.6 ? 'end' : 'start';
    const tx = anchor === 'end' ? px - 8 : px + 8;
    const room = anchor === 'end' ? tx - margin.left : margin.left + innerW - tx;
    let ty = Math.max(py + 4, margin.top + 10);
    // The two label lines (ty − 10 … ty + 16) must not cross the GPU line: below it if there is
    // room, else above it.
    if (showCapacity) {
      const capY = sy(capacityBytes);
      if (capY > ty - 12 && capY < ty + 18) ty = capY + 30 < bottom ? capY + 14 : capY - 20;
    }
    svg.append(svgEl('g', { class: 'peak-marker', 'data-event': peak.eventIndex },
      svgEl('circle', { cx: px, cy: py, r: 4.5 }, titleEl(`Peak: ${formatBytes(peak.totalBytes)} (${formatExactBytes(peak.totalBytes)})\n${peak.label}`)),
      svgEl('text', { class: 'chart-label strong', x: tx, y: ty, 'text-anchor': anchor }, `peak ${formatBytes(peak.totalBytes)}`),
      svgEl('text', { class: 'chart-label peak-label', x: tx, y: ty + 13, 'text-anchor': anchor }, truncate(String(peak.label ?? ''), Math.floor(room / 5.8)))));
  }

  if (!n) return figure;

  // ---- hover and keyboard ----
  const cursorLine = svgEl('line', { y1: margin.top, y2: bottom });
  const cursorDot = svgEl('circle', { r: 3.5 });
  const cursorText = svgEl('text', {});
  const cursor = svgEl('g', { class: 'cursor', visibility: 'hidden', 'pointer-events': 'none' }, cursorLine, cursorDot, cursorText);
  svg.append(svgEl('rect', { class: 'hit-area', x: margin.left, y: margin.top, width: innerW, height: innerH }), cursor);

  // Keyboard stops (list positions): each phase's start and peak, the end of the first forward
  // (what forward leaves for backward), the overall peak, the last event.
  const stopNotes = new Map();
  const addStop = (k, note) => stopNotes.set(k, stopNotes.has(k) ? `${stopNotes.get(k)}; ${note}` : note);
  for (const b of bands) addStop(b.start, `start of ${bandText(b)}`);
  for (const p of phasePeaks) if (validIndex(p.eventIndex)) addStop(positionOf(p.eventIndex), `peak of ${phaseLabel(p.phase)}`);
  if (forwardEnd && validIndex(forwardEnd.eventIndex)) addStop(positionOf(forwardEnd.eventIndex), 'end of forward (what backward starts from)');
  if (peak && validIndex(peak.eventIndex)) addStop(positionOf(peak.eventIndex), 'the peak');
  addStop(n - 1, 'last event');
  const stops = [...stopNotes.keys()].sort((a, b) => a - b);

  const describe = (k, note) => {
    const p = timeline[k];
    const where = [`event #${idx(k)}`, p.step > 0 ? `${phaseLabel(p.phase)} · step ${p.step}` : phaseLabel(p.phase)];
    if (p.layer >= 0) where.push(`block ${p.layer}`);
    const delta = p.deltaBytes >= 0 ? `+${formatBytes(p.deltaBytes)}` : formatBytes(p.deltaBytes);
    const reserved = hasReserved ? `; reserved ${formatBytes(reservedOf(k))}` : '';
    const total = `total ${formatBytes(p.totalBytes)} (${formatExactBytes(p.totalBytes)}), this event ${delta}${reserved}`;
    return { where: `${note ? `${note}: ` : ''}${where.join(' · ')}`, label: String(p.label ?? ''), total };
  };
  const idle = 'Hover the chart for an event, or focus it and press ← → to step between phase starts and peaks.';
  const showIdle = () => {
    cursor.setAttribute('visibility', 'hidden');
    readout.textContent = idle;
  };
  const show = (k, note) => {
    const { x, y } = at(k);
    const text = describe(k, note);
    cursorLine.setAttribute('x1', x);
    cursorLine.setAttribute('x2', x);
    cursorDot.setAttribute('cx', x);
    cursorDot.setAttribute('cy', y);
    const anchor = x > margin.left + innerW * 0.75 ? 'end' : 'start';
    cursorText.setAttribute('x', anchor === 'end' ? x - 6 : x + 6);
    cursorText.setAttribute('y', Math.max(y - 6, margin.top + 10));
    cursorText.setAttribute('text-anchor', anchor);
    cursorText.textContent = formatBytes(timeline[k].totalBytes);
    cursor.setAttribute('visibility', 'visible');
    const where = document.createElement('span');
    where.className = 'where';
    where.textContent = text.where;
    readout.replaceChildren(where, document.createElement('br'), `${text.label} — ${text.total}`);
    return text;
  };

  let current = peak && validIndex(peak.eventIndex) ? positionOf(peak.eventIndex) : 0;
  let keyboardActive = false;
  const moveTo = (k) => {
    current = Math.max(0, Math.min(n - 1, k));
    keyboardActive = true;
    const text = show(current, stopNotes.get(current));
    svg.setAttribute('aria-valuenow', idx(current));
    svg.setAttribute('aria-valuetext', `${text.where}. ${text.label}. ${text.total}`);
  };
  const columnOf = (k) => lastAtOrBefore(columns.length, (j) => columns[j].k0, k);

  svg.setAttribute('role', 'slider');
  svg.setAttribute('aria-label', `Memory after each of ${count} allocation and free events; peak ${formatBytes(peakBytes)}. Arrow keys step between phase starts and peaks.`);
  svg.setAttribute('aria-valuemin', 0);
  svg.setAttribute('aria-valuemax', Math.max(count - 1, 0));
  svg.setAttribute('aria-valuenow', idx(current));
  svg.addEventListener('focus', () => moveTo(current));
  svg.addEventListener('blur', () => {
    keyboardActive = false;
    showIdle();
  });
  svg.addEventListener('keydown', (event) => {
    let next;
    if (event.key === 'ArrowRight' || event.key === 'ArrowUp') {
      next = event.shiftKey ? columns[Math.min(columns.length - 1, columnOf(current) + 1)].rep : stops.find((s) => s > current);
    } else if (event.key === 'ArrowLeft' || event.key === 'ArrowDown') {
      next = event.shiftKey ? columns[Math.max(0, columnOf(current) - 1)].rep : stops.findLast((s) => s < current);
    } else if (event.key === 'Home') {
      next = 0;
    } else if (event.key === 'End') {
      next = n - 1;
    } else {
      return;
    }
    event.preventDefault();
    // A column's largest entry may lie behind the cursor; a step always moves in its direction.
    if (event.shiftKey && next !== undefined) {
      const forward = event.key === 'ArrowRight' || event.key === 'ArrowUp';
      if (forward ? next <= current : next >= current) next = current + (forward ? 1 : -1);
    }
    if (next !== undefined) moveTo(next);
  });
  svg.addEventListener('pointermove', (event) => {
    const box = svg.getBoundingClientRect();
    if (!box.width) return;
    const x = ((event.clientX - box.left) * width) / box.width;
    if (x < margin.left || x > margin.left + innerW) return;
    const c = columns[lastAtOrBefore(columns.length, (j) => idx(columns[j].k0), ((x - margin.left) / innerW) * count)];
    const first = idx(c.k0);
    const last = until(c.k1 - 1) - 1;
    show(c.rep, last > first ? `largest total of events ${first}–${last}` : '');
  });
  svg.addEventListener('pointerleave', () => {
    if (keyboardActive) moveTo(current);
    else showIdle();
  });
  showIdle();
  return figure;
}

// ---------- the allocator's segments at the device peak ----------

// The caching allocator's segments at the reserved peak, in the style of PyTorch's memory_viz
// (torch/cuda/_memory_viz.py, segment_plot; the page draws estimate.device.segments, the core's
// simulation of DeviceCachingAllocator::snapshot). One bar per segment in address order, its
// length proportional to the segment's size against the largest one, its blocks coloured
// allocated (cuBLAS workspaces apart) or free (the allocator's cache); hovering a block names its
// tensor in the readout. When the core left segments or blocks out (huge models), a note counts
// them and each segment's left-out blocks are one grey run at its end.
//   picture: {eventIndex, reservedBytes, allocatedBytes, segmentCount, omittedSegments,
//             omittedBytes, segments: [{address, totalBytes, allocatedBytes, pool, expandable,
//             omittedBlocks, omittedBlockBytes, omittedAllocatedBlockBytes,
//             blocks: [{bytes, requestedBytes, allocated, label}]}]}
export function segmentsChart(picture, { width = 640 } = {}) {
  const figure = document.createElement('div');
  figure.className = 'segments-figure';
  figure.setAttribute('aria-live', 'off');
  const segments = picture.segments ?? [];
  const caption = document.createElement('p');
  caption.className = 'segments-caption';
  caption.textContent = `The caching allocator's ${formatInteger(picture.segmentCount)} segment${picture.segmentCount === 1 ? '' : 's'} `
    + `at the reserved peak (event #${formatInteger(picture.eventIndex)}): ${formatBytes(picture.reservedBytes)} reserved, `
    + `${formatBytes(picture.allocatedBytes)} of it in live blocks, the rest cached free blocks (as PyTorch's memory_viz draws a snapshot).`;
  figure.append(caption);
  if (picture.omittedSegments > 0) {
    const more = document.createElement('p');
    more.className = 'segments-more';
    more.textContent = `The ${formatInteger(segments.length)} largest are drawn, and ${formatInteger(picture.omittedSegments)} more `
      + `(${formatBytes(picture.omittedBytes)}) are not.`;
    figure.append(more);
  }
  const key = document.createElement('ul');
  key.className = 'legend segments-key';
  for (const [cls, text] of [['dev-allocated', 'allocated block (a tensor)'], ['dev-workspaces', 'cuBLAS workspace'], ['dev-cache', 'free block (cached)']]) {
    const li = document.createElement('li');
    const swatch = document.createElement('span');
    swatch.className = `swatch ${cls}`;
    li.append(swatch, text);
    key.append(li);
  }
  figure.append(key);

  const left = 64;  // the segment's size, written before its bar
  const innerW = Math.max(60, width - left - 4);
  const rowH = segments.length <= 24 ? 14 : segments.length <= 80 ? 8 : 5;
  const gap = rowH > 8 ? 3 : 1;
  const height = Math.max(1, segments.length * (rowH + gap));
  const largest = Math.max(1, ...segments.map((s) => s.totalBytes));
  const sx = (bytes) => (bytes / largest) * innerW;
  const svg = svgEl('svg', {
    class: 'chart segments', viewBox: `0 0 ${width} ${height}`, width: '100%', height,
    role: 'img', 'aria-label': caption.textContent,
  });
  const readout = document.createElement('p');
  readout.className = 'chart-readout';
  readout.textContent = 'Hover a block to name its tensor.';
  // Each block's hover text, made into its <title> when the pointer first reaches it: a big
  // model has thousands of blocks, and a title element apiece doubled the chart's nodes (a
  // 5,000-layer list: 3,187 blocks, 7,185 SVG nodes, the largest part of the page's layout).
  const titles = [];
  segments.forEach((s, row) => {
    const y = row * (rowH + gap);
    const g = svgEl('g', {
      class: 'segment', 'data-total-bytes': s.totalBytes, 'data-allocated-bytes': s.allocatedBytes,
      'data-address': s.address, 'data-pool': s.pool,
    });
    if (rowH >= 8) {
      g.append(svgEl('text', { class: 'chart-label', x: left - 4, y: y + rowH - 2, 'text-anchor': 'end' }, formatBytes(s.totalBytes)));
    }
    g.append(svgEl('rect', { class: 'bar-track', x: left, y, width: Math.max(sx(s.totalBytes), 0.5), height: rowH }));
    const where = `segment ${s.address} (${s.pool} pool${s.expandable ? ', expandable' : ''}${s.stream ? `, stream ${s.stream}` : ''}), ${formatBytes(s.totalBytes)}`;
    let at = 0;
    const place = (bytes, cls, attrs, text) => {
      g.append(svgEl('rect', { class: cls, x: left + sx(at), y, width: Math.max(sx(bytes), 0.3), height: rowH, 'data-title': titles.length, ...attrs }));
      titles.push(text);
      at += bytes;
    };
    for (const b of s.blocks) {
      const cls = !b.allocated ? 'seg-block dev-cache' : b.label === 'cuBLAS workspace' ? 'seg-block dev-workspaces' : 'seg-block dev-allocated';
      const text = b.allocated
        ? `${b.label}: ${formatBytes(b.bytes)} block (${formatExactBytes(b.requestedBytes)} requested), ${where}`
        : `free: ${formatBytes(b.bytes)} (${formatExactBytes(b.bytes)}) cached, ${where}`;
      place(b.bytes, cls, { 'data-bytes': b.bytes, 'data-allocated': String(b.allocated), 'data-label': b.label }, text);
    }
    if (s.omittedBlocks > 0) {
      place(s.omittedBlockBytes, 'seg-omitted', { 'data-bytes': s.omittedBlockBytes, fill: 'var(--muted)', 'fill-opacity': 0.35 },
        `${formatInteger(s.omittedBlocks)} smaller blocks not listed: ${formatBytes(s.omittedBlockBytes)}, ${formatBytes(s.omittedAllocatedBlockBytes)} of it allocated, ${where}`);
    }
    svg.append(g);
  });
  // One listener for every block: the readout repeats the hovered block's title.
  svg.addEventListener('mouseover', (event) => {
    const rect = event.target.closest?.('rect[data-title]');
    if (!rect) return;
    let title = rect.querySelector('title');
    if (!title) {
      title = titleEl(titles[Number(rect.dataset.title)]);
      rect.append(title);
    }
    readout.textContent = title.textContent;
  });
  const scroll = document.createElement('div');
  scroll.className = 'segments-scroll';
  scroll.style.maxHeight = '360px';
  scroll.style.overflowY = 'auto';
  scroll.append(svg);
  figure.append(scroll, readout);
  return figure;
}
