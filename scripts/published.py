#!/usr/bin/env python3
"""Predicted device totals beside published nvidia-smi / NVML measurements.

Reads tests/data/published-measurements.json (each entry: its source, how it was measured, the
setup as gpumem reads it, the measured device total in MiB), estimates every setup with the
native CLI and prints predicted vs measured with the signed error. The targets of the
device-memory work are a median within 3 %, the worst within 6 %, and never more than 3 % under;
the summary line says how far the estimator is from them. Run by scripts/validate after the
PyTorch cases; `--write FILE` writes the table as Markdown.

Then it reads tests/data/published-parallel.json: published multi-GPU figures (Megatron's
functional tests, torchtitan's benchmarks, torchtune's README, PEFT's DeepSpeed / FSDP guides),
each with the kind of figure it is. Entries with a `setup` are estimated and compared like with
like: `allocated` (max_memory_allocated, or torchtune's active peak) with peakAllocatedBytes,
`reserved` (max_memory_reserved) with peakReservedBytes, `device` (nvidia-smi / NVML used) with
peakDeviceBytes. A setup gpumem refuses prints the refusal; entries without a setup print what
they need. `--write-parallel FILE` writes that second table as Markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20


def run_cli(cli, setup):
    run = subprocess.run([cli, "--json", "-"], input=json.dumps(setup), capture_output=True,
                         text=True, timeout=300)
    return json.loads(run.stdout)


def estimate(cli, setup):
    doc = run_cli(cli, setup)
    if not doc.get("ok"):
        raise SystemExit(f"the setup was refused: {doc.get('errors')}")
    return doc["estimate"]["device"]


# A published figure's kind -> the device estimate's field of the same kind.
FIGURE_FIELD = {
    "allocated": "peakAllocatedBytes",   # torch.cuda.max_memory_allocated; torchtune's active peak
    "reserved": "peakReservedBytes",     # torch.cuda.max_memory_reserved
    "device": "peakDeviceBytes",         # nvidia-smi / NVML used: reserved + context + workspaces
}
UNIT_BYTES = {"B": 1, "MiB": 2**20, "GiB": 2**30, "GB": 10**9}
GiB = 2**30


def parallel_rows(cli, data):
    """One row per published multi-GPU figure: predicted vs measured (same kind) or why not."""
    rows = []
    for m in data["measurements"]:
        measured = m["measuredValue"] * UNIT_BYTES[m["measuredUnit"]]
        row = {"name": m["name"], "figure": m["figure"], "measured": measured, "predicted": None,
               "error": None, "status": ""}
        if m.get("setup") is None:
            row["status"] = "not expressible: needs " + "; ".join(m["needs"])
        else:
            doc = run_cli(cli, m["setup"])
            if not doc.get("ok"):
                first = doc["errors"][0]
                row["status"] = f"refused ({first['field']}: {first['message']})"
            else:
                device = doc["estimate"]["device"]
                row["predicted"] = device[FIGURE_FIELD[m["figure"]]]
                row["error"] = 100.0 * (row["predicted"] - measured) / measured
                row["status"] = "fits" if device.get("fits") else "does not fit the GPU"
        rows.append(row)
    return rows


def parallel_table(rows):
    lines = ["| published setup | figure | predicted GiB | measured GiB | error | gpumem |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        predicted = f"{r['predicted'] / GiB:,.2f}" if r["predicted"] is not None else "—"
        error = f"{r['error']:+.1f} %" if r["error"] is not None else "—"
        lines.append(f"| {r['name']} | {r['figure']} | {predicted} | {r['measured'] / GiB:,.2f} "
                     f"| {error} | {r['status']} |")
    compared = [r["error"] for r in rows if r["error"] is not None]
    summary = (f"{len(rows)} published multi-GPU figures: {len(compared)} estimated"
               + (f" (signed errors {min(compared):+.1f} % … {max(compared):+.1f} %)" if compared else "")
               + f", {sum(1 for r in rows if r['status'].startswith('refused'))} refused by validation, "
               f"{sum(1 for r in rows if r['status'].startswith('not expressible'))} not expressible as a setup")
    return lines, summary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", default=os.path.join(ROOT, "build/native/cli/gpumem"))
    parser.add_argument("--data", default=os.path.join(ROOT, "tests/data/published-measurements.json"))
    parser.add_argument("--write", help="write the table as Markdown to this file")
    parser.add_argument("--parallel-data", default=os.path.join(ROOT, "tests/data/published-parallel.json"))
    parser.add_argument("--write-parallel", help="write the multi-GPU table as Markdown to this file")
    args = parser.parse_args()

    data = json.load(open(args.data))
    rows, errors = [], []
    for m in data["measurements"]:
        device = estimate(args.cli, m["setup"])
        predicted = device["peakDeviceBytes"] / MiB
        measured = m["measuredDeviceMiB"]
        error = 100.0 * (predicted - measured) / measured
        errors.append(error)
        rows.append((m["name"], device["peakAllocatedBytes"] / MiB, device["peakReservedBytes"] / MiB,
                     device["contextBytes"] / MiB, predicted, measured, error))

    header = "| setup | allocated MiB | reserved MiB | context MiB | device MiB | measured MiB | error |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for name, alloc, reserved, context, predicted, measured, error in rows:
        lines.append(f"| {name} | {alloc:,.0f} | {reserved:,.0f} | {context:,.0f} | {predicted:,.0f} "
                     f"| {measured:,} | {error:+.1f} % |")
    absolute = [abs(e) for e in errors]
    summary = (f"{len(errors)} published runs: median |error| {statistics.median(absolute):.1f} %, "
               f"worst {max(absolute):.1f} %, most under {min(errors):+.1f} % "
               f"(targets 3 %, 6 %, never under by more than 3 %)")
    print("\n".join(lines))
    print(summary)
    if args.write:
        with open(args.write, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")

    lines, summary = parallel_table(parallel_rows(args.cli, json.load(open(args.parallel_data))))
    print()
    print("\n".join(lines))
    print(summary)
    if args.write_parallel:
        with open(args.write_parallel, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
