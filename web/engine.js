// Runs the core's long calls (the views, the solver) in Web Workers so the page never freezes:
// typing stays responsive, results arrive asynchronously, and stale work is dropped. Each lane
// (a pool of workers, one for the solver, several for the views) runs one call per worker at a
// time; submitting new work replaces whatever still waits in that lane, and a result of
// replaced work is dropped. When no worker can start (an old
// browser, a policy without worker-src blob:, ?worker=0), the same lanes run the calls on the
// page's thread, one per task, through the wasm module the page already has.
//
// Worker source: in the single-file page the glue's <script id="gpumem-core-source"> and
// worker.js's <script type="text/plain" id="gpumem-worker-source"> are joined into one blob:
// (scripts/assemble-web.mjs); served, worker.js loads gpumem_core.cjs beside it.

import { requestText, resultOfEnvelope, GpumemError } from './gpumem.js';

// A worker that has not said 'ready' by then is given up for the page's thread.
const WORKER_START_TIMEOUT_MS = 20000;

let blobUrl = null;

function makeWorker() {
  const glue = document.getElementById('gpumem-core-source');
  const source = document.getElementById('gpumem-worker-source');
  if (glue && source) {
    if (!blobUrl) {
      blobUrl = URL.createObjectURL(new Blob([glue.textContent, '\n;\n', source.textContent], { type: 'text/javascript' }));
    }
    return new Worker(blobUrl, { name: 'gpumem' });
  }
  return new Worker('worker.js', { name: 'gpumem' });
}

// One worker of a pool: it takes the pool's next waiting job whenever it is free.
class Lane {
  constructor(name, api, useWorker, pool) {
    this.name = name;
    this.api = api;
    // 'idle' (a worker not yet started) | 'starting' | 'worker' | 'sync'. A worker starts on the
    // lane's first job or on start(): each one parses the glue and instantiates the wasm module
    // on a core of its own, and on a 2-core machine three of them starting beside the page's
    // first estimate and layout slowed the first answer (issue 14's 2 s target).
    this.mode = useWorker ? 'idle' : 'sync';
    this.worker = null;
    this.pool = pool;       // its queue and generation
    this.current = null;    // the job in flight
    this.nextId = 1;
    this.fallbackReason = useWorker ? '' : 'workers disabled (?worker=0)';
  }

  start() {
    if (this.mode === 'idle') this.startWorker();
  }

  startWorker() {
    try {
      this.worker = makeWorker();
    } catch (error) {
      this.fallBack(`the worker could not start: ${error?.message ?? error}`);
      return;
    }
    this.mode = 'starting';
    this.startTimer = setTimeout(() => this.fallBack('the worker did not start in time'), WORKER_START_TIMEOUT_MS);
    this.sendInit(this.worker);
    this.worker.onmessage = (event) => this.onMessage(event.data);
    this.worker.onerror = (event) => {
      event.preventDefault?.();
      this.fallBack(`the worker failed: ${event.message ?? 'unknown error'}`);
    };
  }

  // The worker's first message: the page's compiled wasm module when it has one (the single-file
  // page's glue carries no wasm; web/wasm-preload.js), so the worker neither decodes nor compiles
  // it again. A browser that cannot pass a module gets the bytes; served, the worker's glue has
  // its own (module and bytes null).
  sendInit(worker) {
    const wasm = this.pool.wasm;
    Promise.resolve(wasm?.module).then((module) => {
      if (this.worker !== worker) return;
      try {
        worker.postMessage({ type: 'init', module: module ?? null });
      } catch {
        worker.postMessage({ type: 'init', module: null, bytes: wasm?.bytes ?? null });
      }
    }, (error) => this.fallBack(`the wasm module did not compile: ${error?.message ?? error}`));
  }

  fallBack(reason) {
    clearTimeout(this.startTimer);
    if (this.mode === 'sync') return;
    this.worker?.terminate();
    this.worker = null;
    this.mode = 'sync';
    this.fallbackReason = reason;
    // A call that was in flight in the worker runs again here.
    if (this.current) {
      const job = this.current;
      this.current = null;
      this.pool.queue.unshift(job);
    }
    this.pump();
  }

  onMessage(message) {
    if (!message) return;
    if (message.type === 'ready') {
      clearTimeout(this.startTimer);
      this.mode = 'worker';
      this.pump();
    } else if (message.type === 'failed') {
      this.fallBack(`the worker's module failed: ${message.message}`);
    } else if (message.type === 'result' && this.current && message.id === this.current.id) {
      this.finish(message.envelope, message.ms);
    }
  }

  // Ends the call in flight in the worker (whose result is then never read) and starts a fresh
  // worker; a call on the page's thread runs to its end.
  abandonCall() {
    if (this.current === null || !this.worker || this.mode === 'sync') return;
    clearTimeout(this.startTimer);
    this.worker.terminate();
    this.worker = null;
    this.current = null;
    this.startWorker();
  }

  pump() {
    if (this.current || !this.pool.queue.length) return;
    // The worker's 'ready' (or its fallback to the page's thread) pumps again.
    if (this.mode === 'idle') {
      this.startWorker();
      return;
    }
    if (this.mode === 'starting') return;
    const job = this.pool.queue.shift();
    job.id = this.nextId++;
    job.sentAt = performance.now();
    this.current = job;
    if (this.mode === 'worker') {
      this.worker.postMessage({ id: job.id, kind: job.kind, text: job.text });
      return;
    }
    // The page's thread: one call per task, so input events run between calls.
    setTimeout(() => {
      if (this.current !== job) return;
      const started = performance.now();
      let envelope;
      try {
        envelope = this.api.envelope(job.kind, job.text);
      } catch (error) {
        const errors = error instanceof GpumemError ? error.errors : [{ code: 'internal', field: '', message: String(error) }];
        envelope = JSON.stringify({ ok: false, errors });
      }
      this.finish(envelope, performance.now() - started);
    }, 0);
  }

