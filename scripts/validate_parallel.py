"""Many GPUs on CPU: DDP with torch.distributed's gloo backend, predicted vs measured per rank.

Each case is a layer-list setup with parallel.dataParallel = world size. `world` processes are
started; each builds the same model, wraps it in DistributedDataParallel and runs init and two
training steps under the same byte-exact allocation tracker as scripts/validate.py. Rank 0's
figures are compared with the CLI's estimate of the simulated rank (docs/parallel.md).

Usage: /usr/bin/python3 scripts/validate_parallel.py [--cli PATH] [--only NAME]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate as V  # noqa: E402  (the tracker, the model builder, the prediction)


def measure_rank(rank, world, setup, port, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    p = setup["parallel"]
    t = setup["training"]
    layers = setup["model"]["layers"]
    b, s = t["batchSize"], t["sequenceLength"]
    width_out = V.output_width(layers)
    torch.manual_seed(0)
    state = {}

    def run():
        with record_function("gpumem:init"):
            model = V.build_model(setup, torch.float32)
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, bucket_cap_mb=p.get("bucketCapMB", 25),
                gradient_as_bucket_view=p.get("gradientAsBucketView", False))
            params = list(model.parameters())
            if p.get("zeroRedundancyOptimizer"):
                from torch.distributed.optim import ZeroRedundancyOptimizer
                foreach = t["optimizerImplementation"] == "forEach"
                opt_class = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[t["optimizer"]]
                opt = ZeroRedundancyOptimizer(params, optimizer_class=opt_class, lr=1e-3, foreach=foreach)
            else:
                opt = V.make_optimizer(t["optimizer"], t["optimizerImplementation"], params)
        for step in (1, 2):
            with record_function(f"gpumem:forward:{step}"):
                x = torch.randn(b, s, layers[0]["inFeatures"])
                y = torch.randn(b, s, width_out)
                out = ddp(x)
                loss = F.mse_loss(out, y)
            with record_function(f"gpumem:backward:{step}"):
                loss.backward()
            if step == 1:
                # .grad: with gradient_as_bucket_view they are views of the buckets (no bytes of their own).
                own = [g for g in (q.grad for q in params) if g is not None]
                state["gradViews"] = sum(1 for g in own if g._base is not None)
                del own  # the list would keep every gradient alive
            with record_function(f"gpumem:optimizerStep:{step}"):
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, x, y, out
        state["parameters"] = sum(q.numel() * q.element_size() for q in params)
        local = opt.optim if hasattr(opt, "optim") else opt  # ZeroRedundancyOptimizer: this rank's own
        state["optimizerStates"] = sum(v.numel() * v.element_size() for st in local.state.values()
                                       for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        state["keep"] = (ddp, opt)

    memory, ranges = V.allocation_events(run)
    del state["keep"]
    state["peak"], state["phasePeaks"] = V.summarise(memory, ranges)
    # Running total at the end of each phase of each step (for --detail).
    running, ends = 0, {}
    for time_us, delta in memory:
        running += delta
        for name, start, end in ranges:
            if start <= time_us <= end:
                ends[name] = running
    state["phaseEnds"] = ends
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(state, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def case(name, widths, world=2, batch=32, **parallel):
    _, setup = V.case(name, V.mlp(widths), batch=batch)
    setup["parallel"] = {"dataParallel": world, **parallel}
    return name, setup


CASES = [
    case("ddp-mlp-copies", [512, 1024, 1024, 512]),
    case("ddp-mlp-views", [512, 1024, 1024, 512], gradientAsBucketView=True),
    case("ddp-mlp-small-buckets", [512, 1024, 1024, 512], bucketCapMB=1),
    case("ddp-mlp-4-ranks", [256, 512, 512, 256], world=4, bucketCapMB=2),
    case("zero-redundancy-2", [512, 1024, 1024, 512], zeroRedundancyOptimizer=True),
    case("zero-redundancy-4", [512, 1024, 768, 256, 512], world=4, zeroRedundancyOptimizer=True),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", default=os.path.join(V.ROOT, "build/native/cli/gpumem"))
    parser.add_argument("--only")
    parser.add_argument("--detail", action="store_true")
    args = parser.parse_args()
    V.prove_tracker()
    worst = 0.0
    exact_all = True
    for name, setup in CASES:
        if args.only and args.only not in name:
            continue
        world = setup["parallel"]["dataParallel"]
        pred = V.predict(args.cli, setup)
        out = subprocess.run([args.cli, "--json", "-"], input=json.dumps(setup), capture_output=True, text=True)
        rank = json.loads(out.stdout)["estimate"]["rank"]["dataParallelRank"]  # the simulated rank
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(measure_rank, args=(world, setup, free_port(), os.path.join(tmp, "rank")), nprocs=world, join=True)
            with open(os.path.join(tmp, f"rank.{rank}")) as f:
                m = json.load(f)
        states = pred["parameters"] == m["parameters"] and pred["optimizerStates"] == m["optimizerStates"]
        exact_all &= states
        err = V.pct(pred["peak"], m["peak"])
        worst = max(worst, abs(err))
        phases = " ".join(f"{ph} {V.pct(pred['phasePeaks'][ph], m['phasePeaks'][ph]):+.2f}% "
                          f"({pred['phasePeaks'][ph] - m['phasePeaks'][ph]:+,} B)" for ph in V.PHASES)
        if args.detail:
            print("  measured running total at the end of each phase:", m["phaseEnds"])
        print(f"{name:24} rank {rank}/{world}  states {'exact' if states else 'DIFF'}  peak predicted {pred['peak']:>12,} "
              f"measured {m['peak']:>12,} ({err:+.2f}%)  {phases}  grad views {m['gradViews']}")
    print(f"\nworst peak |error| {worst:.2f}%")
    sys.exit(0 if exact_all and worst <= 5.0 else 1)


if __name__ == "__main__":
    main()
