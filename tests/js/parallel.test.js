// Many GPUs through the JS API (wasm/gpumem.js over the real wasm build): the estimate's rank
// and where each model state lives (rank.holds), the DeepSpeed and Megatron imports, the fewest
// GPUs, and the worker's request text. Run from the repository root with `node --test tests/js/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadGpumem, GpumemError, CALLS, requestText } from '../../wasm/gpumem.js';
import { setupFromParams } from '../../web/setup-params.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const wasmJs = process.env.GPUMEM_WASM_JS
  ? path.resolve(process.env.GPUMEM_WASM_JS)
  : path.join(repoRoot, 'build', 'wasm', 'wasm', 'gpumem_core.cjs');
const gpumem = await loadGpumem({ factory: createRequire(import.meta.url)(wasmJs) });

// The ZeRO paper's §3 example: 7.5B parameters, mixed-precision Adam (K = 12), 64 GPUs.
function zeroPaper(stage) {
  return { model: { kind: 'parameterCount', parameterCount: 7.5e9 }, training: { precision: 'fp16Mixed', optimizer: 'adam' }, parallel: { dataParallel: 64, zeroStage: stage } };
}

test('one GPU has no rank object: the page draws no cluster', () => {
  assert.equal(gpumem.estimate(gpumem.defaultSetup()).rank, undefined);
});

test('the ZeRO paper: 120 / 31.4 / 16.6 / 1.9 GB per rank, and what each stage shards', () => {
  const expected = [
    // DDP keeps the whole 16Ψ plus the reducer's buckets in the gradients.
    { stage: 1, bytes: 31_406_250_000, holds: { parameters: 'replicated', masterWeights: 'sharded', gradients: 'replicated', optimizerStates: 'sharded' } },
    { stage: 2, bytes: 16_640_625_000, holds: { parameters: 'replicated', masterWeights: 'sharded', gradients: 'sharded', optimizerStates: 'sharded' } },
    { stage: 3, bytes: 1_875_000_000, holds: { parameters: 'sharded', masterWeights: 'sharded', gradients: 'sharded', optimizerStates: 'sharded' } },
  ];
  for (const { stage, bytes, holds } of expected) {
    const est = gpumem.estimate(zeroPaper(stage));
    assert.equal(est.modelStates.totalBytes, bytes, `stage ${stage}`);
    assert.equal(est.rank.worldSize, 64);
    assert.equal(est.rank.shardWorld, 64);
    assert.equal(est.rank.engine, `DeepSpeed ZeRO-${stage}`);
    assert.deepEqual(est.rank.holds, holds, `stage ${stage}`);
  }
  const ddp = gpumem.estimate(zeroPaper(0));
  assert.equal(ddp.rank.engine, 'DDP');
  assert.deepEqual(Object.values(ddp.rank.holds), ['replicated', 'replicated', 'replicated', 'replicated']);
});

