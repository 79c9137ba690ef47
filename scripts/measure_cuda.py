#!/usr/bin/env python3
"""CUDA truth: what PyTorch's allocator and the driver really hold for the runs of
tests/data/cuda/cases.json (scripts/cuda_cases.py). Runs on a machine with an NVIDIA GPU,
PyTorch 2.x, transformers and peft; builds every model from its config with random weights.

Each case runs in a fresh process (its own CUDA context, a clean allocator), HF Trainer's way:
the model moved to the GPU in its precision's dtype, one AdamW (foreach, PyTorch's CUDA default)
over what trains, then two steps of (batch to the GPU, forward under autocast where the
precision says so, backward, step, zero_grad(set_to_none=True)). Recorded per phase:
`max_memory_allocated` / `max_memory_reserved` (each phase's peak, the peak statistics reset
between phases), `memory_stats()` at the end, and NVML's used memory (the device's, less what was
used before the process started: what nvidia-smi shows for it).

Two probes come first, each in a process of its own: the CUDA context with lazy and with eager
module loading (NVML after the first 1-element tensor, less its 2 MiB segment), and the cuBLAS /
cuBLASLt workspaces (allocated bytes a first matmul leaves behind on the Python thread, and in
backward on autograd's device thread).

Usage (on the GPU machine): python3 scripts/measure_cuda.py OUT_DIR [case-name ...]
Writes OUT_DIR/cuda.jsonl, one JSON object per probe or case, as each ends.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = os.path.join(ROOT, "tests", "data", "cuda", "cases.json")
CASE_TIMEOUT_S = 170
TOTAL_BUDGET_S = float(os.environ.get("MEASURE_BUDGET_S", "540"))
MiB = 1 << 20


def nvml_used():
    """Bytes NVML counts as used on GPU 0 (the device total nvidia-smi prints)."""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = pynvml.nvmlDeviceGetMemoryInfo(h).used
    return used


def nvml_process_used():
    """This process's used bytes as NVML lists it (None where the process is not listed)."""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None


def versions():
    import torch
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0),
         "capability": list(torch.cuda.get_device_capability(0)),
         "totalMemory": torch.cuda.get_device_properties(0).total_memory}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes"):
        try:
            v[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - a missing package is a fact to record
            v[name] = f"missing ({type(e).__name__})"
    try:
        import pynvml
        pynvml.nvmlInit()
        v["driver"] = pynvml.nvmlSystemGetDriverVersion()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v["nvmlTotal"] = pynvml.nvmlDeviceGetMemoryInfo(h).total
    except Exception as e:  # noqa: BLE001
        v["driver"] = f"unknown ({e})"
    v["env"] = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF",
                                               "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                               "TORCH_CUBLASLT_UNIFIED_WORKSPACE")}
    return v


def snapshot_memory(torch):
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "maxAllocated": torch.cuda.max_memory_allocated(), "maxReserved": torch.cuda.max_memory_reserved()}


# ---------------------------------------------------------------------------------------------
# Probes.

def probe_context(baseline):
    """The context: NVML's used bytes after the first tiny tensor, less the baseline and the
    2 MiB small-pool segment the tensor opened; then again after a bf16 and an fp32 matmul, an
    SDPA forward/backward and a LayerNorm, which load more kernel images lazily."""
    import torch
    out = {"probe": "context", "moduleLoading": os.environ.get("CUDA_MODULE_LOADING", "LAZY(default)")}
    t0 = time.time()
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    out["initSeconds"] = time.time() - t0
    out["afterFirstTensor"] = {"nvmlUsed": nvml_used() - baseline, "processUsed": nvml_process_used(),
                               **snapshot_memory(torch)}
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    f = torch.randn(1024, 1024, device="cuda")
    (f @ f).sum().item()
    q = torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    ln = torch.nn.LayerNorm(1024).cuda()
    ln(f).sum().backward()
    torch.cuda.synchronize()
    del a, f, q, ln
    out["afterKernels"] = {"nvmlUsed": nvml_used() - baseline, "processUsed": nvml_process_used(),
                           **snapshot_memory(torch)}
    out["versions"] = versions()
    del x
    return out


