#!/usr/bin/env node
// Assembles the page in two forms:
//   build/web/        the page as separate files (web/*, wasm/gpumem.js and the wasm glue), to serve;
//   dist/gpumem.html  one self-contained file that works opened from file:// with no server;
// and the embed:
//   dist/gpumem-embed.js      one classic script defining <gpumem-calculator> (glue included);
//   dist/example-embed.html   web/example-embed.html: the element and the ?embed=1 iframe.
// build/web gets gpumem-embed.js and gpumem.html too, so its example page works when served.
// ES module imports of files do not work from file://, so the single file inlines the glue in a
// classic <script> and joins gpumem.js, charts.js and app.js into one <script type="module">.
//
// Usage: node scripts/assemble-web.mjs [--glue PATH] [--wrapper PATH] [--out-dir DIR] [--dist FILE]
// Environment: GPUMEM_GLUE, GPUMEM_WRAPPER, GPUMEM_WEB_OUT, GPUMEM_DIST override the same paths.
// Needs nothing beyond node.

import { readFileSync, writeFileSync, mkdirSync, readdirSync, copyFileSync, statSync, existsSync } from 'node:fs';
import { dirname, join, resolve, relative, basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

function argValue(name) {
  const i = process.argv.indexOf(name);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  const eq = process.argv.find((a) => a.startsWith(`${name}=`));
  return eq ? eq.slice(name.length + 1) : undefined;
}

const paths = {
  web: join(root, 'web'),
  glue: resolve(argValue('--glue') ?? process.env.GPUMEM_GLUE ?? join(root, 'build/wasm/wasm/gpumem_core.cjs')),
  wrapper: resolve(argValue('--wrapper') ?? process.env.GPUMEM_WRAPPER ?? join(root, 'wasm/gpumem.js')),
  outDir: resolve(argValue('--out-dir') ?? process.env.GPUMEM_WEB_OUT ?? join(root, 'build/web')),
  dist: resolve(argValue('--dist') ?? process.env.GPUMEM_DIST ?? join(root, 'dist/gpumem.html')),
};
// The embed script and example page are written beside the single-file page.
paths.distEmbed = join(dirname(paths.dist), 'gpumem-embed.js');
paths.distExample = join(dirname(paths.dist), 'example-embed.html');

function fail(message) {
  console.error(`assemble-web: ${message}`);
  process.exit(1);
}

for (const [what, path] of [['wasm glue', paths.glue], ['JS wrapper', paths.wrapper], ['page', join(paths.web, 'index.html')]]) {
  if (!existsSync(path)) fail(`${what} not found at ${path}${what === 'wasm glue' ? ' (build the gpumem_wasm target first, or pass --glue)' : ''}`);
}

// ---------- build/web: the files as they are ----------

mkdirSync(paths.outDir, { recursive: true });
const written = [];
for (const name of readdirSync(paths.web)) {
  const from = join(paths.web, name);
  if (!statSync(from).isFile()) continue;
  copyFileSync(from, join(paths.outDir, name));
  written.push(join(paths.outDir, name));
}
copyFileSync(paths.wrapper, join(paths.outDir, 'gpumem.js'));
copyFileSync(paths.glue, join(paths.outDir, 'gpumem_core.cjs'));
written.push(join(paths.outDir, 'gpumem.js'), join(paths.outDir, 'gpumem_core.cjs'));

// ---------- dist/gpumem.html: one file ----------

// Text placed inside <script> must not end the element early. "</script" and "<!--" are the two
// sequences the HTML tokenizer reacts to inside script data; both only occur inside JS strings,
// regular expressions or comments, where "<\/script" and "<\!--" mean the same.
function escapeScript(code) {
  return code.replace(/<\/(script)/gi, '<\\/$1').replace(/<!--/g, '<\\!--');
}

function escapeStyle(css) {
  return css.replace(/<\/(style)/gi, '<\\/$1');
}

// One module file → an IIFE that returns its named exports, so private top-level names of
// different files cannot collide once they share one <script>. Every import and export is on one
// line and names only (a project rule), which keeps this a line-by-line rewrite.
function moduleToIife(file, code, available) {
  const exports = [];
  const lines = code.split('\n').map((line, n) => {
    const where = `${relative(root, file)}:${n + 1}`;
    const imp = /^\s*import\s+(.*?)\s+from\s+['"]([^'"]+)['"];?\s*$/.exec(line);
    if (imp) {
      const names = /^\{([^}]*)\}$/.exec(imp[1].trim());
      if (!names) fail(`${where}: only named imports on one line are supported: ${line.trim()}`);
      for (const spec of names[1].split(',').map((s) => s.trim()).filter(Boolean)) {
        if (/\bas\b/.test(spec)) fail(`${where}: renamed imports are not supported: ${spec}`);
        if (!available.has(spec)) fail(`${where}: ${spec} is imported from ${imp[2]} but no earlier file exports it`);
      }
      return '';
    }
    if (/^\s*import[\s{('"]/.test(line) && !/^\s*import\s*\(/.test(line)) fail(`${where}: unsupported import form: ${line.trim()}`);
    if (/^\s*export\s+default\b/.test(line)) fail(`${where}: default exports are not supported`);
    const list = /^\s*export\s*\{([^}]*)\};?\s*$/.exec(line);
    if (list) {
      for (const spec of list[1].split(',').map((s) => s.trim()).filter(Boolean)) {
        if (/\bas\b/.test(spec)) fail(`${where}: renamed exports are not supported: ${spec}`);
        exports.push(spec);
      }
      return '';
    }
    const decl = /^(\s*)export\s+((?:async\s+)?function\*?\s+([A-Za-z_$][\w$]*)|class\s+([A-Za-z_$][\w$]*)|(?:const|let|var)\s+([A-Za-z_$][\w$]*))/.exec(line);
    if (decl) {
      exports.push(decl[3] ?? decl[4] ?? decl[5]);
      return line.replace(/^(\s*)export\s+/, '$1');
    }
    if (/^\s*export\b/.test(line)) fail(`${where}: unsupported export form: ${line.trim()}`);
    return line;
  });
  for (const name of exports) available.add(name);
  const body = lines.join('\n');
  const head = `// ---- ${basename(file)} ----\n`;
  if (!exports.length) return `${head}(() => {\n${body}\n})();\n`;
  return `${head}const { ${exports.join(', ')} } = (() => {\n${body}\nreturn { ${exports.join(', ')} };\n})();\n`;
}

// The page's panels (one module per panel, app.js last) call each other both ways (a panel
// re-estimates through app.js, app.js renders through the panels), which ES modules allow and
// per-file IIFEs cannot. They share one function scope in the bundle instead: imports dropped,
// `export` dropped, and two files declaring the same top-level name fail the build.
const PAGE_MODULES = ['page-state.js', 'setup-form.js', 'runtime-panel.js', 'model-panel.js', 'layers-panel.js',
  'errors.js', 'link.js', 'first-screen.js', 'option-field.js', 'finetune-panel.js', 'savers-panel.js', 'parallel-panel.js', 'host-panel.js', 'results-panel.js', 'gpu-panel.js', 'compare-panel.js', 'export-panel.js',
  'import-panel.js', 'solve-panel.js', 'views-panel.js', 'app.js'].filter((f) => existsSync(join(paths.web, f)));
const LIBRARY_MODULES = ['charts.js', 'setup-params.js', 'exports.js', 'engine.js', 'views.js', 'snapshot.js'];
for (const name of readdirSync(paths.web)) {
  if (name.endsWith('.js') && !PAGE_MODULES.includes(name) && !LIBRARY_MODULES.includes(name) && name !== 'worker.js' && name !== 'embed.js' && name !== 'wasm-preload.js') {
    fail(`web/${name} is not listed in PAGE_MODULES or LIBRARY_MODULES of scripts/assemble-web.mjs`);
  }
}

function pageModulesToScope(files, available) {
  const own = new Map();  // top-level name → file
  const declared = /^(?:export\s+)?(?:async\s+)?(?:function\*?\s+([A-Za-z_$][\w$]*)|(?:const|let|var|class)\s+([A-Za-z_$][\w$]*))/;
  for (const file of files) {
    readFileSync(file, 'utf8').split('\n').forEach((line, n) => {
      const m = declared.exec(line);
      if (!m) return;
      const name = m[1] ?? m[2];
      if (own.has(name)) fail(`${relative(root, file)}:${n + 1}: ${name} is also declared at the top of ${relative(root, own.get(name))}`);
      own.set(name, file);
    });
  }
  const parts = files.map((file) => {
    const lines = readFileSync(file, 'utf8').split('\n').map((line, n) => {
      const where = `${relative(root, file)}:${n + 1}`;
      const imp = /^\s*import\s+\{([^}]*)\}\s+from\s+['"]([^'"]+)['"];?\s*$/.exec(line);
      if (imp) {
        for (const spec of imp[1].split(',').map((x) => x.trim()).filter(Boolean)) {
          if (!available.has(spec) && !own.has(spec)) fail(`${where}: ${spec} is imported from ${imp[2]} but nothing exports it`);
        }
        return '';
      }
      if (/^\s*import[\s{('"]/.test(line) && !/^\s*import\s*\(/.test(line)) fail(`${where}: unsupported import form: ${line.trim()}`);
      if (/^\s*export\s+(default\b|\{)/.test(line)) fail(`${where}: only exports on declarations are supported in page modules`);
      return line.replace(/^export\s+/, '');
    });
    return `// ---- ${basename(file)} ----\n${lines.join('\n')}`;
  });
  return `(() => {\n${parts.join('\n')}\n})();\n`;
}

// The single-file page and the embed are written in ASCII, every other character escaped as
// what it is in: \uXXXX in scripts, \XXXX in styles, &#x…; in the HTML. A browser decodes a page
// with none into 8-bit strings: the single-file page's script then started 549 ms after the
// navigation instead of 677 (medians of 6, a 300-layer model's link, Chromium 156 on this
// 2-core machine), its 209 typographic characters having made 16-bit text of the 2.7 MB around
// them. The embed, loaded by documentation pages that may declare another charset, reads the
// same whatever they declare.
function asciiJs(code, where) {
  return code.replace(/[^\x00-\x7f]/g, (unit, at) => {
    // \… (an identity escape of the character) would become \\uXXXX, a backslash and text.
    if (code[at - 1] === '\\') fail(`${where}: a backslash before U+${unit.charCodeAt(0).toString(16)} cannot be escaped to ASCII`);
    return `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`;
  });
}
function asciiPage(text) {
  const ascii = text.replace(/(<script\b[^>]*>)([\s\S]*?)(<\/script>)|(<style\b[^>]*>)([\s\S]*?)(<\/style>)|[^\x00-\x7f]/gu,
    (match, scriptOpen, script, scriptClose, styleOpen, style, styleClose) => {
      if (scriptOpen) return `${scriptOpen}${asciiJs(script, 'a script of the page')}${scriptClose}`;
      if (styleOpen) return `${styleOpen}${style.replace(/[^\x00-\x7f]/gu, (c) => `\\${c.codePointAt(0).toString(16)} `)}${styleClose}`;
      return `&#x${match.codePointAt(0).toString(16)};`;
    });
  if (/[^\x00-\x7f]/.test(ascii)) fail('the page is not ASCII after escaping');
  return ascii;
}

const html = readFileSync(join(paths.web, 'index.html'), 'utf8');
const glue = readFileSync(paths.glue, 'utf8');
const available = new Set();
// In dependency order: a file may import only what an earlier one exports.
const moduleFiles = [paths.wrapper, ...LIBRARY_MODULES.map((f) => join(paths.web, f))];
const bundle = moduleFiles.map((f) => moduleToIife(f, readFileSync(f, 'utf8'), available)).join('\n')
  + pageModulesToScope(PAGE_MODULES.map((f) => join(paths.web, f)), available);

let page = html;
const swap = (pattern, replacement) => {
  const before = page;
  page = page.replace(pattern, () => replacement);
  if (page === before) fail(`index.html does not contain ${pattern}`);
};
// The wasm leaves the glue: its base64 goes in an element of its own, which web/wasm-preload.js
// decodes and starts compiling as soon as it is parsed (see there why). The glue keeps an empty
// data: URL it never reads: loadGpumem gives it the compiled module (Emscripten's
// instantiateWasm). The embed keeps the whole glue.
const WASM_URL = /(wasmBinaryFile\s*=\s*"data:application\/octet-stream;base64,)([A-Za-z0-9+/=]+)(")/;
const wasmMatch = WASM_URL.exec(glue);
if (!wasmMatch) fail(`the glue at ${paths.glue} has no embedded wasm (wasmBinaryFile="data:…;base64,…"); build it with -sSINGLE_FILE=1`);
const pageGlue = glue.replace(WASM_URL, (_, head, _base64, tail) => `${head}${tail}`);
// The glue's element has an id so web/engine.js can start a blob: Web Worker from the same text
// (and worker.js, which the browser does not run as text/plain, after it); the workers get the
// page's compiled module, so there is one copy of the wasm.
swap(/<script src="gpumem_core\.cjs"><\/script>/, `<script type="application/octet-stream" id="gpumem-wasm">${wasmMatch[2]}</script>\n`
  + `<script>\n${escapeScript(readFileSync(join(paths.web, 'wasm-preload.js'), 'utf8'))}\n</script>\n`
  + `<script id="gpumem-core-source">\n${escapeScript(pageGlue)}\n</script>\n`
  + `<script type="text/plain" id="gpumem-worker-source">\n${escapeScript(readFileSync(join(paths.web, 'worker.js'), 'utf8'))}\n</script>`);
swap(/<script type="module" src="app\.js"><\/script>/, `<script type="module">\n${escapeScript(bundle)}\n</script>`);
// A separate stylesheet, if the page links one, is inlined too.
page = page.replace(/<link rel="stylesheet" href="([^"]+)">/g, (_, href) => {
  const css = readFileSync(join(paths.web, href), 'utf8');
  return `<style>\n${escapeStyle(css)}\n</style>`;
});
// With everything inline, nothing is loaded from 'self': the policy drops it.
page = page.replace(/(<meta http-equiv="Content-Security-Policy" content=")([^"]*)(")/, (_, a, csp, b) => `${a}${csp.replace(/\s*'self'/g, '')}${b}`);
if (/<script[^>]+src=/.test(page)) fail('dist page still references an external script');
page = asciiPage(page);

mkdirSync(dirname(paths.dist), { recursive: true });
writeFileSync(paths.dist, page);

// ---------- dist/gpumem-embed.js: the custom element in one classic script ----------

// One function scope holds the glue and the modules, so a documentation page gets one global
// name only (the element). define/module/exports are shadowed so the glue never registers itself
// with an AMD or CommonJS loader the host page may have.
const embedFiles = [paths.wrapper, ...['charts.js', 'setup-params.js', 'embed.js'].map((f) => join(paths.web, f))];
const embedAvailable = new Set();
const embedBundle = embedFiles.map((f) => moduleToIife(f, readFileSync(f, 'utf8'), embedAvailable)).join('\n');
const embedScript = `/*! gpumem-embed.js: <gpumem-calculator>, GPU memory for training, computed in the browser (WebAssembly).
 * Usage: <script src="gpumem-embed.js"></script> <gpumem-calculator preset="gpt2" batch-size="8"></gpumem-calculator>
 * Attributes: see web/embed.js. Makes no network requests. */
(function () {
var define, module, exports;
${glue}
${embedBundle}
})();
`;
const embedAscii = asciiJs(embedScript, 'dist/gpumem-embed.js');
writeFileSync(paths.distEmbed, embedAscii);
// The example page and the element link to gpumem.html beside them; build/web has it too.
writeFileSync(join(paths.outDir, 'gpumem.html'), page);
written.push(join(paths.outDir, 'gpumem.html'));
writeFileSync(join(paths.outDir, 'gpumem-embed.js'), embedAscii);
written.push(join(paths.outDir, 'gpumem-embed.js'));
const examplePath = join(paths.web, 'example-embed.html');
if (existsSync(examplePath)) copyFileSync(examplePath, paths.distExample);

const kb = (n) => `${(n / 1024).toFixed(1)} KiB`;
for (const file of written) console.log(`${relative(root, file).padEnd(32)} ${kb(statSync(file).size)}`);
const raw = Buffer.byteLength(page);
console.log(`${relative(root, paths.dist).padEnd(32)} ${kb(raw)} (${raw} bytes; gzipped ${kb(gzipSync(page, { level: 9 }).length)})`);
const embedRaw = Buffer.byteLength(embedAscii);
console.log(`${relative(root, paths.distEmbed).padEnd(32)} ${kb(embedRaw)} (${embedRaw} bytes; gzipped ${kb(gzipSync(embedAscii, { level: 9 }).length)})`);
if (existsSync(examplePath)) console.log(`${relative(root, paths.distExample).padEnd(32)} ${kb(statSync(paths.distExample).size)}`);
