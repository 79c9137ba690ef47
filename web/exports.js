// Downloads from the page: CSV text, charts as standalone SVG and as PNG. Everything is built in
// the page and handed over as a blob: URL, so nothing touches the network (the page's CSP allows
// img-src data: blob:, which the PNG's drawing needs).

const SVG_NS = 'http://www.w3.org/2000/svg';

// Offers `blob` as a download named `filename`.
export function downloadBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = filename;
  a.hidden = true;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// RFC 4180 text: fields with a comma, quote or line break are quoted; lines end with CRLF.
export function csvText(rows) {
  const field = (value) => {
    const text = value === null || value === undefined ? '' : String(value);
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  };
  return `${rows.map((row) => row.map(field).join(',')).join('\r\n')}\r\n`;
}

// Presentation properties the page's stylesheet gives chart elements; a standalone SVG carries
// them inline, resolved for the current theme, since it takes no stylesheet with it.
const STYLE_PROPERTIES = [
  'fill', 'fill-opacity', 'stroke', 'stroke-width', 'stroke-dasharray', 'stroke-opacity', 'stroke-linejoin',
  'opacity', 'font-family', 'font-size', 'font-weight', 'paint-order', 'visibility',
];

// Interactive parts (the hover target and cursor) are not part of the picture.
const DROP = '.hit-area, .cursor';

// The chart `svg` (in the document) as standalone SVG text, with its width and height in pixels
// and a background in the page's colour.
// A chart as a file of its own: computed styles inlined, interaction attributes dropped, and
// (given them) the title, the one-line setup, the legend and the gpumem version around it.
export function standaloneSvg(svg, { title = '', legend = [], setupLine = '', footer = '' } = {}) {
  const box = svg.viewBox?.baseVal;
  const width = box && box.width ? box.width : svg.getBoundingClientRect().width;
  const height = box && box.height ? box.height : svg.getBoundingClientRect().height;
  const clone = svg.cloneNode(true);
  const originals = [svg, ...svg.querySelectorAll('*')];
  const copies = [clone, ...clone.querySelectorAll('*')];
  originals.forEach((el, i) => {
    const copy = copies[i];
    if (el === svg || el.namespaceURI !== SVG_NS) return;
    const computed = getComputedStyle(el);
    const style = STYLE_PROPERTIES
      .map((p) => [p, computed.getPropertyValue(p)])
      .filter(([, v]) => v)
      .map(([p, v]) => `${p}:${v}`)
      .join(';');
    if (style) copy.setAttribute('style', style);
    copy.removeAttribute('class');
  });
  for (const el of clone.querySelectorAll(DROP)) el.remove();
  for (const name of ['tabindex', 'role', 'aria-valuemin', 'aria-valuemax', 'aria-valuenow', 'aria-valuetext', 'class']) clone.removeAttribute(name);
  clone.setAttribute('xmlns', SVG_NS);
  clone.setAttribute('width', String(Math.round(width)));
  clone.setAttribute('height', String(Math.round(height)));
  clone.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const rootStyle = getComputedStyle(svg);
  clone.setAttribute('font-family', rootStyle.fontFamily);
  const background = document.createElementNS(SVG_NS, 'rect');
  background.setAttribute('x', '0');
  background.setAttribute('y', '0');
  background.setAttribute('width', String(width));
  background.setAttribute('height', String(height));
  background.setAttribute('fill', getComputedStyle(document.body).backgroundColor);
  clone.prepend(background);
  if (title) {
    const t = document.createElementNS(SVG_NS, 'title');
    t.textContent = title;
    clone.prepend(t);
  }
  const framed = frame(clone, width, height, { title, legend, setupLine, footer, foreground: getComputedStyle(document.body).color, muted: rootStyle.color });
  const text = new XMLSerializer().serializeToString(framed.svg);
  return { text: `<?xml version="1.0" encoding="UTF-8"?>\n${text}\n`, width: framed.width, height: framed.height };
}

