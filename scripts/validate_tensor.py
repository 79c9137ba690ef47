"""Tensor and sequence parallelism on CPU: a small Llama split over gloo ranks as Megatron-LM
splits it, measured per rank with the byte-exact tracker and compared with the simulated rank.

Each rank holds the Hugging Face Llama layers (scripts/torch_reference.py) at the rank's widths:
heads, key/value heads and the MLP width divided by t, the vocabulary padded to a multiple of
128·t (megatron/training/tokenizer `_vocab_size_with_padding`) and divided by t. Around them, the
communication is written as Megatron writes it (megatron/core/tensor_parallel/mappings.py,
layers.py, cross_entropy.py):

- tensor parallelism alone: `copy_to_tensor_model_parallel_region` before every column-parallel
  linear (identity; its backward all-reduces the gradient in place) and
  `reduce_from_tensor_model_parallel_region` after every row-parallel one (an in-place
  all-reduce); `VocabParallelEmbedding` masks the ids outside the rank's slice and all-reduces;
- with `--sequence-parallel`: the hidden states between the linears hold s/t tokens; a
  column-parallel linear is `LinearWithGradAccumulationAndAsyncCommunication` with
  sequence_parallel=True (all-gathers its input into the global memory buffer "mpu", saves the
  sharded input, gathers it again in backward, makes the full grad_input and reduce-scatters it
  into a new s/t gradient); a row-parallel linear ends with
  `reduce_scatter_to_sequence_parallel_region` (a new s/t tensor; its backward all-gathers into
  a new full one), as does the embedding (`reduce_scatter_embeddings`, no learned positions);
- the loss is Megatron's `vocab_parallel_cross_entropy` over the rank's logits, its three
  all-reduces in place.

Megatron keeps activations as [s, b, h]; here they are Hugging Face's [b, s, h] with b = 1, where
a slice along the sequence is contiguous as Megatron's [s/t, b, h] shard is, so the gathers and
scatters write into views and the memory is Megatron's. gloo has no _all_gather_base or
_reduce_scatter_base on torch 1.13: with two ranks each is written as one isend and one recv
into the destination (the reduce-scatter adds the rank's own part in place), which allocates
nothing, as NCCL's collectives allocate nothing from the caching allocator.

Usage: /usr/bin/python3 scripts/validate_tensor.py [--cli PATH] [--only NAME]
"""
import argparse
import copy
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as R  # noqa: E402
import validate as V  # noqa: E402
import validate_pipeline as VP  # noqa: E402
from validate_parallel import free_port  # noqa: E402

TP = {"rank": 0, "world": 1}


def peer():
    """The other tensor-parallel rank's index in the group (which s/t slice is its)."""
    return 1 - TP["rank"]


def peer_rank():
    """The other tensor-parallel rank's global rank (its stage's other process)."""
    return TP["peer"]


def all_reduce(tensor, op="sum"):
    """An in-place all-reduce of two ranks: ours sent, the peer's received into a scratch buffer
    made before the measurement (as NCCL's own buffers are outside the caching allocator), then
    combined in place. gloo's dist.all_reduce would do the same arithmetic, but its worker thread
    keeps a reference to the tensor until it retires the work, at a racy time after wait(): the
    tracker then saw one to three all-reduced [1, s, h] tensors outlive their last use."""
    received = TP["scratch"][:tensor.numel()].view(tensor.shape)
    work = dist.isend(tensor, peer_rank())
    dist.recv(received, peer_rank())
    work.wait()
    if op == "max":
        torch.maximum(tensor, received, out=tensor)
    else:
        tensor.add_(received)


def seq_slice(tensor, rank):
    """The rank's s/t tokens of a [1, s, ...] tensor: a contiguous view."""
    n = tensor.shape[1] // TP["world"]
    return tensor[:, rank * n:(rank + 1) * n]


def all_gather_into(full, shard):
    """dist._all_gather_base(full, shard) for two ranks: full's own slice copied in place, the
    peer's received into its slice."""
    seq_slice(full, TP["rank"]).copy_(shard)
    work = dist.isend(shard.contiguous(), peer_rank())
    dist.recv(seq_slice(full, peer()), peer_rank())
    work.wait()


