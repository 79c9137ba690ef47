#!/usr/bin/env python3
"""Prints the estimate beside what an H100 measured (tests/data/cuda, scripts/measure_cuda.py):
peak allocated, peak reserved and the device total NVML saw, for every case; then the
out-of-memory line: the batch sizes tried at the GPU's capacity, and whether the estimate
called each one right.

Usage: python3 scripts/cuda_compare.py [path/to/gpumem]   (default build/native/cli/gpumem)
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "cuda")
GiB = 1 << 30


def estimate(gpumem, setup):
    out = subprocess.run([gpumem, "--json", "-"], input=json.dumps(setup), capture_output=True, text=True)
    return json.loads(out.stdout)["estimate"]["device"]


def setup_of(case, record, gpumem):
    s = json.loads(json.dumps(case["setup"]))
    env = record.get("jobEnv", {})
    if "expandable_segments:True" in (env.get("PYTORCH_CUDA_ALLOC_CONF") or ""):
        s["runtime"]["allocator"] = {"expandableSegments": True}
    if env.get("CUDA_MODULE_LOADING") == "EAGER":
        s["runtime"]["lazyModuleLoading"] = False
    overrides = record.get("overrides", {})
    s["training"].update({k: v for k, v in overrides.items() if k in ("batchSize", "sequenceLength")})
    if overrides.get("hfConfig", {}).get("use_cache") is False:  # a run with use_cache=False
        s["training"]["useCache"] = False
    if "allocatorLimitBytes" in overrides:
        # set_per_process_memory_fraction caps the allocator; the estimate gives it capacity −
        # context, so the capacity is the limit + the estimate's own context.
        s["gpu"]["memoryGiB"] = (overrides["allocatorLimitBytes"] + estimate(gpumem, s)["contextBytes"]) / GiB
    return s


def records(name):
    with open(os.path.join(DATA, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    gpumem = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "native", "cli", "gpumem")
    with open(os.path.join(DATA, "cases.json")) as f:
        cases = {c["name"]: c for c in json.load(f)["cases"]}
    runs = [r for r in records("measured-h100-torch2.11.jsonl") + records("measured-h100-torch2.11-oom-line.jsonl")
            + records("measured-h100-torch2.11-limit-24gib.jsonl")
            + records("measured-h100-torch2.11-no-cache.jsonl") + records("measured-h100-torch2.11-breadth.jsonl")
            if r.get("case") in cases]
    print("H100 SXM, PyTorch 2.11 + CUDA 13.0, transformers 5.17, peft 0.21 (tests/data/cuda): estimate vs measured")
    print(f"{'case':44s} {'allocated':>10s} {'reserved':>10s} {'device':>10s}   (measured GiB: allocated / reserved / NVML)")
    errors = {"allocated": [], "reserved": [], "device": []}
    for r in runs:
        if "peakAllocated" not in r or "batchSize" in r.get("overrides", {}):
            continue
        d = estimate(gpumem, setup_of(cases[r["case"]], r, gpumem))
        tag = r["case"] + ("".join(f" {k}={v}" for k, v in r.get("jobEnv", {}).items() if k != "MEASURE_OVERRIDES"))
        if r.get("overrides", {}).get("hfConfig", {}).get("use_cache") is False:
            tag += " use_cache=False"
        pa, pr, nv = r["peakAllocated"], r["peakReserved"], r["nvmlUsedEnd"]
        ea, er, ed = (d["peakAllocatedBytes"] / pa - 1) * 100, (d["peakReservedBytes"] / pr - 1) * 100, (d["peakDeviceBytes"] / nv - 1) * 100
        errors["allocated"].append(ea)
        errors["reserved"].append(er)
        errors["device"].append(ed)
        print(f"{tag[:44]:44s} {ea:+9.1f}% {er:+9.1f}% {ed:+9.1f}%   {pa / GiB:.2f} / {pr / GiB:.2f} / {nv / GiB:.2f}")
    for k, v in errors.items():
        a = [abs(x) for x in v]
        print(f"  {k}: median |error| {statistics.median(a):.1f} %, worst {max(v, key=abs):+.1f} %, most under {min(v):+.1f} %")
    print("\nThe out-of-memory line at the GPU's capacity (79.18 GiB, CUDA's total), or at an allocator limit:")
    right = total = 0
    for r in runs:
        o = r.get("overrides", {})
        if "batchSize" not in o:
            continue
        d = estimate(gpumem, setup_of(cases[r["case"]], r, gpumem))
        measured_fits = "oom" not in r or r["oom"] is None
        total += 1
        right += measured_fits == d["fits"]
        what = "fits" if measured_fits else "out of memory after " + r["oom"]["phasesDone"][-1]
        where = f"batch {o['batchSize']:3d}" + (f" × {o['sequenceLength']} at a {o['allocatorLimitBytes'] / GiB:.0f} GiB limit"
                                                if "allocatorLimitBytes" in o else "")
        print(f"  {r['case'][:40]:40s} {where}: measured {what:38s} estimate "
              f"{'fits' if d['fits'] else 'does not fit'}{'' if measured_fits == d['fits'] else '   <- wrong'}")
    print(f"  {right} of {total} verdicts right")


if __name__ == "__main__":
    main()
