// The views panel: the heat map of the peak over micro-batch × sequence length, the GPU ×
// settings matrix, and the peak-vs-batch / peak-vs-sequence curves. Every number drawn here is
// one the core computed (docs/schema.md, "Views"); this module only lays them out.

import { svgEl, formatBytes, bytesTitle, formatInteger } from './charts.js';

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'className') node.className = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function title(text) {
  const t = svgEl('title');
  t.textContent = text;
  return t;
}

function svgText(attrs, text) {
  const t = svgEl('text', attrs);
  t.textContent = text;
  return t;
}

// ---------- heat map ----------

// What one cell says, for its title, the readout and screen readers.
export function heatMapCellText(heatMap, row, column) {
  const batch = heatMap.batchSizes[row];
  const sequence = heatMap.sequenceLengths[column];
  const cell = heatMap.cells[row][column];
  const where = `Batch ${formatInteger(batch)} × ${formatInteger(sequence)} tokens`;
  if (cell.peakBytes === null) return `${where}: cannot be estimated (${cell.error?.message ?? 'invalid'})`;
  const room = heatMap.capacityBytes - cell.peakBytes;
  const verdict = cell.fits ? `fits, ${formatBytes(room)} free` : `does not fit by ${formatBytes(-room)}`;
  const dominant = cell.dominant ? ` · ${cell.dominant.label} dominate (${cell.dominant.sharePercent.toFixed(0)} %)` : '';
  const current = batch === heatMap.current.batchSize && sequence === heatMap.current.sequenceLength ? ' · current setup' : '';
  return `${where}: peak ${formatBytes(cell.peakBytes)} (${verdict})${dominant}${current}`;
}

