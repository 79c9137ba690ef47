// How fast an estimate is where people meet it: the wasm module through the JS API, the whole
// round trip the page pays on every keystroke (setup → JSON → wasm parse, simulate, replay,
// serialise → JS objects). Prints the median and 95th-percentile time per estimate for setups
// from small to large, and the sizes of what the page loads.
// Usage: node scripts/bench.mjs [runs]   (after scripts/build)
import { createRequire } from 'node:module';
import { statSync, readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem } from '../wasm/gpumem.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const runs = Number(process.argv[2] ?? 50);
const glue = path.join(root, 'build/wasm/wasm/gpumem_core.cjs');
const started = performance.now();
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(glue) });
const loadMs = performance.now() - started;

function deepLayers(blocks, width) {
  const layers = [];
  for (let i = 0; i < blocks; i++) {
    layers.push({ type: 'linear', inFeatures: width, outFeatures: width, bias: true }, { type: 'gelu' });
  }
  return layers;
}

const mlp = gpumem.options().examples.find((e) => e.id === 'mlp').setup;
const cases = [
  ['quick mode, 1.5e9 parameters', {}],
  ['MLP example (5 layers)', mlp],
  ['layer list, 200 layers', { ...mlp, model: { ...mlp.model, layers: deepLayers(100, 1024) } }],
  ['layer list, 2,000 layers', { ...mlp, model: { ...mlp.model, layers: deepLayers(1000, 1024) } }],
  ['GPT-2, 1 × 1024', { model: { preset: 'gpt2' }, training: { batchSize: 1, sequenceLength: 1024 } }],
  ['Llama 2 7B, 1 × 4096, sdpa', { model: { preset: 'llama-2-7b' },
    training: { batchSize: 1, sequenceLength: 4096, attention: 'sdpa' } }],
  ['Llama 3 8B, 1 × 8192, ckpt', { model: { preset: 'llama-3-8b' },
    training: { batchSize: 1, sequenceLength: 8192, attention: 'sdpa', checkpointing: 'everyBlock',
                precision: 'ampBf16' } }],
  ['Mixtral 8x7B, 1 × 4096', { model: { preset: 'mixtral-8x7b' },
    training: { batchSize: 1, sequenceLength: 4096, attention: 'sdpa', precision: 'bf16Mixed' } }],
];

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

console.log(`wasm module loaded in ${loadMs.toFixed(1)} ms (node ${process.version})`);
console.log(`${'setup'.padEnd(32)} ${'events'.padStart(7)} ${'median'.padStart(9)} ${'p95'.padStart(9)}`);
for (const [name, setup] of cases) {
  const text = JSON.stringify(setup);
  let estimate;
  for (let i = 0; i < 5; i++) estimate = gpumem.estimate(text);  // warm up
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    estimate = gpumem.estimate(text);
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  console.log(`${name.padEnd(32)} ${String(estimate.timelineEventCount ?? estimate.timeline.length).padStart(7)} ` +
              `${percentile(times, 0.5).toFixed(2).padStart(6)} ms ${percentile(times, 0.95).toFixed(2).padStart(6)} ms`);
}

// The solvers run the simulation many times (bisection on batch and sequence, one run per
// suggested change): timed once each, as the page runs them on a button press.
for (const [name, setup] of [
  ['solve: GPT-2, 8 × 1024 on 24 GiB', { model: { preset: 'gpt2' }, training: { batchSize: 8, sequenceLength: 1024 }, gpu: { memoryGiB: 24 } }],
  ['solve: Llama 2 7B, 1 × 4096 on 80 GiB', { model: { preset: 'llama-2-7b' }, training: { batchSize: 1, sequenceLength: 4096, attention: 'sdpa' } }],
]) {
  const t0 = performance.now();
  const solved = gpumem.solve(JSON.stringify(setup));
  console.log(`${name.padEnd(40)} ${(performance.now() - t0).toFixed(0).padStart(6)} ms, ${solved.suggestions.length} suggestions`);
}

for (const file of ['build/wasm/wasm/gpumem_core.cjs', 'dist/gpumem.html', 'dist/gpumem-embed.js']) {
  const full = path.join(root, file);
  const bytes = statSync(full).size;
  const gz = gzipSync(readFileSync(full), { level: 9 }).length;
  console.log(`${file.padEnd(34)} ${(bytes / 1024).toFixed(1).padStart(7)} KiB, gzipped ${(gz / 1024).toFixed(1)} KiB`);
}