  finish(envelope, coreMs) {
    const job = this.current;
    this.current = null;
    if (job.generation === this.pool.generation) {
      const outcome = { kind: job.kind, coreMs, roundTripMs: performance.now() - job.sentAt, inWorker: this.mode === 'worker' };
      try {
        outcome.result = resultOfEnvelope(envelope, job.kind === 'solve' ? 'solve' : job.kind);
      } catch (error) {
        outcome.errors = error instanceof GpumemError ? error.errors : [{ code: 'internal', field: '', message: String(error) }];
      }
      job.onResult(outcome);
    }
    this.pump();
  }
}

// Lanes (workers) taking jobs from one queue, each the next waiting job when it is free: one for
// the solver, several for the views, whose work is split into parts (the heat map's cells, the
// two curves; docs/schema.md "part") so that a machine's cores share one view. Each worker is
// its own wasm instance (about 30 MiB of memory after the largest presets' views).
class Pool {
  constructor(name, api, useWorker, size, wasm) {
    this.queue = [];        // jobs not yet started, all of the latest submission
    this.generation = 0;    // bumped by every submit(); older results are dropped
    this.wasm = wasm;       // {module, bytes} of the page's compiled wasm, or null
    this.lanes = Array.from({ length: size }, (_, i) => new Lane(size === 1 ? name : `${name}-${i}`, api, useWorker, this));
  }

  get size() {
    return this.lanes.length;
  }

  // The latest submission replaces what waits; its generation marks the jobs.
  submit(jobs, onResult) {
    this.generation += 1;
    const generation = this.generation;
    this.queue = jobs.map((job) => ({ ...job, generation, onResult }));
    for (const lane of this.lanes) lane.pump();
  }

  // Drops every waiting job and any result still to come.
  cancel() {
    this.generation += 1;
    this.queue = [];
  }

  // Cancels, and stops the calls in flight too: their workers are ended and fresh ones started
  // (a call on the page's thread cannot be interrupted; its result is dropped). True when a
  // call was in flight.
  stop() {
    this.cancel();
    const busy = this.lanes.some((lane) => lane.current !== null);
    for (const lane of this.lanes) lane.abandonCall();
    return busy;
  }

  start() {
    for (const lane of this.lanes) lane.start();
  }

  // The pool's mode: 'worker' when any lane runs in a worker, else the first lane's.
  get mode() {
    return this.lanes.some((lane) => lane.mode === 'worker') ? 'worker' : this.lanes[0].mode;
  }

  get fallbackReason() {
    return this.lanes.map((lane) => lane.fallbackReason).find(Boolean) ?? '';
  }
}

// How many workers share the views: the machine's cores (navigator.hardwareConcurrency), at
// most 4 and at least 2, so that on two cores the heat map's halves run side by side while the
// page's thread mostly waits.
export function viewWorkers(hardwareConcurrency = globalThis.navigator?.hardwareConcurrency) {
  const cores = Number.isFinite(hardwareConcurrency) && hardwareConcurrency > 0 ? Math.floor(hardwareConcurrency) : 2;
  return Math.min(4, Math.max(2, cores));
}

// api: the page's loaded gpumem API (for the fallback). Lanes: 'views' (a pool of viewLanes
// workers), 'solve' and 'parallel' (fewest GPUs), so a long solve never delays the views. The
// 'parallel' lane's worker (one more wasm instance) starts only when that lane is first used.
// wasm: {module (a WebAssembly.Module or a promise of one), bytes} when the page compiled the
// wasm itself (web/wasm-preload.js); the workers are handed it.
export function createEngine(api, { useWorker = typeof Worker === 'function', viewLanes = viewWorkers(), wasm = null } = {}) {
  // Without workers the pool is one lane: on the page's thread, parts would only add work.
  const lanes = { views: new Pool('views', api, useWorker, useWorker ? viewLanes : 1, wasm), solve: new Pool('solve', api, useWorker, 1, wasm) };
  const lazyLanes = new Set(['parallel']);
  const lane = (name) => {
    if (!lanes[name] && lazyLanes.has(name)) lanes[name] = new Pool(name, api, useWorker, 1, wasm);
    return lanes[name];
  };
  return {
    // Runs calls in a lane: [{kind, setup, options}] → onResult(outcome) for each, unless a
    // later run() on the same lane replaced them. A lane of one worker runs them one after
    // another, in order; the views' as many at once as it has workers, each result as it comes.
    run(laneName, calls, onResult) {
      const jobs = calls.map(({ kind, setup, options }) => ({ kind, text: requestText(kind, setup, options) }));
      lane(laneName).submit(jobs, onResult);
    },
    cancel(laneName) {
      lanes[laneName]?.cancel();
    },
    // How many calls the lane runs at once: the parts to split its work into.
    workers(laneName) {
      return lane(laneName)?.size ?? 1;
    },
    // Ends the lane's call in flight (restarting its worker) and drops what waits.
    stop(laneName) {
      return lanes[laneName]?.stop() ?? false;
    },
    // Starts the workers not yet started (the views' and the solver's; 'parallel' starts when
    // first used): the page calls it once its first answer is on the screen.
    start() {
      for (const pool of Object.values(lanes)) pool.start();
    },
    // 'idle', 'starting', 'worker' or 'sync' per lane, and why a lane runs on the page's thread.
    status() {
      return Object.fromEntries(Object.entries(lanes).map(([name, lane]) => [name, { mode: lane.mode, fallbackReason: lane.fallbackReason }]));
    },
  };
}