// A grid of cells, largest batch at the top; green shades fit (darker: closer to the capacity),
// red ones do not; a thick line runs along the capacity boundary. Hover, or focus the chart and
// use the arrow keys, to read a cell; Enter (or a click) applies its batch and sequence.
export function renderHeatMap(container, heatMap, { onApply, readout } = {}) {
  const rows = heatMap.batchSizes.length;
  const cols = heatMap.sequenceLengths.length;
  const width = Math.max(320, Math.min(900, container.clientWidth || 640));
  const left = 58, top = 6, bottom = 40, right = 6;
  const cellW = (width - left - right) / cols;
  const cellH = 26;
  const height = top + rows * cellH + bottom;
  const x = (c) => left + c * cellW;
  const y = (r) => top + (rows - 1 - r) * cellH;  // row 0 (smallest batch) at the bottom
  const capacity = heatMap.capacityBytes;
  const svg = svgEl('svg', {
    viewBox: `0 0 ${width} ${height}`, width, height, class: 'heatmap', tabindex: '0', role: 'img',
    'aria-label': `Peak memory for ${rows} micro-batch sizes × ${cols} sequence lengths against the GPU's ${formatBytes(capacity)}. Use the arrow keys to read cells, Enter to use one.`,
  });
  const cellsGroup = svgEl('g');
  const rects = [];
  for (let r = 0; r < rows; r++) {
    rects.push([]);
    for (let c = 0; c < cols; c++) {
      const cell = heatMap.cells[r][c];
      const ratio = cell.peakBytes === null ? 0 : cell.peakBytes / capacity;
      const kind = cell.peakBytes === null ? 'invalid' : cell.fits ? 'fits' : 'over';
      const opacity = kind === 'fits' ? 0.15 + 0.6 * Math.min(1, ratio) : kind === 'over' ? 0.35 + 0.45 * Math.min(1, (ratio - 1) / 3) : 0.1;
      const rect = svgEl('rect', {
        x: x(c) + 0.5, y: y(r) + 0.5, width: Math.max(1, cellW - 1), height: cellH - 1,
        class: `cell cell-${kind}`, 'fill-opacity': opacity.toFixed(3),
        'data-row': r, 'data-column': c, 'data-batch-size': heatMap.batchSizes[r], 'data-sequence-length': heatMap.sequenceLengths[c],
        'data-peak-bytes': cell.peakBytes ?? '', 'data-fits': String(Boolean(cell.fits)),
      });
      rect.append(title(heatMapCellText(heatMap, r, c)));
      rects[r].push(rect);
      cellsGroup.append(rect);
      if (cell.peakBytes !== null && cellW >= 58) {
        cellsGroup.append(svgText({ x: x(c) + cellW / 2, y: y(r) + cellH / 2 + 4, class: 'cell-label', 'text-anchor': 'middle', 'pointer-events': 'none' },
          formatBytes(cell.peakBytes)));
      }
    }
  }
  svg.append(cellsGroup);
  // The capacity boundary: every edge between a cell that fits and a neighbour that does not.
  const boundary = svgEl('g', { class: 'fit-boundary' });
  const fits = (r, c) => heatMap.cells[r]?.[c]?.fits === true;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      if (c + 1 < cols && fits(r, c) !== fits(r, c + 1)) boundary.append(svgEl('line', { x1: x(c + 1), x2: x(c + 1), y1: y(r), y2: y(r) + cellH }));
      if (r + 1 < rows && fits(r, c) !== fits(r + 1, c)) boundary.append(svgEl('line', { x1: x(c), x2: x(c) + cellW, y1: y(r), y2: y(r) }));
    }
  }
  boundary.append(title(`The capacity boundary: ${formatBytes(capacity)} (${bytesTitle(capacity)})`));
  svg.append(boundary);
  // Axes.
  for (let c = 0; c < cols; c++) {
    svg.append(svgText({ x: x(c) + cellW / 2, y: top + rows * cellH + 14, class: 'axis-label', 'text-anchor': 'middle' }, formatInteger(heatMap.sequenceLengths[c])));
  }
  for (let r = 0; r < rows; r++) {
    svg.append(svgText({ x: left - 6, y: y(r) + cellH / 2 + 4, class: 'axis-label', 'text-anchor': 'end' }, formatInteger(heatMap.batchSizes[r])));
  }
  svg.append(svgText({ x: left + (width - left - right) / 2, y: height - 6, class: 'axis-title', 'text-anchor': 'middle' }, 'sequence length (tokens)'));
  svg.append(svgText({ x: 10, y: top + (rows * cellH) / 2, class: 'axis-title', 'text-anchor': 'middle', transform: `rotate(-90 10 ${top + (rows * cellH) / 2})` }, 'micro-batch'));
  // The current setup's cell.
  const curRow = heatMap.batchSizes.indexOf(heatMap.current.batchSize);
  const curCol = heatMap.sequenceLengths.indexOf(heatMap.current.sequenceLength);
  if (curRow >= 0 && curCol >= 0) {
    svg.append(svgEl('rect', { x: x(curCol) + 1.5, y: y(curRow) + 1.5, width: Math.max(1, cellW - 3), height: cellH - 3, class: 'current-cell', 'pointer-events': 'none' }));
  }
  const focus = svgEl('rect', { class: 'focus-cell', width: Math.max(1, cellW), height: cellH, visibility: 'hidden', 'pointer-events': 'none' });
  svg.append(focus);

  let selected = curRow >= 0 && curCol >= 0 ? [curRow, curCol] : [0, 0];
  const show = (r, c) => {
    selected = [r, c];
    focus.setAttribute('x', x(c));
    focus.setAttribute('y', y(r));
    focus.setAttribute('visibility', 'visible');
    if (readout) {
      readout.textContent = heatMapCellText(heatMap, r, c);
      readout.dataset.peakBytes = String(heatMap.cells[r][c].peakBytes ?? '');
    }
  };
  const apply = (r, c) => onApply?.({ training: { batchSize: heatMap.batchSizes[r], sequenceLength: heatMap.sequenceLengths[c] } },
    `batch ${heatMap.batchSizes[r]} × ${heatMap.sequenceLengths[c]} tokens`);
  svg.addEventListener('mousemove', (event) => {
    const rect = event.target.closest?.('rect.cell');
    if (rect) show(Number(rect.dataset.row), Number(rect.dataset.column));
  });
  svg.addEventListener('click', (event) => {
    const rect = event.target.closest?.('rect.cell');
    if (rect) apply(Number(rect.dataset.row), Number(rect.dataset.column));
  });
  svg.addEventListener('focus', () => show(...selected));
  svg.addEventListener('keydown', (event) => {
    let [r, c] = selected;
    if (event.key === 'ArrowLeft') c = Math.max(0, c - 1);
    else if (event.key === 'ArrowRight') c = Math.min(cols - 1, c + 1);
    else if (event.key === 'ArrowUp') r = Math.min(rows - 1, r + 1);
    else if (event.key === 'ArrowDown') r = Math.max(0, r - 1);
    else if (event.key === 'Enter' || event.key === ' ') { apply(r, c); event.preventDefault(); return; }
    else return;
    event.preventDefault();
    show(r, c);
  });
  container.replaceChildren(svg);
  return svg;
}

