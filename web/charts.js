// SVG charts and number formatting for the gpumem page.
//
// Everything here draws or formats numbers the core computed; nothing here derives a memory
// figure. Charts are built with DOM calls (never innerHTML) so labels from the core are text.

const SVG_NS = 'http://www.w3.org/2000/svg';
const GIB = 2 ** 30;
const GB = 1e9;

// A byte count for people: binary units (what nvidia-smi and PyTorch report), 3–4 significant
// digits. Anything that is not a finite number shows as a dash, so NaN never reaches the page.
export function formatBytes(bytes) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes)) return '—';
  const sign = bytes < 0 ? '−' : '';
  let v = Math.abs(bytes);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  let u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  if (u === 0) return `${sign}${v} B`;
  const digits = v >= 100 ? 1 : 2;
  return `${sign}${v.toFixed(digits)} ${units[u]}`;
}

// The same count in decimal gigabytes, which is how model sizes are usually quoted.
export function formatGB(bytes) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes)) return '—';
  const v = bytes / GB;
  const digits = Math.abs(v) >= 100 ? 1 : Math.abs(v) >= 1 ? 2 : 3;
  return `${v < 0 ? '−' : ''}${Math.abs(v).toFixed(digits)} GB`;
}

// Exact whole number with thousands separators: "24,000,000,000 B".
export function formatExactBytes(bytes) {
  return `${formatInteger(bytes)} B`;
}

export function formatInteger(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  return n.toLocaleString('en-US', { maximumFractionDigits: 0 });
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

// Axis ticks at 1, 2 or 5 × a power of two of GiB (or of 1024 smaller units), so labels read
// as round binary numbers.
function niceTicks(maxBytes, count = 4) {
  if (!(maxBytes > 0)) return [0];
  const raw = maxBytes / count;
  let unit = 1;
  while (unit * 1024 <= raw) unit *= 1024;
  const candidates = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].map((m) => m * unit);
  const step = candidates.find((c) => c >= raw) ?? raw;
  const ticks = [];
  for (let t = 0; t <= maxBytes * 1.0001; t += step) ticks.push(t);
  return ticks;
}

