#!/usr/bin/env python3
"""Predicted device totals beside published nvidia-smi / NVML measurements.

Reads tests/data/published-measurements.json (each entry: its source, how it was measured, the
setup as gpumem reads it, the measured device total in MiB), estimates every setup with the
native CLI and prints predicted vs measured with the signed error. The targets of the
device-memory work are a median within 3 %, the worst within 6 %, and never more than 3 % under;
the summary line says how far the estimator is from them. Run by scripts/validate after the
PyTorch cases; `--write FILE` writes the table as Markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20


def estimate(cli, setup):
    run = subprocess.run([cli, "--json", "-"], input=json.dumps(setup), capture_output=True,
                         text=True, timeout=120)
    doc = json.loads(run.stdout)
    if not doc.get("ok"):
        raise SystemExit(f"the setup was refused: {doc.get('errors')}")
    return doc["estimate"]["device"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", default=os.path.join(ROOT, "build/native/cli/gpumem"))
    parser.add_argument("--data", default=os.path.join(ROOT, "tests/data/published-measurements.json"))
    parser.add_argument("--write", help="write the table as Markdown to this file")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