// ---------- GPU matrix ----------

function settingsText(candidate) {
  return candidate.tier === 'asIs' ? 'as is' : candidate.labels.join(' + ');
}

export function renderGpuMatrix(table, matrix, { currentGpuId = '', onApply } = {}) {
  const body = table.tBodies[0] ?? table.appendChild(document.createElement('tbody'));
  body.replaceChildren(...matrix.gpus.map((gpu) => {
    const choice = gpu.choice === null ? null : matrix.candidates[gpu.choice];
    const smallest = gpu.smallestPeakCandidate === null ? null : matrix.candidates[gpu.smallestPeakCandidate];
    const tr = el('tr', { dataset: { gpuId: gpu.id, fits: String(gpu.fits), tier: choice?.tier ?? 'none' } });
    if (gpu.id === currentGpuId) tr.classList.add('current-gpu');
    const name = el('th', { scope: 'row' }, gpu.label);
    const memory = el('td', { className: 'num', title: bytesTitle(gpu.capacityBytes) }, formatBytes(gpu.capacityBytes));
    const verdict = el('td', { className: gpu.fits ? 'fits-yes' : 'fits-no' },
      !gpu.fits ? 'does not fit with any of these' : choice.tier === 'asIs' ? 'fits as is' : 'fits with changes');
    const settings = el('td', { className: 'settings' });
    if (choice) {
      settings.append(settingsText(choice));
      if (choice.tier !== 'asIs') settings.append(el('span', { className: 'tier' }, ` (${choice.tierLabel})`));
    } else if (smallest) {
      settings.append(`smallest peak tried: ${formatBytes(smallest.peakBytes)} (${settingsText(smallest)})`);
      settings.title = bytesTitle(smallest.peakBytes);
    }
    const peak = el('td', { className: 'num', title: choice ? bytesTitle(choice.peakBytes) : '' }, choice ? formatBytes(choice.peakBytes) : '—');
    const headroom = el('td', { className: 'num', title: gpu.headroomBytes === null ? '' : bytesTitle(gpu.headroomBytes) },
      gpu.headroomBytes === null ? '—' : formatBytes(gpu.headroomBytes));
    const action = el('td');
    if (choice && onApply) {
      const b = el('button', { type: 'button', 'aria-label': `Use ${gpu.label}${choice.tier === 'asIs' ? '' : ` with ${settingsText(choice)}`}` }, 'Use');
      b.addEventListener('click', () => onApply({ ...choice.change, gpu: { id: gpu.id } },
        `${gpu.label}${choice.tier === 'asIs' ? '' : ` with ${settingsText(choice)}`}`));
      action.append(b);
    }
    tr.append(name, memory, verdict, settings, peak, headroom, action);
    return tr;
  }));
}

// ---------- curves ----------