// A horizontal stacked bar of the categories live at the peak, drawn against the GPU capacity.
// segments: [{label, bytes, colorIndex}]; the capacity is marked with a line.
export function capacityBar(segments, capacityBytes, { width = 640, peakLabel = '' } = {}) {
  const total = segments.reduce((sum, s) => sum + Math.max(0, s.bytes), 0);
  const scaleMax = Math.max(total, capacityBytes, 1);
  const height = 64;
  const barTop = 22;
  const barHeight = 26;
  const x = (b) => (b / scaleMax) * (width - 2) + 1;
  const svg = svgEl('svg', {
    class: 'chart capacity-bar', viewBox: `0 0 ${width} ${height}`, width: '100%', height,
    role: 'img', 'aria-label': `Memory at the peak, ${formatBytes(total)}, against a GPU of ${formatBytes(capacityBytes)}`,
  });
  svg.append(svgEl('rect', { class: 'bar-track', x: 1, y: barTop, width: width - 2, height: barHeight, rx: 3 }));
  let at = 0;
  for (const s of segments) {
    if (!(s.bytes > 0)) continue;
    const w = x(at + s.bytes) - x(at);
    svg.append(svgEl('rect', {
      class: `cat cat-${s.colorIndex}`, x: x(at), y: barTop, width: Math.max(w, 0.5), height: barHeight,
    }, titleEl(`${s.label}: ${formatBytes(s.bytes)} (${formatExactBytes(s.bytes)})`)));
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

// Reduces a long timeline to at most `buckets` points for drawing, keeping the largest total of
// each bucket (so no spike disappears) and its index for the hover text.
function bucketize(timeline, buckets) {
  const n = timeline.length;
  if (n <= buckets) return timeline.map((p, i) => ({ i0: i, i1: i + 1, rep: i }));
  const out = [];
  const size = n / buckets;
  for (let b = 0; b < buckets; b++) {
    const i0 = Math.floor(b * size);
    const i1 = Math.max(i0 + 1, Math.floor((b + 1) * size));
    let rep = i0;
    for (let i = i0; i < i1; i++) if (timeline[i].totalBytes > timeline[rep].totalBytes) rep = i;
    out.push({ i0, i1, rep });
  }
  return out;
}

// Memory after each event of the simulated run, as a step line over the event index.
// Phases (init → forward → backward → optimizer step, per training step) are shaded and
// labelled; the peak is marked; every point carries a <title> with its label and total.
//   timeline: estimate.timeline; peak: estimate.peak; phaseLabel(id) → text;
//   capacityBytes: drawn as a dashed line when it is within the chart's range.
export function timelineChart(timeline, { peak, phaseLabel = (id) => id, capacityBytes = 0, width = 640, height = 240 } = {}) {
  const margin = { top: 26, right: 10, bottom: 26, left: 62 };
  const innerW = Math.max(width - margin.left - margin.right, 40);
  const innerH = height - margin.top - margin.bottom;
  const n = timeline.length;
  const peakBytes = peak && Number.isFinite(peak.totalBytes) ? peak.totalBytes : 0;
  const maxY = Math.max(peakBytes, ...timeline.map((p) => p.totalBytes), 1);
  const showCapacity = capacityBytes > 0 && capacityBytes <= maxY * 1.3;
  const yMax = (showCapacity ? Math.max(maxY, capacityBytes) : maxY) * 1.08;
  const sx = (i) => margin.left + (n ? (i / n) * innerW : 0);
  const sy = (b) => margin.top + innerH - (b / yMax) * innerH;

  const svg = svgEl('svg', {
    class: 'chart timeline', viewBox: `0 0 ${width} ${height}`, width: '100%', height,
    role: 'img', 'aria-label': `Memory after each of ${n} allocation and free events; peak ${formatBytes(peakBytes)}`,
  });

  // Phase bands: consecutive events of the same phase and step.
  const bands = [];
  for (let i = 0; i < n; i++) {
    const p = timeline[i];
    const last = bands[bands.length - 1];
    if (last && last.phase === p.phase && last.step === p.step) last.end = i + 1;
    else bands.push({ phase: p.phase, step: p.step, start: i, end: i + 1 });
  }
  const phaseIds = [...new Set(bands.map((b) => b.phase))];
  for (const b of bands) {
    const x0 = sx(b.start);
    const w = sx(b.end) - x0;
    const text = b.step > 0 ? `${phaseLabel(b.phase)} · step ${b.step}` : phaseLabel(b.phase);
    const g = svgEl('g', { class: `band phase-${phaseIds.indexOf(b.phase) % 4}` },
      svgEl('rect', { x: x0, y: margin.top, width: Math.max(w, 0.5), height: innerH }, titleEl(text)));
    // Label only what fits; the title still names every band.
    const short = phaseLabel(b.phase);
    const initial = `${short.slice(0, 1)}${b.step > 0 ? b.step : ''}`;
    const label = w > text.length * 6.2 ? text : w > short.length * 6.2 ? short : w > initial.length * 7 + 4 ? initial : '';
    if (label) g.append(svgEl('text', { class: 'band-label', x: x0 + w / 2, y: margin.top - 6, 'text-anchor': 'middle' }, label));
    svg.append(g);
  }

  // Y axis with binary-unit ticks.
  for (const t of niceTicks(yMax / 1.08)) {
    const y = sy(t);
    svg.append(
      svgEl('line', { class: 'grid', x1: margin.left, x2: margin.left + innerW, y1: y, y2: y }),
      svgEl('text', { class: 'axis-label', x: margin.left - 6, y: y + 4, 'text-anchor': 'end' }, formatBytes(t)),
    );
  }
  svg.append(svgEl('text', { class: 'axis-label', x: margin.left + innerW / 2, y: height - 6, 'text-anchor': 'middle' },
    `event index (0 … ${Math.max(n - 1, 0)})`));

  if (showCapacity) {
    const y = sy(capacityBytes);
    svg.append(
      svgEl('line', { class: 'capacity-line', x1: margin.left, x2: margin.left + innerW, y1: y, y2: y }),
      svgEl('text', { class: 'chart-label', x: margin.left + innerW - 4, y: y - 4, 'text-anchor': 'end' }, `GPU ${formatBytes(capacityBytes)}`),
    );
  }

  // The step line: after event i the total holds until event i + 1.
  const groups = bucketize(timeline, Math.max(50, Math.floor(innerW)));
  let d = '';
  groups.forEach((g, k) => {
    const y = sy(timeline[g.rep].totalBytes);
    d += k === 0 ? `M${sx(g.i0).toFixed(2)},${sy(0).toFixed(2)}V${y.toFixed(2)}` : `V${y.toFixed(2)}`;
    d += `H${sx(g.i1).toFixed(2)}`;
  });
  if (d) svg.append(svgEl('path', { class: 'line', d }));

  // Hover targets, one per drawn point.
  const hits = svgEl('g', { class: 'hits' });
  for (const g of groups) {
    const p = timeline[g.rep];
    const range = g.i1 - g.i0 > 1 ? `events ${g.i0}–${g.i1 - 1}, largest at #${g.rep}` : `event #${g.rep}`;
    const stepText = p.step > 0 ? ` · step ${p.step}` : '';
    const delta = p.deltaBytes >= 0 ? `+${formatBytes(p.deltaBytes)}` : formatBytes(p.deltaBytes);
    hits.append(svgEl('rect', { x: sx(g.i0), y: margin.top, width: Math.max(sx(g.i1) - sx(g.i0), 0.5), height: innerH },
      titleEl(`${range} (${phaseLabel(p.phase)}${stepText})\n${p.label}\ntotal ${formatBytes(p.totalBytes)} (${formatExactBytes(p.totalBytes)}), ${delta}`)));
  }
  svg.append(hits);

  // Peak marker.
  if (peak && Number.isInteger(peak.eventIndex) && peak.eventIndex >= 0 && peak.eventIndex < n) {
    const px = (sx(peak.eventIndex) + sx(peak.eventIndex + 1)) / 2;
    const py = sy(peak.totalBytes);
    const anchor = px > margin.left + innerW * 0.7 ? 'end' : 'start';
    svg.append(svgEl('g', { class: 'peak-marker' },
      svgEl('circle', { cx: px, cy: py, r: 4.5 }, titleEl(`Peak: ${formatBytes(peak.totalBytes)} (${formatExactBytes(peak.totalBytes)})\n${peak.label}`)),
      svgEl('text', { class: 'chart-label strong', x: anchor === 'end' ? px - 8 : px + 8, y: Math.max(py + 4, margin.top + 10), 'text-anchor': anchor },
        `peak ${formatBytes(peak.totalBytes)}`)));
  }
  return svg;
}