// The chart with what makes it readable once shared: the title and the setup in one line above,
// the legend and the gpumem version below. Without any of them the chart is returned as is.
function frame(chart, width, height, { title, legend = [], setupLine = '', footer = '', foreground = '#000', muted = '#555' }) {
  if (!setupLine && !legend.length && !footer) return { svg: chart, width, height };
  const W = Math.max(width, 480);
  const pad = 12;
  const text = (x, y, content, attrs = {}) => {
    const t = document.createElementNS(SVG_NS, 'text');
    t.setAttribute('x', String(x));
    t.setAttribute('y', String(y));
    t.setAttribute('fill', attrs.fill ?? foreground);
    t.setAttribute('font-size', String(attrs.size ?? 11));
    if (attrs.weight) t.setAttribute('font-weight', attrs.weight);
    t.textContent = content;
    return t;
  };
  const parts = [];
  let y = pad + 14;
  parts.push(text(pad, y, title, { size: 14, weight: '700', fill: foreground }));
  if (setupLine) {
    y += 16;
    parts.push(text(pad, y, setupLine, { size: 11, fill: foreground }));
  }
  const top = y + 10;
  const body = document.createElementNS(SVG_NS, 'g');
  body.setAttribute('class', 'chart-body');
  body.setAttribute('transform', `translate(0 ${top})`);
  body.append(...[...chart.childNodes].filter((n) => !(n.nodeName === 'title')));
  parts.push(body);
  // Legend rows: a swatch and its label, wrapped at the width (about 6 px a character).
  let lx = pad;
  let ly = top + height + 16;
  for (const item of legend) {
    const w = 16 + item.label.length * 6 + 14;
    if (lx + w > W - pad && lx > pad) { lx = pad; ly += 16; }
    const swatch = document.createElementNS(SVG_NS, 'rect');
    for (const [k, v] of Object.entries({ x: lx, y: ly - 9, width: 10, height: 10, rx: 2, fill: item.colour })) swatch.setAttribute(k, String(v));
    const g = document.createElementNS(SVG_NS, 'g');
    g.setAttribute('class', 'legend-item');
    g.append(swatch, text(lx + 14, ly, item.label, { size: 11 }));
    parts.push(g);
    lx += w;
  }
  const footY = (legend.length ? ly : top + height) + 18;
  if (footer) parts.push(text(pad, footY, footer, { size: 10, fill: muted }));
  const H = footY + pad;
  const svg = chart.cloneNode(false);
  svg.setAttribute('width', String(Math.round(W)));
  svg.setAttribute('height', String(Math.round(H)));
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  const titleEl = chart.querySelector(':scope > title');
  const background = chart.querySelector(':scope > rect');
  if (titleEl) svg.append(titleEl.cloneNode(true));
  if (background) {
    const bg = background.cloneNode(true);
    bg.setAttribute('width', String(W));
    bg.setAttribute('height', String(H));
    svg.append(bg);
    background.remove();
    body.querySelector(':scope > rect')?.remove();
  }
  svg.append(...parts);
  return { svg, width: W, height: H };
}

// Draws standalone SVG text into a canvas (at `scale` × its size) and returns the PNG blob.
export function svgToPngBlob(svgText, width, height, scale = 2) {
  return new Promise((resolve, reject) => {
    const image = new Image();
    image.onload = () => {
      const canvas = document.createElement('canvas');
      canvas.width = Math.max(1, Math.round(width * scale));
      canvas.height = Math.max(1, Math.round(height * scale));
      const context = canvas.getContext('2d');
      context.drawImage(image, 0, 0, canvas.width, canvas.height);
      canvas.toBlob((blob) => (blob ? resolve(blob) : reject(new Error('the browser could not encode the PNG'))), 'image/png');
    };
    image.onerror = () => reject(new Error('the chart could not be drawn as an image'));
    image.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(svgText)}`;
  });
}
