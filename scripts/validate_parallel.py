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


# ---------------------------------------------------------------------------------------------
# Megatron's sequence-parallel pair of linears, measured: what the column-parallel linear saves.
# megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication with
# sequence_parallel=True all-gathers its [s/t, b, h] input into a kept buffer (utils.py
# GlobalMemoryBuffer) and saves the *sharded* input; backward gathers it again and
# reduce-scatters the full grad_input. The row-parallel linear's output is reduce-scattered
# (mappings.py reduce_scatter_to_sequence_parallel_region). gloo in torch 1.13 has no
# reduce_scatter: an all_reduce in place and a copy of this rank's slice allocate the same
# bytes (the full tensor, then a new s/t one). The simulation's rule (core/src/parallel/
# sequence_split.cpp) predicts the bytes held at the end of forward and backward's peak.

class _GatherLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_shard, weight, buffer):
        dist.all_gather(list(buffer.chunk(dist.get_world_size())), x_shard)
        ctx.save_for_backward(x_shard, weight)
        ctx.buffer = buffer
        return torch.matmul(buffer, weight.t())

    @staticmethod
    def backward(ctx, grad_out):
        x_shard, weight = ctx.saved_tensors
        buffer = ctx.buffer
        dist.all_gather(list(buffer.chunk(dist.get_world_size())), x_shard)
        grad_input = grad_out.matmul(weight)
        grad_weight = grad_out.reshape(-1, grad_out.shape[-1]).t().matmul(buffer.reshape(-1, buffer.shape[-1]))
        dist.all_reduce(grad_input)
        sub = grad_input.chunk(dist.get_world_size())[dist.get_rank()].clone()
        del grad_input
        return sub, grad_weight, None


class _ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, full):
        dist.all_reduce(full)
        return full.chunk(dist.get_world_size())[dist.get_rank()].clone()

    @staticmethod
    def backward(ctx, grad):
        world = dist.get_world_size()
        gathered = torch.empty((grad.shape[0] * world, *grad.shape[1:]), dtype=grad.dtype)
        dist.all_gather(list(gathered.chunk(world)), grad.contiguous())
        return gathered


def measure_sequence_parallel(rank, world, dims, port, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s, b, h, f = dims
    torch.manual_seed(0)
    state = {}

    def run():
        with record_function("gpumem:init"):
            w1 = torch.randn(f // world, h, requires_grad=True)  # ColumnParallelLinear
            w2 = torch.randn(h, f // world, requires_grad=True)  # RowParallelLinear
            buffer = torch.empty(s, b, h)                        # the global "mpu" buffer
        with record_function("gpumem:forward:1"):
            x = torch.randn(s // world, b, h, requires_grad=True)
            col = _GatherLinear.apply(x, w1, buffer)   # [s, b, f/t]
            act = F.gelu(col)                           # saves col
            row = torch.matmul(act, w2.t())             # saves act; [s, b, h] partial sums
            out = _ScatterSequence.apply(row)           # [s/t, b, h]
            del row
            loss = out.pow(2).sum()                     # saves out
        with record_function("gpumem:backward:1"):
            loss.backward()
        state["keep"] = (w1, w2, buffer, x, col, act, out, loss)

    memory, ranges = V.allocation_events(run)
    del state["keep"]
    running, ends, peaks = 0, {}, {}
    for time_us, delta in memory:
        before = running
        running += delta
        for name, start, end in ranges:
            if start <= time_us <= end:
                ends[name] = running
                peaks[name] = max(peaks.get(name, 0), running, before if delta < 0 else 0)
    state["ends"], state["peaks"] = ends, peaks
    with open(f"{out_path}.{rank}", "w") as fh:
        json.dump(state, fh)
    dist.barrier()
    dist.destroy_process_group()


def sequence_parallel_check(world, dims):
    s, b, h, f = dims
    t = world
    four = 4  # fp32 on CPU
    init = (f // t * h * 2 + s * b * h) * four          # w1, w2 and the kept all-gather buffer
    # At the end of forward (besides init): x [s/t, b, h] (saved sharded, not the gathered [s, b, h]),
    # col and gelu(col) [s, b, f/t], out [s/t, b, h] and the loss scalar.
    forward_end = init + (s // t * b * h * 2 + s * b * f // t * 2) * four + four
    # Backward's peak is in the column-parallel linear's backward (the forward's tensors are held
    # by the test): the loss's gradient seed, both weight gradients, the gradient of its output
    # [s, b, f/t], the full grad_input [s, b, h] before the reduce-scatter and the rank's share
    # [s/t, b, h] (the all-gather again reuses the kept buffer: no allocation).
    backward_peak = forward_end + four + (2 * f // t * h + s * b * f // t + s * b * h + s // t * b * h) * four
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(measure_sequence_parallel, args=(world, dims, free_port(), os.path.join(tmp, "rank")),
                 nprocs=world, join=True)
        with open(os.path.join(tmp, "rank.0")) as fh:
            m = json.load(fh)
    measured_init = m["ends"]["init"]
    measured_forward = m["ends"]["forward:1"]
    measured_backward = m["peaks"]["backward:1"]
    ok = measured_init == init and measured_forward == forward_end and measured_backward == backward_peak
    print(f"sequence-parallel pair t={t} s={s} b={b} h={h} f={f}: init {measured_init:,} (predicted {init:,}), "
          f"forward end {measured_forward:,} (predicted {forward_end:,}; the gathered input would add "
          f"{(s - s // t) * b * h * four:,}), backward peak {measured_backward:,} (predicted {backward_peak:,})  "
          f"{'exact' if ok else 'DIFF'}")
    return ok


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
    if not args.only or "sequence" in args.only:
        for world in (2, 4):
            exact_all &= sequence_parallel_check(world, (128, 4, 256, 1024))
    print(f"\nworst peak |error| {worst:.2f}%")
    sys.exit(0 if exact_all and worst <= 5.0 else 1)


if __name__ == "__main__":
    main()