def reduce_scatter_into(shard, full):
    """dist._reduce_scatter_base(shard, full) for two ranks: the peer's part of our full tensor
    sent, the peer's part of ours received into `shard`, then our own part added in place."""
    work = dist.isend(seq_slice(full, peer()).contiguous(), peer_rank())
    dist.recv(shard, peer_rank())
    shard.add_(seq_slice(full, TP["rank"]))
    work.wait()


def gather_along_sequence(shard):
    """mappings.py _gather_along_first_dim: a new [s] tensor of the ranks' [s/t] shards."""
    shape = list(shard.shape)
    shape[1] *= TP["world"]
    output = torch.empty(shape, dtype=shard.dtype)
    all_gather_into(output, shard.contiguous())
    return output


class GlobalMemoryBuffer:
    """megatron/core/utils.py GlobalMemoryBuffer.get_tensor: one flat tensor per (name, dtype),
    made at the first request and replaced only by a larger one; requests are views of it."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, shape, dtype, name):
        required = 1
        for d in shape:
            required *= d
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < required:
            self.buffer[key] = torch.empty(required, dtype=dtype)
        return self.buffer[key][0:required].view(*shape)


MPU_BUFFER = GlobalMemoryBuffer()


class CopyToTensorParallelRegion(torch.autograd.Function):
    """mappings.py _CopyToModelParallelRegion: identity; backward all-reduces in place."""

    @staticmethod
    def forward(ctx, input_):
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        all_reduce(grad_output)
        return grad_output


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """mappings.py _ReduceFromModelParallelRegion: an in-place all-reduce; backward identity.
    A row-parallel layer's whole bias is added in place here (autograd forbids an in-place op on
    the output of a Function that returns its input); its gradient is the sum over tokens."""

    @staticmethod
    def forward(ctx, input_, bias=None):
        all_reduce(input_)
        ctx.use_bias = bias is not None
        if bias is not None:
            input_.add_(bias)
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        grad_bias = grad_output.sum(dim=(0, 1)) if ctx.use_bias else None
        return grad_output, grad_bias


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _ReduceScatterToSequenceParallelRegion: `_reduce_scatter_along_first_dim`
    makes a new [s/t] tensor; backward `_gather_along_first_dim` a new [s] one."""

    @staticmethod
    def forward(ctx, input_):
        shape = list(input_.shape)
        shape[1] //= TP["world"]
        output = torch.empty(shape, dtype=input_.dtype)
        reduce_scatter_into(output, input_.contiguous())
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return gather_along_sequence(grad_output)


class SequenceParallelLinear(torch.autograd.Function):
    """layers.py LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel=True, no
    bias, gradient_accumulation_fusion off: forward gathers the input into the "mpu" buffer and
    saves the sharded input; backward gathers it again, makes grad_input = grad_output @ weight,
    reduce-scatters it into a new sub_grad_input, then grad_weight = grad_outputᵀ @ total_input."""

    @staticmethod
    def forward(ctx, input_, weight, bias=None):
        ctx.save_for_backward(input_, weight)
        ctx.use_bias = bias is not None
        shape = list(input_.shape)
        shape[1] *= TP["world"]
        total_input = MPU_BUFFER.get_tensor(shape, input_.dtype, "mpu")
        all_gather_into(total_input, input_)
        output = torch.matmul(total_input, weight.t())
        if bias is not None:
            output.add_(bias)  # Transformer Engine adds it in the GEMM's epilogue: no second tensor
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight = ctx.saved_tensors
        shape = list(input_.shape)
        shape[1] *= TP["world"]
        total_input = MPU_BUFFER.get_tensor(shape, input_.dtype, "mpu")
        all_gather_into(total_input, input_)
        grad_input = grad_output.matmul(weight)
        # prepare_input_tensors_for_wgrad_compute: views as [s·b, ·].
        grad_output = grad_output.contiguous()
        grad_output_2d = grad_output.view(-1, grad_output.shape[-1])
        total_input_2d = total_input.view(-1, total_input.shape[-1])
        sub_grad_input = torch.empty(input_.shape, dtype=input_.dtype)
        reduce_scatter_into(sub_grad_input, grad_input)
        grad_weight = grad_output_2d.t().matmul(total_input_2d)
        grad_bias = grad_output_2d.sum(dim=0) if ctx.use_bias else None
        return sub_grad_input, grad_weight, grad_bias