// One curve: peak against the value on a log₂ axis, the GPU's capacity as a dashed line, the
// current value and the largest value that fits marked. Points above three times the capacity
// are drawn at the top edge, hollow.
export function curveChart(curve, { capacityBytes, current, what, unit, width = 420 } = {}) {
  const height = 220;
  const left = 64, right = 12, top = 12, bottom = 40;
  const points = curve.points.filter((p) => p.peakBytes !== null);
  const values = curve.points.map((p) => p.value);
  const lx = (v) => Math.log2(Math.max(1, v));
  const x0 = lx(values[0]), x1 = lx(values[values.length - 1]);
  const x = (v) => left + (x1 === x0 ? 0.5 : (lx(v) - x0) / (x1 - x0)) * (width - left - right);
  const maxPeak = Math.max(0, ...points.map((p) => p.peakBytes));
  const yMax = Math.max(capacityBytes * 1.1, Math.min(maxPeak, capacityBytes * 3)) || 1;
  const y = (b) => top + (1 - Math.min(b, yMax) / yMax) * (height - top - bottom);
  const svg = svgEl('svg', {
    viewBox: `0 0 ${width} ${height}`, width, height, class: 'curve-chart', role: 'img', 'data-field': curve.field,
    'aria-label': `Peak memory against ${what}, with the GPU capacity ${formatBytes(capacityBytes)}.`,
  });
  // Grid: 0, capacity/2, capacity and yMax.
  for (const b of [0, yMax / 2, yMax]) {
    svg.append(svgEl('line', { x1: left, x2: width - right, y1: y(b), y2: y(b), class: 'grid-line' }));
    svg.append(svgText({ x: left - 6, y: y(b) + 4, class: 'axis-label', 'text-anchor': 'end' }, formatBytes(b)));
  }
  for (const v of values) {
    if (Math.log2(v) % 1 !== 0 && v !== current) continue;  // powers of two and the current value
    svg.append(svgText({ x: x(v), y: height - bottom + 14, class: 'axis-label', 'text-anchor': 'middle' }, formatInteger(v)));
  }
  svg.append(svgText({ x: left + (width - left - right) / 2, y: height - 6, class: 'axis-title', 'text-anchor': 'middle' }, `${what} (${unit}, log scale)`));
  const capacity = svgEl('line', { x1: left, x2: width - right, y1: y(capacityBytes), y2: y(capacityBytes), class: 'capacity-line' });
  capacity.append(title(`GPU capacity ${formatBytes(capacityBytes)} (${bytesTitle(capacityBytes)})`));
  svg.append(capacity);
  svg.append(svgText({ x: width - right, y: y(capacityBytes) - 4, class: 'capacity-label', 'text-anchor': 'end' }, `GPU ${formatBytes(capacityBytes)}`));
  if (curve.largestFitting) {
    const lf = curve.largestFitting;
    const line = svgEl('line', { x1: x(lf.value), x2: x(lf.value), y1: top, y2: height - bottom, class: 'largest-line' });
    line.append(title(`Largest ${what} that fits: ${formatInteger(lf.value)}${lf.beyondRange ? ' or more' : ''}, peak ${formatBytes(lf.peakBytes)}`));
    svg.append(line);
  }
  svg.append(svgEl('line', { x1: x(current), x2: x(current), y1: top, y2: height - bottom, class: 'current-line' }));
  svg.append(svgEl('polyline', { class: 'curve-line', points: points.map((p) => `${x(p.value).toFixed(1)},${y(p.peakBytes).toFixed(1)}`).join(' ') }));
  for (const p of points) {
    const dot = svgEl('circle', {
      cx: x(p.value), cy: y(p.peakBytes), r: 3.5, class: `curve-point ${p.fits ? 'fits' : 'over'}${p.peakBytes > yMax ? ' clipped' : ''}`,
      'data-value': p.value, 'data-peak-bytes': p.peakBytes,
    });
    dot.append(title(`${what} ${formatInteger(p.value)}: peak ${formatBytes(p.peakBytes)} (${bytesTitle(p.peakBytes)}), ${p.fits ? 'fits' : 'does not fit'}`));
    svg.append(dot);
  }
  return svg;
}

export function renderCurves(container, curves, { width } = {}) {
  const w = Math.max(300, Math.min(520, width ?? ((container.clientWidth || 860) / 2 - 12)));
  const caption = (curve, what, unit) => {
    const lf = curve.largestFitting;
    return el('p', { className: 'hint' }, lf
      ? `Largest ${what} that fits: ${formatInteger(lf.value)}${lf.beyondRange ? ` or more (the curve stops at ${formatInteger(curve.points[curve.points.length - 1].value)})` : ''} ${unit}.`
      : `Even the smallest ${what} does not fit.`);
  };
  const batch = el('figure', { className: 'curve' },
    curveChart(curves.batch, { capacityBytes: curves.capacityBytes, current: curves.current.batchSize, what: 'micro-batch', unit: 'samples', width: w }),
    el('figcaption', {}, `Peak against micro-batch, sequence ${formatInteger(curves.current.sequenceLength)} tokens`),
    caption(curves.batch, 'micro-batch', 'samples'));
  const sequence = el('figure', { className: 'curve' },
    curveChart(curves.sequence, { capacityBytes: curves.capacityBytes, current: curves.current.sequenceLength, what: 'sequence length', unit: 'tokens', width: w }),
    el('figcaption', {}, `Peak against sequence length, micro-batch ${formatInteger(curves.current.batchSize)}`),
    caption(curves.sequence, 'sequence length', 'tokens'));
  container.replaceChildren(batch, sequence);
}