def probe_workspaces():
    """Allocated bytes left behind by the first matmuls: the cuBLAS workspace of the Python
    thread's handle, then of the backward thread's, and the cuBLASLt one (addmm with a bias goes
    through cublasLt's epilogue)."""
    import torch
    out = {"probe": "workspaces"}
    x = torch.ones(1, device="cuda")
    steps = []

    def mark(label):
        torch.cuda.synchronize()
        steps.append({"label": label, **snapshot_memory(torch), "segments": len(torch.cuda.memory_snapshot())})

    mark("first tensor")
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    mark("bf16 operand")
    c = a @ a
    mark("bf16 mm (output 512 KiB kept)")
    del c
    mark("output freed")
    w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    c = torch.nn.functional.linear(a, w, bias)
    del c
    mark("bf16 linear with bias (addmm, Lt epilogue) freed")
    f = torch.randn(512, 512, device="cuda")
    c = f @ f
    del c
    mark("fp32 mm freed")
    wg = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = (a @ wg).sum()
    mark("forward for backward")
    y.backward()
    del y
    mark("backward (autograd device thread) done, loss freed")
    out["steps"] = steps
    out["blocks"] = [{"size": s["total_size"], "pool": s["segment_type"], "stream": s["stream"],
                      "blocks": [(b["size"], b["state"]) for b in s["blocks"]]}
                     for s in torch.cuda.memory_snapshot()]
    del x, a, w, bias, f, wg
    return out


# ---------------------------------------------------------------------------------------------
# A training case.

def build_model(case, torch):
    import transformers
    cfg = dict(case["hfConfig"])
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    cfg.pop("torch_dtype", None)
    cfg.pop("transformers_version", None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    dtype = torch.bfloat16 if case["precision"] in ("bf16", "bf16Mixed") else torch.float32
    if case["task"] == "sequenceClassification":
        config.num_labels = 2
        cls = transformers.AutoModelForSequenceClassification
    else:
        cls = transformers.AutoModelForCausalLM
    kwargs = {"attn_implementation": case["attention"]}
    # Built on the GPU (random init there is fast); Trainer's from_pretrained + .to("cuda")
    # would allocate the same parameters one by one.
    with torch.device("cuda"):
        try:
            model = cls.from_config(config, dtype=dtype, **kwargs)
        except TypeError:
            model = cls.from_config(config, torch_dtype=dtype, **kwargs)
    return model, dtype


def run_case(case, baseline, out_dir):
    import torch
    result = {"case": case["name"], "versions": versions()}
    torch.manual_seed(0)
    x = torch.ones(1, device="cuda")  # the context first, as the probe measured it
    torch.cuda.synchronize()
    result["contextNvml"] = nvml_used() - baseline
    if case.get("allocatorLimitBytes"):
        # A smaller GPU for the allocator: set_per_process_memory_fraction caps what it may
        # reserve (CUDACachingAllocator's allowed_memory_maximum), so its out-of-memory line
        # can be found at any capacity on this one.
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(case["allocatorLimitBytes"] / total)
        result["allocatorLimitBytes"] = case["allocatorLimitBytes"]
    if case.get("snapshot"):
        if case.get("snapshotStacks"):
            # Python stacks of each allocation: which line of transformers / torch made it.
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=200000)
        else:
            # No stack traces (context=None): the trace alone, small enough to bring back.
            torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=200000)
    t0 = time.time()
    model, dtype = build_model(case, torch)
    if case["checkpointing"] == "everyBlock":
        model.gradient_checkpointing_enable()
        result["gradientCheckpointingKwargs"] = getattr(model, "_gradient_checkpointing_kwargs", None)
    if case["lora"]:
        import peft
        lc = case["lora"]
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=lc["r"], lora_alpha=lc["loraAlpha"], target_modules=lc["targetModules"], lora_dropout=0.0,
            task_type="SEQ_CLS" if case["task"] == "sequenceClassification" else "CAUSAL_LM"))
        if case["checkpointing"] != "none":
            model.enable_input_require_grads()
    model.train()
    model.to("cuda")
    torch.cuda.synchronize()
    result["buildSeconds"] = time.time() - t0
    params = [p for p in model.parameters() if p.requires_grad]
    result["trainableParameters"] = sum(p.numel() for p in params)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    mixed = case["precision"] == "bf16Mixed"
    amp = case["precision"] in ("ampBf16", "ampFp16")
    amp_dtype = torch.float16 if case["precision"] == "ampFp16" else torch.bfloat16
    masters = [p.detach().float() for p in params] if mixed else None
    impl = case.get("optimizerImplementation", "forEach")
    flavour = {"fused": {"fused": True}, "perParameter": {"foreach": False}}.get(impl, {})
    optimizer = torch.optim.AdamW(masters if mixed else params, lr=1e-5, **flavour)
    scaler = torch.amp.GradScaler("cuda") if case["precision"] == "ampFp16" else None
    phases = []

    def phase(label, t):
        torch.cuda.synchronize()
        phases.append({"phase": label, "seconds": time.time() - t, **snapshot_memory(torch),
                       "nvmlUsed": nvml_used() - baseline})
        torch.cuda.reset_peak_memory_stats()

    phase("init", t0)
    result["memGetInfoBeforeSteps"] = list(torch.cuda.mem_get_info())
    try:
        train_steps(case, model, params, masters, optimizer, scaler, amp, amp_dtype, phase, result)
    except torch.OutOfMemoryError as e:
        # The out-of-memory line: where the allocator gave up, with what it held then.
        result["oom"] = {"message": str(e).split("\n")[0][:600], "phasesDone": [p["phase"] for p in phases],
                         **snapshot_memory(torch), "nvmlUsed": nvml_used() - baseline,
                         "numAllocRetries": torch.cuda.memory_stats().get("num_alloc_retries"),
                         "memGetInfo": list(torch.cuda.mem_get_info())}
        result["phases"] = phases
        return result
    result["phases"] = phases
    return finish_case(case, result, phases, baseline, out_dir, x)