def column_parallel_input(x, sp):
    """What the column-parallel linears of one input read: with sequence parallelism the sharded
    input (each linear gathers it); otherwise `copy_to_tensor_model_parallel_region` of it, once
    for all the linears that read it (Megatron's fused linear_qkv and linear_fc1)."""
    return x if sp else CopyToTensorParallelRegion.apply(x)


class ParallelLora(nn.Module):
    """peft src/peft/tuners/lora/tp_layer.py LoraParallelLinear around one rank's Megatron linear
    (one adapter, no dropout): behind a ColumnParallelLinear lora_A is a whole nn.Linear [r, in]
    and lora_B a ColumnParallelLinear [out/t, r]; behind a RowParallelLinear lora_A is a
    RowParallelLinear [r, in/t] (input_is_parallel) and lora_B a whole nn.Linear [out, r]. The
    rank's base linear already has those in / out widths. forward: result = base_layer(x);
    result = result + lora_B(lora_A(dropout(x))) * scaling."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False, dtype=torch.float32)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, dtype=torch.float32)
        self.scaling = alpha / r
        for q in base.parameters():
            q.requires_grad_(False)


def wrap_lora(module, names, r, alpha):
    for name in names:
        setattr(module, name, ParallelLora(getattr(module, name), r, alpha))


def column_parallel(linear, x, sp, weight=None):
    """A column-parallel linear on `x` from column_parallel_input."""
    if isinstance(linear, ParallelLora):
        assert not sp, "the finetune section is simulated without sequence parallelism"
        result = F.linear(x, linear.base_layer.weight, linear.base_layer.bias)
        hidden = F.linear(x, linear.lora_A.weight)  # the whole lora_A on the replicated input
        # lora_B, a ColumnParallelLinear: copy_to_tensor_model_parallel_region, then the rank's rows.
        delta = F.linear(CopyToTensorParallelRegion.apply(hidden), linear.lora_B.weight)
        return result + delta * linear.scaling
    weight = linear.weight if weight is None else weight
    bias = None if linear is None else linear.bias
    if sp:
        return SequenceParallelLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def row_parallel(linear, x, sp):
    """RowParallelLinear: the matmul of the rank's slice, then the all-reduce (or reduce-scatter);
    a bias is whole and added after it (skip_bias_add, then bias-dropout-add; the fused kernel
    makes no x + bias tensor, written here as an in-place add)."""
    if isinstance(linear, ParallelLora):
        assert not sp, "the finetune section is simulated without sequence parallelism"
        result = ReduceFromTensorParallelRegion.apply(F.linear(x, linear.base_layer.weight), linear.base_layer.bias)
        # lora_A, a RowParallelLinear on the rank's input slice, its r-wide output all-reduced.
        hidden = ReduceFromTensorParallelRegion.apply(F.linear(x, linear.lora_A.weight), None)
        return result + F.linear(hidden, linear.lora_B.weight) * linear.scaling
    out = F.linear(x, linear.weight)
    if not sp:
        return ReduceFromTensorParallelRegion.apply(out, linear.bias)
    out = ReduceScatterToSequenceParallelRegion.apply(out)
    if linear.bias is not None:
        out.add_(linear.bias)
    return out


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _ScatterToSequenceParallelRegion (the rank's s/t, a view of the input), then
    LanguageModelEmbedding's clone (clone_scatter_output_in_embedding, default on); backward
    all-gathers into a new [s] gradient."""

    @staticmethod
    def forward(ctx, input_):
        return seq_slice(input_, TP["rank"]).clone()

    @staticmethod
    def backward(ctx, grad_output):
        return gather_along_sequence(grad_output)