test('FSDP with the optimizer offloaded: sharded parameters, no master, states and gradients on the host', () => {
  const est = gpumem.estimate({ model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed' }, parallel: { dataParallel: 8, fsdp: 'FULL_SHARD', offload: 'optimizer' } });
  assert.deepEqual(est.rank.holds, { parameters: 'sharded', masterWeights: 'none', gradients: 'host', optimizerStates: 'host' });
  assert.equal(est.modelStates.gradientsBytes, 0);
  assert.equal(est.modelStates.optimizerStatesBytes, 0);
  // The fp32 FlatParameter shards: 1/8 of the (padded) parameters, 4 bytes each.
  assert.ok(Math.abs(est.modelStates.parametersBytes - (est.modelStates.parameterCount * 4) / 8) < 8 * 4 * 40);
});

test('torch ZeroRedundancyOptimizer shards only the optimizer states', () => {
  const est = gpumem.estimate({ model: { kind: 'parameterCount', parameterCount: 1e9 }, training: { precision: 'fp32' }, parallel: { dataParallel: 4, zeroRedundancyOptimizer: true } });
  assert.equal(est.rank.engine, 'DDP + ZeroRedundancyOptimizer');
  assert.deepEqual(est.rank.holds, { parameters: 'replicated', masterWeights: 'replicated', gradients: 'replicated', optimizerStates: 'sharded' });
});

test('importDeepSpeed: "auto" resolved from the base model, the rest onto the setup', () => {
  const config = { zero_optimization: { stage: 2, reduce_bucket_size: 'auto', overlap_comm: true }, bf16: { enabled: true }, gradient_accumulation_steps: 4, some_unknown_key: 1 };
  const r = gpumem.importDeepSpeed(JSON.stringify(config), { model: { preset: 'llama-2-7b' } });
  assert.equal(r.setup.parallel.zeroStage, 2);
  assert.equal(r.setup.parallel.reduceBucketSize, 4096 * 4096);  // h² (transformers' trainer_config_finalize)
  assert.equal(r.setup.parallel.overlapComm, 'true');
  assert.equal(r.setup.parallel.gradientAccumulationSteps, 4);
  assert.equal(r.setup.training.precision, 'bf16Mixed');
  assert.ok(r.ignoredFields.includes('some_unknown_key'), JSON.stringify(r.ignoredFields));
  assert.ok(r.notes.some((n) => n.includes('16777216')));
  // Without a base: the defaults' model (GPT-2 XL-sized quick mode) is the base.
  assert.equal(gpumem.importDeepSpeed('{"zero_optimization":{"stage":3}}').setup.parallel.zeroStage, 3);
});

test('importDeepSpeed: bad text and bad values are errors, not exceptions from the core', () => {
  assert.throws(() => gpumem.importDeepSpeed('{not json'), (e) => e instanceof GpumemError && e.code === 'malformedJson');
  assert.throws(() => gpumem.importDeepSpeed('{"zero_optimization":{"stage":7}}'), (e) => e instanceof GpumemError && e.field.includes('stage'));
  assert.throws(() => gpumem.importDeepSpeed('{}', { training: { batchSize: -1 } }), (e) => e instanceof GpumemError && e.field === 'training.batchSize');
});

test("importMegatron: Megatron-LM's parallel arguments", () => {
  const r = gpumem.importMegatron('--tensor-model-parallel-size 2 --use-distributed-optimizer --seq-length 4096 --unknown-flag', { model: { preset: 'llama-2-7b' } });
  assert.equal(r.setup.parallel.tensorParallel, 2);
  assert.equal(r.setup.parallel.zeroStage, 1);  // the distributed optimizer, as ZeRO-1
  assert.ok(r.ignoredFields.includes('--unknown-flag'), JSON.stringify(r.ignoredFields));
  assert.throws(() => gpumem.importMegatron('--tensor-model-parallel-size zero'), GpumemError);
});

test('fewestGpus: the layout found is one the estimate says fits, with the same device figure', () => {
  const setup = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed', batchSize: 1, sequenceLength: 1024 }, gpu: { memoryGiB: 40 } };
  const one = gpumem.estimate(setup);
  assert.equal(one.gpu.fits, false, 'a 7B model with Adam does not fit on one 40 GiB GPU');
  const r = gpumem.fewestGpus(setup);
  assert.equal(r.found, true);
  assert.ok(r.gpus >= 1 && r.estimatesRun >= 1);
  // r.setup is the whole winning setup: the model and training as given, its parallel section.
  assert.equal(r.setup.model.architecture.hiddenSize, 4096);
  const check = gpumem.estimate(r.setup);
  assert.equal(check.device.peakDeviceBytes, r.peakDeviceBytes);
  assert.equal(check.gpu.fits, true);
  assert.equal(check.rank.worldSize, r.gpus);
  assert.throws(() => gpumem.fewestGpus({ parallel: { dataParallel: 0 } }), (e) => e instanceof GpumemError && e.field === 'parallel.dataParallel');
});

test('fewestGpus: an offloading answer states its host memory per node and the answer without offloading; a stated host bounds it', () => {
  const setup = { model: { preset: 'llama-2-7b' }, training: { precision: 'bf16Mixed', batchSize: 1, sequenceLength: 1024 }, gpu: { memoryGiB: 40 } };
  const r = gpumem.fewestGpus(setup);
  assert.equal(r.offload, true);
  const est = gpumem.estimate(r.setup);
  assert.equal(r.hostNodeBytes, est.host.nodeBytes);
  assert.ok(r.hostNodeBytes > 0);
  assert.equal(est.host.capacityBytes, undefined, 'not stated: no capacity in the estimate');
  assert.ok(r.withoutOffload.gpus > r.gpus);
  assert.equal(r.withoutOffload.offload, false);
  assert.equal(gpumem.estimate(r.withoutOffload.setup).device.peakDeviceBytes, r.withoutOffload.peakDeviceBytes);
  // A node with less host RAM than that layout keeps there: skipped, and the estimate says why.
  const gib = (r.hostNodeBytes - 1) / 2 ** 30;
  const bounded = gpumem.fewestGpus({ ...setup, runtime: { hostMemoryGiB: gib } });
  assert.ok(bounded.hostTooSmall > 0);
  assert.ok(bounded.gpus > r.gpus);
  const over = gpumem.estimate({ ...r.setup, runtime: { ...r.setup.runtime, hostMemoryGiB: gib } });
  assert.equal(over.host.fits, false);
  assert.equal(over.host.capacityBytes, Math.round(gib * 2 ** 30));
  assert.ok(over.notes.some((n) => n.startsWith('Host memory:')), JSON.stringify(over.notes));
  assert.throws(() => gpumem.estimate({ runtime: { hostMemoryGiB: -1 } }), (e) => e instanceof GpumemError && e.field === 'runtime.hostMemoryGiB');
});

test('the worker runs fewestGpus from the setup text, as the page thread would', () => {
  assert.equal(CALLS.fewestGpus, 'fewestGpusJson');
  const setup = { model: { kind: 'parameterCount', parameterCount: 1e9 }, gpu: { memoryGiB: 8 } };
  assert.equal(requestText('fewestGpus', setup), JSON.stringify(setup));
  const viaEnvelope = JSON.parse(gpumem.envelope('fewestGpus', requestText('fewestGpus', setup)));
  assert.equal(viaEnvelope.ok, true);
  assert.deepEqual(viaEnvelope.fewestGpus, gpumem.fewestGpus(setup));
});

test('the embed attributes build the parallel section', () => {
  const attributes = { preset: 'llama-2-7b', 'data-parallel': '8', 'zero-stage': '3', offload: 'optimizer', 'tensor-parallel': '1', 'gradient-accumulation-steps': '2' };
  const { setup, problems } = setupFromParams((name) => attributes[name] ?? null);
  assert.deepEqual(problems, []);
  assert.deepEqual(setup.parallel, { dataParallel: 8, zeroStage: 3, offload: 'optimizer', tensorParallel: 1, gradientAccumulationSteps: 2 });
  const est = gpumem.estimate(setup);
  assert.equal(est.rank.worldSize, 8);
  assert.equal(est.rank.holds.optimizerStates, 'host');
  const fsdp = setupFromParams((name) => ({ 'data-parallel': '4', fsdp: 'SHARD_GRAD_OP' })[name] ?? null).setup;
  assert.equal(gpumem.estimate(fsdp).rank.engine, 'FSDP SHARD_GRAD_OP');
});

test('the embed attributes reach pipeline, sequence, context and expert parallelism', () => {
  const attributes = { preset: 'llama-2-7b', precision: 'bf16Mixed', attention: 'sdpa', 'sequence-length': '1024', 'data-parallel': '2', 'tensor-parallel': '2', 'sequence-parallel': 'true', 'pipeline-parallel': '1', 'context-parallel': '2' };
  const { setup, problems } = setupFromParams((name) => attributes[name] ?? null);
  assert.deepEqual(problems, []);
  assert.deepEqual(setup.parallel, { dataParallel: 2, tensorParallel: 2, sequenceParallel: true, pipelineParallel: 1, contextParallel: 2 });
  const est = gpumem.estimate(setup);
  assert.equal(est.rank.worldSize, 8);
  const pipeline = setupFromParams((name) => ({ preset: 'gpt2', 'pipeline-parallel': '2', 'pipeline-schedule': 'gpipe', 'gradient-accumulation-steps': '4' })[name] ?? null).setup;
  assert.deepEqual(pipeline.parallel, { pipelineParallel: 2, pipelineSchedule: 'gpipe', gradientAccumulationSteps: 4 });
  assert.equal(gpumem.estimate(pipeline).rank.worldSize, 2);
  // Unequal stages and the simulated stage (Megatron's --decoder-first/last-pipeline-num-layers).
  const uneven = setupFromParams((name) => ({ preset: 'gpt2', 'pipeline-parallel': '4', 'pipeline-first-stage-layers': '2',
    'pipeline-last-stage-layers': '4', 'pipeline-stage': '0', 'gradient-accumulation-steps': '4' })[name] ?? null).setup;
  assert.deepEqual(uneven.parallel, { pipelineParallel: 4, pipelineStage: 0, pipelineFirstStageLayers: 2,
    pipelineLastStageLayers: 4, gradientAccumulationSteps: 4 });
  const two = gpumem.estimate(uneven);
  assert.equal(two.rank.pipelineStage, 0);
  // Four layers on the first stage instead of two: two GPT-2 blocks more, 12h² + 13h = 7,087,872 each.
  const four = gpumem.estimate({ ...uneven, parallel: { ...uneven.parallel, pipelineFirstStageLayers: 4, pipelineLastStageLayers: 2 } });
  assert.equal(four.modelStates.parameterCount - two.modelStates.parameterCount, 2 * 7087872);
  // A value that is no boolean goes to the core, whose error names the field.
  const bad = setupFromParams((name) => ({ preset: 'gpt2', 'sequence-parallel': 'maybe' })[name] ?? null).setup;
  assert.equal(bad.parallel.sequenceParallel, 'maybe');
  assert.throws(() => gpumem.estimate(bad), (e) => e instanceof GpumemError && e.field === 'parallel.sequenceParallel');
});

test('layouts: every row fits as the estimate says, and the worker runs the same request', () => {
  const setup = { model: { preset: 'gpt2' }, training: { sequenceLength: 256 } };
  const r = gpumem.layouts(setup, { gpus: 4 });
  assert.ok(r.rows.length > 0);
  assert.equal(r.candidates, r.refused + r.dominated + r.estimates + r.notEstimated);
  for (const row of r.rows) {
    assert.equal(row.dataParallel * row.tensorParallel * row.pipelineParallel, 4);
    const check = gpumem.estimate(row.setup);
    assert.equal(check.device.peakDeviceBytes, row.peakDeviceBytes);
    assert.equal(check.gpu.fits, true);
  }
  assert.equal(CALLS.layouts, 'layoutsJson');
  const text = requestText('layouts', setup, { gpus: 4 });
  assert.equal(text, `{"setup":${JSON.stringify(setup)},"gpus":4}`);
  const viaEnvelope = JSON.parse(gpumem.envelope('layouts', text));
  assert.deepEqual(viaEnvelope.layouts, r);
  assert.throws(() => gpumem.layouts(setup, { gpus: 0 }), (e) => e instanceof GpumemError && e.field === 'gpus');
  assert.throws(() => gpumem.layouts(setup, { gpus: '8' }), (e) => e instanceof GpumemError && e.field === 'gpus');
});

test('importAccelerate reads accelerate\'s FSDP YAML onto the setup', () => {
  const yaml = 'distributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 8\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_use_orig_params: true\n';
  const r = gpumem.importAccelerate(yaml, { model: { preset: 'gpt2' } });
  assert.equal(r.setup.parallel.fsdp, 'SHARD_GRAD_OP');
  assert.equal(r.setup.parallel.dataParallel, 8);
  assert.equal(r.setup.training.precision, 'bf16Mixed');
  assert.ok(r.ignoredFields.includes('fsdp_config.fsdp_use_orig_params'));
  assert.throws(() => gpumem.importAccelerate('a:\n  - 1\n'), (e) => e instanceof GpumemError && e.field === 'line 2');
});

test('host memory crosses the boundary: ZeRO-2 offload of 1.5B on 8 ranks, none without offload', () => {
  const base = { model: { kind: 'parameterCount', parameterCount: 1.5e9 }, training: { precision: 'fp16Mixed', optimizer: 'adam' } };
  assert.equal(gpumem.estimate({ ...base, parallel: { dataParallel: 8, zeroStage: 2 } }).host, undefined);
  const host = gpumem.estimate({ ...base, parallel: { dataParallel: 8, zeroStage: 2, offload: 'optimizer' } }).host;
  // 1.5e9 / 8 = 187,500,000 per rank (already a multiple of 2 × 8): master 4 + Adam 8 + fp32 gradients 4 B.
  assert.deepEqual(host.rows.map((r) => [r.label, r.bytes, r.memory]), [
    ['fp32 master partition', 750_000_000, 'pageable'],
    ['optimizer states', 1_500_000_000, 'pageable'],
    ['fp32 gradient partition', 750_000_000, 'pageable'],
  ]);
  assert.equal(host.rankBytes, 3_000_000_000);
  assert.equal(host.pinnedBytes, 0);
  assert.equal(host.ranksPerNode, 8);
  assert.equal(host.nodeBytes, 24_000_000_000);
});