def train_steps(case, model, params, masters, optimizer, scaler, amp, amp_dtype, phase, result):
    import torch
    mixed = masters is not None
    vocab = case["hfConfig"]["vocab_size"]
    b, s = case["batchSize"], case["sequenceLength"]
    for step in (1, 2):
        t = time.time()
        gen = torch.Generator().manual_seed(step)
        batch = {"input_ids": torch.randint(0, vocab, (b, s), generator=gen),
                 "attention_mask": torch.ones((b, s), dtype=torch.long)}
        if case["task"] == "sequenceClassification":
            batch["token_type_ids"] = torch.zeros((b, s), dtype=torch.long)
            batch["labels"] = torch.randint(0, 2, (b,), generator=gen)
        else:
            batch["labels"] = torch.randint(0, vocab, (b, s), generator=gen)
        batch = {k: v.to("cuda") for k, v in batch.items()}
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
            loss = model(**batch).loss
        phase(f"forward:{step}", t)
        t = time.time()
        (scaler.scale(loss) if scaler else loss).backward()
        phase(f"backward:{step}", t)
        t = time.time()
        if mixed:
            for m, p in zip(masters, params):
                m.grad = p.grad.float()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m)
            model.zero_grad(set_to_none=True)
        elif scaler:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        result.setdefault("loss", []).append(float(loss))
        del loss, batch
        phase(f"optimizerStep:{step}", t)


def finish_case(case, result, phases, baseline, out_dir, x):
    import torch
    result["peakAllocated"] = max(p["maxAllocated"] for p in phases)
    result["peakReserved"] = max(p["maxReserved"] for p in phases)
    result["nvmlUsedEnd"] = nvml_used() - baseline
    result["processUsedEnd"] = nvml_process_used()
    stats = torch.cuda.memory_stats()
    result["memoryStats"] = {k: v for k, v in stats.items()
                             if k.endswith(".all.peak") or k.endswith(".all.current")
                             or k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                      "num_device_alloc", "num_device_free", "max_split_size")}
    if case.get("snapshot"):
        path = os.path.join(out_dir, case["name"] + ".pickle")
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        result["snapshotFile"] = os.path.basename(path)
        result["snapshotBytes"] = os.path.getsize(path)
    del x
    return result


