"""Many GPUs on CPU: DDP with torch.distributed's gloo backend, predicted vs measured per rank.

Each case is a layer-list setup with parallel.dataParallel = world size. `world` processes are
started; each builds the same model, wraps it in DistributedDataParallel and runs init and two
training steps under the same byte-exact allocation tracker as scripts/validate.py. Rank 0's
figures are compared with the CLI's estimate of the simulated rank (docs/parallel.md).

FINETUNE_CASES run DDP over a small fine-tuned Llama (frozen blocks, LoRA) the same way.

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
import torch.distributed.utils
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate as V  # noqa: E402  (the tracker, the model builder, the prediction)


def _sync_params_and_buffers_p2p(process_group, module_states, broadcast_bucket_size, src):
    """DDP's initial sync of the module states (torch/distributed/utils.py _sync_params_and_buffers
    → dist._broadcast_coalesced: the states flattened into buckets of up to broadcast_bucket_size
    bytes, each broadcast from `src` and copied back), with the broadcast written as point-to-point
    sends. The same flat copy per bucket, made and freed at the same point; gloo's own broadcast is
    retired on its worker thread, which keeps a reference to the flat copy until it takes its next
    work: in some runs rank 0 then held it, parameter-sized, for the whole run (init −33 %, every
    later phase −8.4 MB), a flake of the measurement that NCCL does not have."""
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)

    def start(bucket):
        flat = torch._utils._flatten_dense_tensors(bucket)
        if rank == src:
            return bucket, flat, [dist.isend(flat, r) for r in range(world) if r != src]
        return bucket, flat, [dist.irecv(flat, src)]

    def finish(bucket, flat, works):
        for work in works:
            work.wait()
        if rank != src:
            for tensor, synced in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
                tensor.copy_(synced)

    # c10d comm.cpp broadcast_coalesced: compute_bucket_assignment_by_size keys the open buckets
    # by dtype, closes one once its bytes reach the limit, and orders the buckets by their first
    # tensor; at most two BroadcastWorks (and their flat copies) are alive at once. A bucket of
    # one tensor is flattened to a view of it (no copy).
    open_buckets, buckets = {}, []
    for index, tensor in enumerate(module_states):
        bucket = open_buckets.setdefault(tensor.dtype, [index, [], 0])
        bucket[1].append(tensor)
        bucket[2] += tensor.numel() * tensor.element_size()
        if bucket[2] >= broadcast_bucket_size:
            buckets.append(open_buckets.pop(tensor.dtype))
    buckets = sorted(buckets + list(open_buckets.values()), key=lambda bucket: bucket[0])
    in_flight = []
    for _, tensors, _ in buckets:
        if len(in_flight) >= 2:
            finish(*in_flight.pop(0))
        in_flight.append(start(tensors))
    while in_flight:
        finish(*in_flight.pop(0))


torch.distributed.utils._sync_params_and_buffers = _sync_params_and_buffers_p2p


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


def measure_finetune_rank(rank, world, setup, port, out_path):
    """DDP over a fine-tuned transformer (fp32): frozen parameters and LoRA written op for op as
    PEFT does (finetune_reference.py); DistributedDataParallel registers only the parameters
    with requires_grad (distributed.py _build_params_for_reducer), so its buckets hold the
    adapters only (docs/parallel.md, "Fine-tuning on many GPUs")."""
    import finetune_reference
    import torch_reference as R
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    p, t = setup["parallel"], setup["training"]
    cfg = R.read_config(setup)
    b, s = t["batchSize"], t["sequenceLength"]
    torch.manual_seed(0)
    state = {}

    def run():
        with record_function("gpumem:init"):
            model = R.build_model(cfg, torch.float32)
            if finetune_reference.apply(model, setup, torch.float32, R.Dropout):
                finetune_reference.hook_input_grads(model, cfg.family)
            all_params = list(model.parameters())
            params = [q for q in all_params if q.requires_grad]
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, bucket_cap_mb=p.get("bucketCapMB", 25),
                gradient_as_bucket_view=p.get("gradientAsBucketView", False))
            opt = V.make_optimizer(t["optimizer"], t["optimizerImplementation"], params)
        for step in (1, 2):
            with record_function(f"gpumem:forward:{step}"):
                batch = R.make_batch(cfg, b, s)
                loss = R.compute_loss(ddp, batch)
            with record_function(f"gpumem:backward:{step}"):
                loss.backward()
            if step == 1:
                own = [g for g in (q.grad for q in params) if g is not None]
                state["gradViews"] = sum(1 for g in own if g._base is not None)
                del own
            with record_function(f"gpumem:optimizerStep:{step}"):
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, batch
        state["parameters"] = sum(q.numel() * q.element_size() for q in all_params)
        state["optimizerStates"] = sum(v.numel() * v.element_size() for st in opt.state.values()
                                       for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        # The reducer's bucket bytes (its flat gradient buffers), from the buckets' parameters.
        state["bucketElements"] = sum(q.numel() for q in params)
        state["keep"] = (ddp, opt)

    memory, ranges = R.fast_allocation_events(run)
    del state["keep"]
    state["peak"], state["phasePeaks"] = V.summarise(memory, ranges)
    state["phaseEnds"] = {}
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


def ftcase(name, finetune, world=2, **parallel):
    """A small Llama (validate.arch) fine-tuned under DDP, fp32 (torch 1.13 CPU)."""
    _, setup = V.tcase(name, V.arch("llama", numLayers=2), batch=4, seq=256)
    setup["finetune"] = finetune
    setup["parallel"] = {"dataParallel": world, **parallel}
    return name, setup


FINETUNE_CASES = [
    ftcase("ddp-llama-lora-qv", {"lora": True, "r": 8, "loraAlpha": 16}),
    ftcase("ddp-llama-lora-views", {"lora": True, "r": 8, "loraAlpha": 16}, gradientAsBucketView=True),
    ftcase("ddp-llama-frozen-first", {"freezeEmbeddings": True, "freezeFirstBlocks": 1}, bucketCapMB=1),
]

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
    for name, setup in CASES + FINETUNE_CASES:
        if args.only and args.only not in name:
            continue
        world = setup["parallel"]["dataParallel"]
        pred = V.predict(args.cli, setup)
        out = subprocess.run([args.cli, "--json", "-"], input=json.dumps(setup), capture_output=True, text=True)
        rank = json.loads(out.stdout)["estimate"]["rank"]["dataParallelRank"]  # the simulated rank
        with tempfile.TemporaryDirectory() as tmp:
            measure = measure_finetune_rank if "finetune" in setup else measure_rank
            mp.spawn(measure, args=(world, setup, free_port(), os.path.join(tmp, "rank")), nprocs=world, join=True)
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