def padded_vocab(vocab, t):
    multiple = 128 * t
    return (vocab + multiple - 1) // multiple * multiple


class TensorParallelLlama(nn.Module):
    """One tensor-parallel rank of LlamaForCausalLM (untied head), or of one pipeline stage of it:
    the embeddings on the first stage, L/p layers, the final norm, head and loss on the last."""

    def __init__(self, cfg, rank, t, sp, stage=0, stages=1):
        super().__init__()
        self.cfg, self.rank, self.t, self.sp = cfg, rank, t, sp
        self.first, self.last = stage == 0, stage == stages - 1
        self.rank_vocab = padded_vocab(cfg.vocab, t) // t
        self.rank_cfg = copy.copy(cfg)
        self.rank_cfg.heads, self.rank_cfg.kv_heads = cfg.heads // t, cfg.kv_heads // t
        if self.first:
            self.embed_tokens = nn.Embedding(self.rank_vocab, cfg.hidden, dtype=torch.float32)
        self.layers = nn.ModuleList()
        for _ in range(cfg.layers // stages):
            layer = nn.Module()
            layer.self_attn = R.LlamaAttention(self.rank_cfg, torch.float32, "cpu")
            layer.mlp = R.LlamaMLP(cfg, cfg.inter // t, torch.float32, "cpu")
            layer.input_layernorm = R.LlamaRMSNorm(cfg.hidden, cfg.rms_eps, torch.float32, "cpu")
            layer.post_attention_layernorm = R.LlamaRMSNorm(cfg.hidden, cfg.rms_eps, torch.float32, "cpu")
            self.layers.append(layer)
        if self.last:
            self.norm = R.LlamaRMSNorm(cfg.hidden, cfg.rms_eps, torch.float32, "cpu")
            self.lm_head = nn.Linear(cfg.hidden, self.rank_vocab, bias=False, dtype=torch.float32)
        self.rotary_emb = R.LlamaRotaryEmbedding(cfg, "cpu")

    def add_lora(self, r, alpha, targets):
        """get_peft_model: every parameter frozen, then the targets wrapped (tp_layer.py)."""
        for q in self.parameters():
            q.requires_grad_(False)
        for layer in self.layers:
            wrap_lora(layer.self_attn, [n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if n in targets], r, alpha)
            wrap_lora(layer.mlp, [n for n in ("gate_proj", "up_proj", "down_proj") if n in targets], r, alpha)

    def embed(self, input_ids):
        """layers.py VocabParallelEmbedding.forward."""
        start = self.rank * self.rank_vocab
        input_mask = (input_ids < start) | (input_ids >= start + self.rank_vocab)
        masked_input = input_ids.clone() - start
        masked_input[input_mask] = 0
        output_parallel = self.embed_tokens(masked_input)
        output_parallel[input_mask, :] = 0.0
        del input_mask, masked_input
        if self.sp:
            return ReduceScatterToSequenceParallelRegion.apply(output_parallel)
        return ReduceFromTensorParallelRegion.apply(output_parallel)

    def attention(self, attn, x, mask, cos, sin):
        """R.LlamaAttention.forward with the column- and row-parallel mappings."""
        cfg = self.rank_cfg
        x = column_parallel_input(x, self.sp)
        q = column_parallel(attn.q_proj, x, self.sp)
        k = column_parallel(attn.k_proj, x, self.sp)
        v = column_parallel(attn.v_proj, x, self.sp)
        b, s = q.shape[:2]
        shape = (b, s, -1, cfg.head_dim)
        q, k, v = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
        q, k = R.apply_rotary_pos_emb(q, k, cos, sin)
        out = R.attention_core(cfg, q, k, v, mask, n_rep=cfg.heads // cfg.kv_heads, causal=True)
        del q, k, v
        out = out.reshape(b, s, -1).contiguous()
        return row_parallel(attn.o_proj, out, self.sp)

    def mlp(self, mlp, x):
        x = column_parallel_input(x, self.sp)
        gate = column_parallel(mlp.gate_proj, x, self.sp)
        up = column_parallel(mlp.up_proj, x, self.sp)
        return row_parallel(mlp.down_proj, R.activation(mlp.act, gate) * up, self.sp)

    def forward(self, input_ids, labels, hidden_states=None, s=None):
        cfg = self.cfg
        s = s or input_ids.shape[1]
        if self.first:
            hidden_states = self.embed(input_ids)
        mask = R.decoder_eager_mask(1, s, hidden_states.dtype) if cfg.attention == "eager" else None
        cos, sin = self.rotary_emb(hidden_states, torch.arange(s).unsqueeze(0))
        for layer in self.layers:
            residual = hidden_states
            hidden_states = self.attention(layer.self_attn, layer.input_layernorm(hidden_states), mask, cos, sin)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.mlp(layer.mlp, layer.post_attention_layernorm(hidden_states))
            hidden_states = residual + hidden_states
            del residual
        del mask, cos, sin
        if not self.last:
            return hidden_states
        hidden_states = self.norm(hidden_states)
        logits = column_parallel(self.lm_head, column_parallel_input(hidden_states, self.sp), self.sp)
        del hidden_states
        loss = R.megatron_language_model_loss(logits, labels, self.rank * self.rank_vocab, all_reduce)
        return loss


class TensorParallelGPT2(nn.Module):
    """One tensor-parallel rank of GPT2LMHeadModel as Megatron's GPT splits it (tied head):
    c_attn and c_fc column-parallel (weight and bias 1/t), both c_proj row-parallel (weight 1/t,
    bias whole), wte a VocabParallelEmbedding, wpe and the LayerNorms whole."""

    def __init__(self, cfg, rank, t, sp):
        super().__init__()
        self.cfg, self.rank, self.t, self.sp = cfg, rank, t, sp
        h = cfg.hidden
        self.rank_vocab = padded_vocab(cfg.vocab, t) // t
        self.rank_cfg = copy.copy(cfg)
        self.rank_cfg.heads = cfg.heads // t
        f32 = torch.float32
        self.wte = nn.Embedding(self.rank_vocab, h, dtype=f32)
        self.wpe = nn.Embedding(cfg.max_pos, h, dtype=f32)
        self.h = nn.ModuleList()
        for _ in range(cfg.layers):
            block = nn.Module()
            block.ln_1 = R.LayerNorm(h, eps=cfg.ln_eps, dtype=f32)
            block.c_attn = nn.Linear(h, 3 * h // t, dtype=f32)
            block.attn_c_proj = nn.Linear(h // t, h, dtype=f32)
            block.ln_2 = R.LayerNorm(h, eps=cfg.ln_eps, dtype=f32)
            block.c_fc = nn.Linear(h, cfg.inter // t, dtype=f32)
            block.mlp_c_proj = nn.Linear(cfg.inter // t, h, dtype=f32)
            self.h.append(block)
        self.ln_f = R.LayerNorm(h, eps=cfg.ln_eps, dtype=f32)

    def forward(self, input_ids, labels):
        cfg, rcfg = self.cfg, self.rank_cfg
        s = input_ids.shape[1]
        # LanguageModelEmbedding: the word embeddings all-reduced (learned positions: no
        # reduce_scatter_embeddings), the positions added on all s tokens, then the rank's s/t.
        start = self.rank * self.rank_vocab
        input_mask = (input_ids < start) | (input_ids >= start + self.rank_vocab)
        masked_input = input_ids.clone() - start
        masked_input[input_mask] = 0
        words = self.wte(masked_input)
        words[input_mask, :] = 0.0
        del input_mask, masked_input
        words = ReduceFromTensorParallelRegion.apply(words)
        positions = self.wpe(torch.arange(s)[None])
        hidden_states = words + positions
        del words, positions
        if self.sp:
            hidden_states = ScatterToSequenceParallelRegion.apply(hidden_states)
        mask = R.decoder_eager_mask(1, s, hidden_states.dtype) if cfg.attention == "eager" else None
        hidden_states = R.dropout(hidden_states, cfg.hidden_dropout)
        width = cfg.hidden // self.t
        for block in self.h:
            residual = hidden_states
            qkv = column_parallel(block.c_attn, column_parallel_input(block.ln_1(hidden_states), self.sp), self.sp)
            query, key, value = qkv.split(width, dim=2)
            del qkv
            shape = (1, s, -1, cfg.head_dim)
            query, key, value = (x.view(shape).transpose(1, 2) for x in (query, key, value))
            out = R.attention_core(rcfg, query, key, value, mask, n_rep=1, causal=True)
            del query, key, value
            out = row_parallel(block.attn_c_proj, out.reshape(1, s, -1).contiguous(), self.sp)
            hidden_states = R.dropout(out, cfg.hidden_dropout) + residual
            del out
            residual = hidden_states
            wide = column_parallel(block.c_fc, column_parallel_input(block.ln_2(hidden_states), self.sp), self.sp)
            out = row_parallel(block.mlp_c_proj, R.activation(cfg.act, wide), self.sp)
            del wide
            hidden_states = residual + R.dropout(out, cfg.hidden_dropout)
            del out, residual
        del mask
        hidden_states = self.ln_f(hidden_states)
        logits = column_parallel(None, column_parallel_input(hidden_states, self.sp), self.sp, weight=self.wte.weight)
        del hidden_states
        return R.megatron_language_model_loss(logits, labels, self.rank * self.rank_vocab, all_reduce)


def measure_rank(rank, world, setup, port, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = R.read_config(setup)
    t = setup["training"]
    p = setup["parallel"]
    tp, stages = p["tensorParallel"], p.get("pipelineParallel", 1)
    stage, tp_rank = rank // tp, rank % tp
    TP["rank"], TP["world"], TP["peer"] = tp_rank, tp, stage * tp + (1 - tp_rank)
    sp = p.get("sequenceParallel", False)
    b, s = t["batchSize"], t["sequenceLength"]
    m = p.get("gradientAccumulationSteps", 1)
    assert b == 1, "the shards are contiguous views only with b = 1"
    torch.manual_seed(stage)  # the same batches on both ranks of a stage
    TP["scratch"] = torch.empty(b * s * cfg.hidden, dtype=torch.float32)  # before the tracker starts
    state = {}
    boundary = (b, s // tp if sp else s, cfg.hidden)  # schedules.py get_tensor_shapes

    def run():
        with record_function("gpumem:init"):
            if cfg.family == "gpt2":
                model = TensorParallelGPT2(cfg, tp_rank, tp, sp)
            else:
                model = TensorParallelLlama(cfg, tp_rank, tp, sp, stage, stages)
            f = setup.get("finetune")
            if f:
                model.add_lora(f["r"], f["loraAlpha"], f["targetModules"])
            every = list(model.parameters())
            params = [q for q in every if q.requires_grad]
            opt = V.make_optimizer(t["optimizer"], t["optimizerImplementation"], params)
        for step in (1, 2):
            if stages == 1:
                input_ids = torch.randint(0, cfg.vocab, (b, s))
                labels = torch.randint(0, cfg.vocab, (b, s))
                with record_function(f"gpumem:forward:{step}"):
                    loss = model(input_ids, labels)
                with record_function(f"gpumem:backward:{step}"):
                    loss.backward()
                    del loss
                del input_ids, labels
            else:  # scripts/validate_pipeline.py's schedule; the boundary partner is the same TP rank
                VP.run_microbatches(
                    lambda inp, batch: model(batch.get("input_ids"), batch.get("labels"), hidden_states=inp, s=s),
                    lambda: VP.stage_batch(cfg, stage, stages, b, s), step, "1f1b", stage, stages, m, boundary,
                    rank - tp, rank + tp)
            VP.optimizer_step(step, params, opt, state)
        state.update(VP.model_states(every, opt))
        state["keep"] = (model, opt)

    VP.measure_and_write(run, state, f"{out_path}.{rank}")


def case(name, sp, seq=512, attention="eager", family="llama", pp=1, m=1, lora=None, **arch_fields):
    setup = R.transformer_setup(V.arch(family, **arch_fields), batch=1, seq=seq, attention=attention)
    setup["training"]["lossImplementation"] = "megatronVocabParallel"
    setup["parallel"] = {"tensorParallel": 2, "sequenceParallel": sp}
    if lora:
        setup["finetune"] = {"lora": True, "r": 8, "loraAlpha": 16, "targetModules": lora}
    if pp > 1:
        setup["parallel"].update(pipelineParallel=pp, gradientAccumulationSteps=m, pipelineSchedule="1f1b")
    return name, setup


CASES = [
    case("llama-tp2", False),
    case("llama-tp2-sp", True),
    case("llama-tp2-sdpa", False, attention="sdpa"),
    case("llama-tp2-sp-sdpa", True, attention="sdpa"),
    # Grouped-query attention: 8 query heads over 4 key/value heads, 4 and 2 on each rank.
    case("llama-gqa-tp2-sp", True, numKeyValueHeads=4),
    # GPT-2: biases (row-parallel ones whole), learned positions, tied head, dropout.
    case("gpt2-tp2", False, family="gpt2"),
    case("gpt2-tp2-sp", True, family="gpt2"),
    # Megatron's 3D layout on four processes: two stages of two tensor-parallel ranks, 1F1B.
    case("llama-pp2-tp2-m2", False, seq=256, pp=2, m=2),
    case("llama-pp2-tp2-sp-m2", True, seq=256, pp=2, m=2),
    # LoRA over Megatron's layers (PEFT's LoraParallelLinear): q and v only (column-parallel
    # bases), and all seven projections (o and down row-parallel).
    case("llama-tp2-lora-qv", False, attention="sdpa", lora=["q_proj", "v_proj"]),
    case("llama-tp2-lora-all", False, lora=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    # ... and over a pipeline (PP 2 × TP 2, 1F1B): the stage's adapters, a received input that
    # requires its gradient on the second stage.
    case("llama-pp2-tp2-lora-m2", False, seq=256, pp=2, m=2, lora=["q_proj", "v_proj", "o_proj", "down_proj"]),
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
        tp, stages = setup["parallel"]["tensorParallel"], setup["parallel"].get("pipelineParallel", 1)
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(measure_rank, args=(tp * stages, setup, free_port(), os.path.join(tmp, "rank")),
                     nprocs=tp * stages, join=True)
            measured = []
            for stage in range(stages):
                with open(os.path.join(tmp, f"rank.{stage * tp}")) as f:
                    measured.append(json.load(f))
        for stage, got in enumerate(measured):
            staged = copy.deepcopy(setup)
            if stages > 1:
                staged["parallel"]["pipelineStage"] = stage
            pred = V.predict(args.cli, staged)
            states = all(pred[k] == got[k] for k in ("parameters", "gradients", "optimizerStates"))
            exact_all &= states
            err = V.pct(pred["peak"], got["peak"])
            worst = max(worst, abs(err))
            phases = "  ".join(f"{ph} {V.pct(pred['phasePeaks'].get(ph, 0), got['phasePeaks'][ph]):+.2f}%"
                               for ph in V.PHASES if got["phasePeaks"].get(ph))
            where = f"{name} stage {stage}" if stages > 1 else name
            diff = {k: (pred[k], got[k]) for k in ("parameters", "gradients", "optimizerStates")}
            print(f"{where:28} states {'exact' if states else 'DIFF ' + str(diff)}"
                  f"  peak predicted {pred['peak']:>12,} measured {got['peak']:>12,} ({err:+.2f}%, "
                  f"{pred['peak'] - got['peak']:+,} B)  phases: {phases}")
    print(f"\nworst peak |error| {worst:.2f}%")
    sys.exit(0 if exact_all and worst <= 5.0 else 1)


if __name__ == "__main__":
    main()