# ---------------------------------------------------------------------------------------------

def child(kind, arg, baseline, out_dir):
    try:
        if kind == "context":
            res = probe_context(baseline)
        elif kind == "workspaces":
            res = probe_workspaces()
        else:
            with open(CASES) as f:
                case = next(c for c in json.load(f)["cases"] if c["name"] == arg)
            overrides = json.loads(os.environ.get("MEASURE_OVERRIDES", "{}"))
            case.update(overrides)
            if overrides.get("snapshot"):
                case["name"] = f"{case['name']}-b{case['batchSize']}"
            res = run_case(case, baseline, out_dir)
            res["overrides"] = overrides
    except Exception as e:  # noqa: BLE001 - every failure is reported as data, not a crash
        import traceback
        res = {"case": arg, "probe": kind, "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc()[-3000:]}
    print("RESULT " + json.dumps(res), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    out_dir = sys.argv[1]
    wanted = sys.argv[2:]
    plan = None
    if wanted and wanted[0].startswith("--plan="):
        # A plan: [{"case": name, "env": {...}, "overrides": {"batchSize": N, "snapshot": true}}, ...]
        with open(wanted[0][len("--plan="):]) as f:
            plan = json.load(f)
        wanted = []
    os.makedirs(out_dir, exist_ok=True)
    start = time.time()
    baseline = nvml_used()
    with open(CASES) as f:
        names = [c["name"] for c in json.load(f)["cases"]]
    if wanted:
        names = [n for n in names if n in wanted]
    jobs = [] if plan is not None else [("context", "lazy", {}), ("context", "eager", {"CUDA_MODULE_LOADING": "EAGER"}),
            ("workspaces", "default", {})] + [("case", n, {}) for n in names]
    if plan is not None:
        jobs = [("case", j["case"], {**j.get("env", {}), "MEASURE_OVERRIDES": json.dumps(j.get("overrides", {}))})
                for j in plan]
        names = []
    # The allocator option the page offers as a change (docs/device.md), measured on two cases.
    for n in ("llama3.2-1b-amp-sdpa-ckpt-b4-s2048", "llama3.2-1b-bf16mixed-eager-b1-s2048"):
        if n in names:
            jobs.append(("case", n, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    results_path = os.path.join(out_dir, "cuda.jsonl")
    with open(results_path, "a") as results:
        results.write(json.dumps({"start": time.strftime("%Y-%m-%d %H:%M:%S"), "baselineNvmlUsed": baseline}) + "\n")
        for kind, arg, env in jobs:
            left = TOTAL_BUDGET_S - (time.time() - start)
            if left < 30:
                results.write(json.dumps({"skipped": arg, "why": "time budget"}) + "\n")
                continue
            t = time.time()
            try:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, arg, str(baseline), out_dir],
                                   env={**os.environ, **env}, capture_output=True, text=True,
                                   timeout=min(CASE_TIMEOUT_S, left))
                lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                res = json.loads(lines[-1][7:]) if lines else {"case": arg, "error": f"exit {p.returncode}",
                                                               "stderr": p.stderr[-3000:]}
            except subprocess.TimeoutExpired:
                res = {"case": arg, "error": "timeout"}
            res["wallSeconds"] = round(time.time() - t, 1)
            res["jobEnv"] = env
            results.write(json.dumps(res) + "\n")
            results.flush()
            summary = {k: res.get(k) for k in ("case", "probe", "error", "peakAllocated", "peakReserved", "nvmlUsedEnd", "wallSeconds", "overrides")}
            summary["oom"] = (res.get("oom") or {}).get("phasesDone")
            print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
