"""Pipeline parallelism on CPU: a hand-written 1F1B of two stages of a small Llama, as Megatron-LM
runs it, measured per stage with the byte-exact tracker and compared with the simulated stage.

Two gloo processes. Stage 0 holds embed_tokens and the first half of the LlamaDecoderLayers
(scripts/torch_reference.py, Hugging Face's code op for op), stage 1 the second half, the final
RMSNorm, lm_head and the loss. The schedule is Megatron's
forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py):
stage r runs min(p − r − 1, m) warm-up forwards, then one forward and one backward each, then the
cool-down backwards. As there:
- the output tensor is sent and then pseudo-freed (deallocate_output_tensor: .data replaced by a
  one-element tensor, deallocate_pipeline_outputs=True), and its backward runs through the
  autograd engine with the received gradient (custom_backward);
- the receiving stage allocates the input (torch.empty of b·s·h in the pipeline dtype) and makes
  it require a gradient; its gradient is sent back after the backward;
- each micro-batch keeps its own graph and saved activations from its forward to its backward;
  the optimizer steps once after m micro-batches, then zero_grad(set_to_none=True).

`pipelineSchedule` "gpipe" runs every forward, then every backward (ScheduleGPipe).

Usage: /usr/bin/python3 scripts/validate_pipeline.py [--cli PATH] [--only NAME]
Prints, per case and stage, model states (exact or not) and the peak predicted vs measured.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.autograd import Variable
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as R  # noqa: E402
import validate as V  # noqa: E402
from validate_parallel import free_port  # noqa: E402


class Stage(nn.Module):
    """One pipeline stage of LlamaForCausalLM: the layers [first, first + count), with the
    embeddings on stage 0 and the final norm and head on the last stage."""

    def __init__(self, cfg, rank, world):
        super().__init__()
        self.cfg, self.rank, self.world = cfg, rank, world
        per = cfg.layers // world
        if rank == 0:
            self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, dtype=torch.float32)
        self.layers = nn.ModuleList([R.LlamaDecoderLayer(cfg, torch.float32, "cpu") for _ in range(per)])
        if rank == world - 1:
            self.norm = R.LlamaRMSNorm(cfg.hidden, cfg.rms_eps, torch.float32, "cpu")
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=torch.float32)
        self.rotary_emb = R.LlamaRotaryEmbedding(cfg, "cpu")

    def forward(self, hidden_states, batch):
        cfg = self.cfg
        if self.rank == 0:
            hidden_states = self.embed_tokens(batch["input_ids"])
        b, s = hidden_states.shape[:2]
        mask = R.decoder_eager_mask(b, s, hidden_states.dtype) if cfg.attention == "eager" else None
        cos, sin = self.rotary_emb(hidden_states, torch.arange(s).unsqueeze(0))
        for i, layer in enumerate(self.layers):
            hidden_states = R.run_layer(cfg, i, layer, hidden_states, mask, cos, sin)
        del mask, cos, sin
        if self.rank != self.world - 1:
            return hidden_states
        holder = [self.norm(hidden_states)]
        del hidden_states
        return R.decoder_head_and_loss(cfg, self.lm_head, holder, batch["labels"])[0]


def stage_batch(cfg, rank, world, b, s):
    """What Megatron's get_batch loads on this stage: tokens on the first, labels on the last."""
    batch = {"attention_mask": torch.ones((b, s), dtype=torch.long)}
    if rank == 0:
        batch["input_ids"] = torch.randint(0, cfg.vocab, (b, s))
    if rank == world - 1:
        batch["labels"] = torch.randint(0, cfg.vocab, (b, s))
    return batch


def schedule_of(name, p, r, m):
    if name == "gpipe":  # torch.distributed.pipelining ScheduleGPipe: every forward, then every backward
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warmup = min(p - r - 1, m)
    actions = [("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        actions += [("F", warmup + k), ("B", k)]
    return actions + [("B", k) for k in range(m - warmup, m)]


def run_microbatches(forward, make_batch, step, schedule, stage, stages, m, boundary, prev_rank, next_rank):
    """One step's micro-batches on `stage` as Megatron's schedule runs them: each forward receives
    its input (a `boundary`-shaped tensor made to require a gradient) from `prev_rank` unless it is
    the first stage, sends its output to `next_rank` and pseudo-frees it unless it is the last
    (deallocate_output_tensor); each backward runs the engine with the gradient received from
    `next_rank` (custom_backward) and sends the input's gradient back, waited on after the next
    receive (as the combined send_backward_recv_forward does)."""
    first, last = stage == 0, stage == stages - 1
    live = {}      # micro-batch → (input tensor, output tensor, batch)
    pending = []   # the isends of input gradients, waited after the next receive
    for kind, k in schedule_of(schedule, stages, stage, m):
        if kind == "F":
            with record_function(f"gpumem:forward:{step}"):
                inp = None
                if not first:
                    inp = torch.empty(boundary, dtype=torch.float32)
                    dist.recv(inp, prev_rank)
                    inp.requires_grad_()
                    for work in pending:
                        work.wait()
                    pending.clear()
                batch = make_batch()
                out = forward(inp, batch)
                if not last:
                    dist.send(out.detach(), next_rank)
                    # schedules.py deallocate_output_tensor: keep only the grad_fn.
                    out.data = torch.empty((1,), dtype=out.dtype)
                live[k] = (inp, out, batch)
                del inp, out, batch
        else:
            with record_function(f"gpumem:backward:{step}"):
                inp, out, batch = live.pop(k)
                if last:
                    out.backward()
                else:
                    grad = torch.empty(boundary, dtype=torch.float32)
                    dist.recv(grad, next_rank)
                    # schedules.py custom_backward: the engine, past the shape check.
                    Variable._execution_engine.run_backward(
                        tensors=(out,), grad_tensors=(grad,), keep_graph=False, create_graph=False,
                        inputs=tuple(), allow_unreachable=True, accumulate_grad=True)
                    del grad
                if not first:
                    pending.append(dist.isend(inp.grad, prev_rank))
                del inp, out, batch
    for work in pending:
        work.wait()


def optimizer_step(step, params, opt, state):
    """The step's optimizer step and zero_grad(set_to_none=True); after step 1 the gradients' bytes
    go into `state` (counted before zero_grad lets them go)."""
    if step == 1:
        state["gradients"] = sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)
    with record_function(f"gpumem:optimizerStep:{step}"):
        opt.step()
        opt.zero_grad(set_to_none=True)


def measure_and_write(run, state, path):
    """Runs `run` under the tracker, adds the peaks to `state` (whose "keep" entry held the model
    and optimizer alive to the end), writes it to `path` and leaves the process group."""
    memory, ranges = R.fast_allocation_events(run)
    del state["keep"]
    state["peak"], state["phasePeaks"] = V.summarise(memory, ranges)
    with open(path, "w") as f:
        json.dump(state, f)
    dist.barrier()
    dist.destroy_process_group()


def model_states(params, opt):
    """Parameter and optimizer-state bytes of this process, as the estimate's modelStates counts."""
    return {"parameters": sum(q.numel() * q.element_size() for q in params),
            "optimizerStates": sum(v.numel() * v.element_size() for st in opt.state.values()
                                   for v in st.values() if torch.is_tensor(v) and v.dim() > 0)}


def measure_stage(rank, world, setup, port, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = R.read_config(setup)
    t = setup["training"]
    b, s, m = t["batchSize"], t["sequenceLength"], setup["parallel"]["gradientAccumulationSteps"]
    torch.manual_seed(rank)
    state = {}

    def run():
        with record_function("gpumem:init"):
            model = Stage(cfg, rank, world)
            params = list(model.parameters())
            opt = V.make_optimizer(t["optimizer"], t["optimizerImplementation"], params)
        for step in (1, 2):
            run_microbatches(lambda inp, batch: model(inp, batch), lambda: stage_batch(cfg, rank, world, b, s),
                             step, setup["parallel"].get("pipelineSchedule", "1f1b"), rank, world, m,
                             (b, s, cfg.hidden), rank - 1, rank + 1)
            optimizer_step(step, params, opt, state)
        state.update(model_states(params, opt))
        state["keep"] = (model, opt)

    measure_and_write(run, state, f"{out_path}.{rank}")


def case(name, m, schedule="1f1b", **arch_fields):
    setup = R.transformer_setup(V.arch("llama", **arch_fields), batch=2, seq=128)
    setup["parallel"] = {"pipelineParallel": 2, "gradientAccumulationSteps": m, "pipelineSchedule": schedule}
    return name, setup


CASES = [
    case("llama-pp2-m1", 1),
    case("llama-pp2-m2", 2),
    case("llama-pp2-m4", 4),
    case("llama-pp2-gpipe-m3", 3, schedule="gpipe"),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", default=os.path.join(V.ROOT, "build/native/cli/gpumem"))
    parser.add_argument("--only")
    args = parser.parse_args()
    worst, exact_all = 0.0, True
    for name, setup in CASES:
        if args.only and args.only not in name:
            continue
        world = setup["parallel"]["pipelineParallel"]
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(measure_stage, args=(world, setup, free_port(), os.path.join(tmp, "stage")), nprocs=world, join=True)
            for stage in range(world):
                with open(os.path.join(tmp, f"stage.{stage}")) as f:
                    got = json.load(f)
                staged = copy.deepcopy(setup)
                staged["parallel"]["pipelineStage"] = stage
                pred = V.predict(args.cli, staged)
                states = pred["parameters"] == got["parameters"] and pred["optimizerStates"] == got["optimizerStates"]
                exact_all &= states
                err = V.pct(pred["peak"], got["peak"])
                worst = max(worst, abs(err))
                print(f"{name:16} stage {stage}/{world}  states {'exact' if states else 'DIFF'}  peak predicted "
                      f"{pred['peak']:>12,} measured {got['peak']:>12,} ({err:+.2f}%, {pred['peak'] - got['peak']:+,} B)")
    print(f"\nworst peak |error| {worst:.2f}%")
    sys.exit(0 if exact_all and worst <= 5.0 else 1)


if __name__ == "__main__":
    main()
