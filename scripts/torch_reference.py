"""PyTorch reference implementations of the transformer families the estimator models.

The same JSON setup the gpumem CLI reads ({"model": {"kind": "transformer", "architecture":
{...}}, "training": {...}}) is rebuilt here as nn.Modules that follow Hugging Face
transformers' current eager code op by op (GPT2LMHeadModel, LlamaForCausalLM and its
Mistral / Qwen2 / Mixtral / Qwen2-MoE relatives, BertForSequenceClassification and
BertForMaskedLM), with HF's parameter names. `measure_transformer(setup)` runs init and two
training steps with HF Trainer semantics under validate.py's byte-exact allocation tracker and
returns the same figures as validate.py's `measure`.

Everything runs on CPU with Debian's torch 1.13 (`/usr/bin/python3`): no `transformers`, no
`F.scaled_dot_product_attention`, no fp16 matmul, no CPU GradScaler. What that changes, and how
it is approximated, is said where it happens (search for "CPU torch 1.13"). In short:
- sdpa: a custom autograd.Function emulates the fused kernel's memory (FusedAttentionEmulation).
- fp16Mixed / ampFp16 run in bf16 (same byte sizes); ampFp16 scales the loss by 2**16 and
  unscales in place, without GradScaler's inf check.
- CPU autocast leaves layer_norm and pow in bf16 where CUDA's runs them in fp32: the cast is
  inserted by hand (cuda_autocast_fp32).
- CPU's F.dropout keeps a mask in the activation's dtype; the harness calls native_dropout, CUDA's
  path, which keeps a 1-byte bool mask.
- Wrapped Python scalars (0-dim fp64, 8 B, e.g. `* scaling`) are saved on the CPU here as on
  CUDA, so they appear in "saved" though they are not GPU memory.
- Debian's torch uses reference BLAS: fp32 matmuls are ~100x slower than bf16 (oneDNN), so
  keep fp32 / amp cases small (hidden <= 256) or expect minutes.

Usage: /usr/bin/python3 scripts/torch_reference.py --selftest
       /usr/bin/python3 scripts/torch_reference.py setup.json     (prints the measured figures)
"""
import argparse
import contextlib
import functools
import json
import math
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Importing validate also installs its torch >= 2.0 foreach Adam/AdamW op sequence.
import finetune_reference  # noqa: E402
import validate  # noqa: E402
from validate import PHASES, allocation_events, cuda_sum_scratch, emulate_cuda_bias_sums, make_optimizer, summarise  # noqa: E402

SDPA_BLOCK = 64          # query rows per block of the emulated fused attention kernel
AMP_FP16_SCALE = 65536.0  # GradScaler's initial scale (init_scale=2.**16)


# ---------------------------------------------------------------------------------------------
# The setup, read with the estimator's defaults.

def read_config(setup):
    """Architecture and training knobs from the setup document, defaults filled in."""
    a = setup["model"]["architecture"]
    t = setup.get("training", {})
    family = a["family"]
    if family not in ("gpt2", "llama", "bert", "gptNeox"):
        raise ValueError(f"unknown family {family!r}")
    h, heads = a["hiddenSize"], a["numHeads"]
    head_dim = a.get("headDim") or h // heads
    if family != "llama" and head_dim * heads != h:
        raise ValueError(f"{family}: headDim must be hiddenSize / numHeads")
    kv_heads = (a.get("numKeyValueHeads") or heads) if family == "llama" else heads
    if heads % kv_heads:
        raise ValueError("numHeads must be a multiple of numKeyValueHeads")
    inter = a.get("intermediateSize") or 0
    num_experts = (a.get("numExperts") or 0) if family == "llama" else 0
    if not inter:
        if family in ("gpt2", "bert", "gptNeox"):
            inter = 4 * h  # GPT-2's n_inner=None; BERT's configs all use 4h
        elif not (num_experts and a.get("expertIntermediateSize")):
            raise ValueError("llama: intermediateSize is required")
    default_act = {"gpt2": "geluNew", "llama": "silu", "bert": "gelu", "gptNeox": "gelu"}[family]
    cfg = SimpleNamespace(
        family=family,
        vocab=a["vocabSize"], hidden=h, layers=a["numLayers"], heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, inter=inter,
        max_pos=a.get("maxPositionEmbeddings") or 0,
        type_vocab=a.get("typeVocabSize") or 2,
        tie=a.get("tieWordEmbeddings", family in ("gpt2", "bert")),
        attention_bias=bool(a.get("attentionBias", family == "gptNeox")),
        # LlamaAttention's o_proj with attention_bias; LlamaMLP's mlp_bias
        output_bias=family == "llama" and bool(a.get("outputBias", False)),
        mlp_bias=family == "llama" and bool(a.get("mlpBias", False)),
        parallel_residual=bool(a.get("parallelResidual", True)),
        qk_norm=family == "llama" and bool(a.get("queryKeyNorm", False)),
        rms_unit_offset=family == "llama" and bool(a.get("rmsNormUnitOffset", False)),
        embedding_scale=family == "llama" and bool(a.get("embeddingScale", False)),
        fused_projections=family == "llama" and bool(a.get("fusedProjections", False)),
        # Gemma 2 (transformers models/gemma2/modeling_gemma2.py)
        sandwich_norms=family == "llama" and bool(a.get("sandwichNorms", False)),
        attn_softcap=float(a.get("attentionLogitSoftcap") or 0.0) if family == "llama" else 0.0,
        final_softcap=float(a.get("finalLogitSoftcap") or 0.0) if family == "llama" else 0.0,
        sliding_window=int(a.get("slidingWindow") or 0) if family == "llama" else 0,
        sliding_pattern=int(a.get("slidingWindowPattern") or 0),
        gemma3_layout=family == "llama" and bool(a.get("gemma3Layout", False)),
        # OLMo 2 (transformers models/olmo2/modeling_olmo2.py)
        olmo2_layout=family == "llama" and bool(a.get("olmo2Layout", False)),
        rotary_fp32=family == "llama" and bool(a.get("rotaryFp32", False)),
        # Granite (transformers models/granite/modeling_granite.py): scalar multipliers
        granite=family == "llama" and bool(a.get("graniteMultipliers", False)),
        # SmolLM3 (transformers models/smollm3/modular_smollm3.py): no RoPE on every n-th layer
        no_rope_interval=int(a.get("noRopeInterval") or 0) if family == "llama" else 0,
        # Phi3RotaryEmbedding: dim = int(head_dim * partial_rotary_factor)
        rotary_dim=int(head_dim * float(a.get("partialRotaryFactor") or 1.0)),
        act=a.get("hiddenAct") or default_act,
        num_experts=num_experts,
        top_k=a.get("expertsPerToken") or 2,
        expert_inter=a.get("expertIntermediateSize") or inter,
        shared_inter=a.get("sharedExpertIntermediateSize") or 0,
        shared_gate=bool(a.get("sharedExpertGate", False)),
        # norm_topk_prob (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock; Mixtral always)
        norm_topk=bool(a.get("normTopkProb", True)),
        hidden_dropout=float(a.get("hiddenDropout") or 0.0),
        attention_dropout=float(a.get("attentionDropout") or 0.0),
        head=a.get("encoderHead") or "classification",
        num_labels=a.get("numLabels") or 2,
        attention=t.get("attention", "eager"),
        checkpointing=t.get("checkpointing", "none"),
        interval=t.get("checkpointInterval") or 1,
        # torch.utils.checkpoint's use_reentrant (HF's default True; False as
        # gradient_checkpointing_kwargs={"use_reentrant": False} passes it).
        use_reentrant=t.get("useReentrant", True),
        rms_eps=1e-6, ln_eps={"gpt2": 1e-5, "bert": 1e-12}.get(family, 1e-5),  # GPT-NeoX: 1e-5
        # Memory savers (issue 11): torchtune's chunked output and loss, the loss without the
        # fp32 upcast.
        loss_chunks=(t.get("lossChunks") or 8) if t.get("lossImplementation") == "chunked" else 0,
        loss_upcast=not t.get("lossInModelDtype", False),
        loss_megatron=t.get("lossImplementation") == "megatronVocabParallel",
        # transformers 5.x's DynamicCache in training (use_cache, on by default; gradient
        # checkpointing turns it off): its first update copies each layer's key and value.
        use_cache=t.get("useCache", True) and t.get("checkpointing", "none") == "none"
        and not t.get("maskedSoftmaxFusion", False),
    )
    if family in ("gpt2", "bert") and cfg.max_pos <= 0:
        raise ValueError(f"{family}: maxPositionEmbeddings is required")
    if cfg.attention not in ("eager", "sdpa"):
        raise ValueError(f"unknown attention {cfg.attention!r}")
    if cfg.checkpointing not in ("none", "everyBlock", "everyKthBlock", "selective"):
        raise ValueError(f"unknown checkpointing {cfg.checkpointing!r}")
    if num_experts and not 0 < cfg.top_k <= num_experts:
        raise ValueError("expertsPerToken must be in 1..numExperts")
    return cfg


def block_checkpointed(cfg, index):
    """Whether decoder/encoder layer `index` is wrapped in torch.utils.checkpoint."""
    if cfg.checkpointing == "everyBlock":
        return True
    if cfg.checkpointing == "everyKthBlock":
        return index % cfg.interval == 0
    return False


def run_layer(cfg, index, layer, *args):
    """HF's GradientCheckpointingLayer with use_reentrant=True (HF's default) or False; the mask
    and the rotary cos/sin travel as extra positional args, so the checkpoint saves them."""
    if block_checkpointed(cfg, index):
        return checkpoint(layer, *args, use_reentrant=cfg.use_reentrant)
    return layer(*args)


# ---------------------------------------------------------------------------------------------
# Autocast: CUDA's op lists, where CPU torch 1.13's differ.
#
# Under amp the estimator follows CUDA autocast. CPU torch 1.13's autocast agrees on what the
# models here use (matmul/linear/addmm to bf16; cross_entropy, nll_loss, mse_loss to fp32;
# softmax with an explicit dtype as is; binary ops by type promotion) except for two ops that
# CUDA runs in fp32 and CPU 1.13 leaves alone: layer_norm and pow. Those get the cast CUDA
# autocast would insert (a copy of a bf16 input in fp32), by hand.

def cuda_autocast_fp32(x):
    """What CUDA autocast does to a floating input of an op on its fp32 list."""
    if torch.is_autocast_cpu_enabled() and x.is_floating_point() and x.dtype != torch.float32:
        return x.to(torch.float32)
    return x


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm; under autocast its input is cast to fp32 as CUDA autocast does."""

    def forward(self, input):
        return super().forward(cuda_autocast_fp32(input))


# ---------------------------------------------------------------------------------------------
# Activations (transformers.activations.ACT2FN).

def activation(name, x):
    if name == "gelu":        # GELUActivation: the exact erf form
        return F.gelu(x)
    if name == "geluTanh":    # PytorchGELUTanh
        return F.gelu(x, approximate="tanh")
    if name == "geluNew":     # NewGELUActivation, written out as HF does (one tensor per op);
        # under autocast pow runs in fp32, so the rest of the expression does too
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(cuda_autocast_fp32(x), 3.0))))
    if name == "silu":        # SiLUActivation = F.silu
        return F.silu(x)
    raise ValueError(f"unknown hiddenAct {name!r}")


# ---------------------------------------------------------------------------------------------
# Attention, shared by the three families.

def repeat_kv(hidden_states, n_rep):
    """HF repeat_kv: (b, kvh, s, d) -> (b, kvh*n_rep, s, d); the input itself when n_rep == 1."""
    if n_rep == 1:
        return hidden_states
    b, kvh, s, d = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(b, kvh, n_rep, s, d)  # a view
    return hidden_states.reshape(b, kvh * n_rep, s, d)                          # the copy


def dropout(x, p):
    """F.dropout as CUDA runs it: ATen's native_dropout, which keeps a 1-byte bool mask for
    backward. CPU's F.dropout keeps a mask of x's dtype (4 B per element in fp32); CPU torch
    1.13 has native_dropout too, so the harness calls it directly. p = 0 is the identity."""
    if p <= 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


class Dropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        return dropout(x, self.p) if self.training else x


def eager_attention(query, key, value, mask, *, n_rep, scaling, dropout_p, softmax_fp32=True, softcap=0.0):
    """HF eager_attention_forward (llama's, used here for all three families). GPT-2's own
    (transformers 5.x modeling_gpt2.py) calls softmax in the scores' dtype, then .type(value's):
    softmax_fp32=False; CUDA autocast still runs it in fp32."""
    key_states = repeat_kv(key, n_rep)
    value_states = repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling   # (b,h,s,s), then * scaling: a second one
    if softcap:   # Gemma 2's attn_logit_softcapping
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if mask is not None:
        causal_mask = mask[:, :, :, : key_states.shape[-2]]                    # a view
        attn_weights = attn_weights + causal_mask                              # (b,h,s,s), fp32 under autocast (mask is fp32)
    if softmax_fp32 or torch.is_autocast_cpu_enabled():
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)  # fp32 softmax, cast back
    else:
        attn_weights = F.softmax(attn_weights, dim=-1)  # GPT-2 in 16-bit weights: the scores' dtype
    attn_weights = dropout(attn_weights, dropout_p)
    attn_output = torch.matmul(attn_weights, value_states)                      # (b,h,s,d)
    attn_output = attn_output.transpose(1, 2).contiguous()                      # (b,s,h,d) copy
    return attn_output


def _dropout_drop(gen, shape, p):
    """The kernel's dropout mask (True = dropped) for one block, regenerated identically in
    backward from the same seed (the flash kernels regenerate theirs from a Philox seed instead
    of storing it)."""
    return torch.rand(shape, generator=gen) < p


class FusedAttentionEmulation(torch.autograd.Function):
    """Stands in for a fused flash / memory-efficient SDPA kernel (CPU torch 1.13 has none).

    Forward computes attention one 64-query-row block of one (batch, head) at a time, so no
    s x s tensor ever exists, only blocks of 64 x s (causal: 64 x the keys up to the block's
    last row, as flash skips the blocks above the diagonal). It returns out and saves exactly
    q, k, v, out and an fp32 logsumexp (b, heads, s). As the CUDA kernels do, out is allocated
    in the (b, s, heads, d) layout and returned as its (b, heads, s, d) transpose, so the
    caller's `transpose(1, 2).contiguous()` copies nothing.

    Backward follows FlashAttention-2: dq, dk, dv are allocated, then an fp32 "delta"
    (b, heads, s) = rowsum(dO * O) and an fp32 dq accumulator of dq's size; the blocks are
    recomputed; both fp32 buffers are freed before returning. (Per (batch, head) the backward
    also holds fp32 dk/dv accumulators of s x d, which the real kernel keeps in registers.)
    Matmuls run in the inputs' dtype, softmax and accumulation in fp32, as FA2's MMAs do."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scaling, dropout_p, seed, n_rep=1):
        with torch.autocast("cpu", enabled=False):  # the kernel picks its own precisions
            b, h, s, d = q.shape
            acc = torch.promote_types(q.dtype, torch.float32)   # fp32 (fp64 only for gradcheck)
            out = torch.empty((b, s, h, d), dtype=q.dtype).transpose(1, 2)   # (b,h,s,d) view of (b,s,h,d)
            lse = torch.empty((b, h, s), dtype=acc)
            tri = torch.ones((SDPA_BLOCK, SDPA_BLOCK), dtype=torch.bool).triu_(1) if causal else None
            gen = torch.Generator().manual_seed(seed) if dropout_p > 0 else None
            for bi in range(b):
                for hi in range(h):
                    q_bh, k_bh, v_bh = q[bi, hi], k[bi, hi // n_rep], v[bi, hi // n_rep]
                    for r0 in range(0, s, SDPA_BLOCK):
                        r1 = min(r0 + SDPA_BLOCK, s)
                        kv_end = r1 if causal else s
                        scores = torch.matmul(q_bh[r0:r1], k_bh[:kv_end].t()).to(acc).mul_(scaling)
                        if causal:   # the diagonal tile
                            scores[:, r0:r1].masked_fill_(tri[:r1 - r0, :r1 - r0], float("-inf"))
                        m = torch.logsumexp(scores, dim=-1)
                        lse[bi, hi, r0:r1] = m
                        p = scores.sub_(m[:, None]).exp_()
                        if dropout_p > 0:
                            p.masked_fill_(_dropout_drop(gen, p.shape, dropout_p), 0.0).mul_(1.0 / (1.0 - dropout_p))
                        out[bi, hi, r0:r1] = torch.matmul(p.to(v.dtype), v_bh[:kv_end])
                        del scores, m, p
        ctx.causal, ctx.scaling, ctx.dropout_p, ctx.seed, ctx.n_rep = causal, scaling, dropout_p, seed, n_rep
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scaling, dropout_p, n_rep = ctx.causal, ctx.scaling, ctx.dropout_p, ctx.n_rep
        with torch.autocast("cpu", enabled=False):
            b, h, s, d = q.shape
            kvh = h // n_rep
            dt = q.dtype
            acc = torch.promote_types(dt, torch.float32)
            dq = torch.empty((b, s, h, d), dtype=q.dtype).transpose(1, 2)
            dk = torch.empty((b, s, kvh, d), dtype=k.dtype).transpose(1, 2)
            dv = torch.empty((b, s, kvh, d), dtype=v.dtype).transpose(1, 2)
            delta = torch.empty((b, h, s), dtype=acc)                              # FA2's softmax_d
            dq_acc = torch.zeros((b, s, h, d), dtype=acc).transpose(1, 2)          # FA2's dq_accum
            # Grouped kv heads (flash_api.cpp mha_bwd): dk and dv per query head, summed over
            # each group into dk, dv after the kernel.
            dk_exp = torch.empty((b, s, h, d), dtype=dt).transpose(1, 2) if n_rep > 1 else dk
            dv_exp = torch.empty((b, s, h, d), dtype=dt).transpose(1, 2) if n_rep > 1 else dv
            for bi in range(b):
                for hi in range(h):
                    delta[bi, hi] = (dout[bi, hi].to(acc) * out[bi, hi].to(acc)).sum(-1)
            tri = torch.ones((SDPA_BLOCK, SDPA_BLOCK), dtype=torch.bool).triu_(1) if causal else None
            gen = torch.Generator().manual_seed(ctx.seed) if dropout_p > 0 else None
            for bi in range(b):
                for hi in range(h):
                    q_bh, k_bh, v_bh = q[bi, hi], k[bi, hi // n_rep], v[bi, hi // n_rep]
                    dk_acc = torch.zeros((s, d), dtype=acc)
                    dv_acc = torch.zeros((s, d), dtype=acc)
                    for r0 in range(0, s, SDPA_BLOCK):
                        r1 = min(r0 + SDPA_BLOCK, s)
                        kv_end = r1 if causal else s
                        q_blk, do_blk = q_bh[r0:r1], dout[bi, hi, r0:r1]
                        k_blk, v_blk = k_bh[:kv_end], v_bh[:kv_end]
                        scores = torch.matmul(q_blk, k_blk.t()).to(acc).mul_(scaling)
                        if causal:
                            scores[:, r0:r1].masked_fill_(tri[:r1 - r0, :r1 - r0], float("-inf"))
                        p = scores.sub_(lse[bi, hi, r0:r1, None]).exp_()        # recomputed probabilities
                        dp = torch.matmul(do_blk, v_blk.t()).to(acc)            # dO V^T
                        if dropout_p > 0:
                            drop = _dropout_drop(gen, p.shape, dropout_p)
                            p_used = p.masked_fill(drop, 0.0).mul_(1.0 / (1.0 - dropout_p))
                            dp.masked_fill_(drop, 0.0).mul_(1.0 / (1.0 - dropout_p))
                            del drop
                        else:
                            p_used = p
                        dv_acc[:kv_end] += torch.matmul(p_used.to(dt).t(), do_blk)
                        ds = dp.sub_(delta[bi, hi, r0:r1, None]).mul_(p).mul_(scaling).to(dt)
                        dq_acc[bi, hi, r0:r1] = torch.matmul(ds, k_blk)
                        dk_acc[:kv_end] += torch.matmul(ds.t(), q_blk)
                        del scores, p, dp, p_used, ds
                    dk_exp[bi, hi] = dk_acc
                    dv_exp[bi, hi] = dv_acc
                    del dk_acc, dv_acc
            dq.copy_(dq_acc)
            if n_rep > 1:   # at::sum_out(dk, dk_expanded viewed (b, s, kvh, n_rep, d), {3})
                torch.sum(dk_exp.transpose(1, 2).view(b, s, kvh, n_rep, d), dim=3, out=dk.transpose(1, 2))
                torch.sum(dv_exp.transpose(1, 2).view(b, s, kvh, n_rep, d), dim=3, out=dv.transpose(1, 2))
            del dq_acc, delta, dk_exp, dv_exp
        return dq, dk, dv, None, None, None, None, None


def sdpa_attention(query, key, value, mask, *, n_rep, scaling, dropout_p, causal):
    """HF sdpa_attention_forward with the fused kernel emulated. The all-ones padding mask is
    dropped (HF passes attn_mask=None, is_causal=True for decoders, nothing for BERT)."""
    assert mask is None
    # From PyTorch 2.5 HF passes enable_gqa=True instead of repeating when there is no mask
    # (integrations/sdpa_attention.py use_gqa_in_sdpa); flash, the kernel for 16-bit inputs,
    # reads the grouped heads as they are. In fp32 the repeat stays (as the simulation has it).
    grouped = n_rep > 1 and (torch.is_autocast_cpu_enabled() or query.dtype != torch.float32)
    if not grouped:
        key = repeat_kv(key, n_rep)      # HF repeats before the kernel
        value = repeat_kv(value, n_rep)
    if torch.is_autocast_cpu_enabled():
        # scaled_dot_product_attention is on autocast's lower-precision list: every floating
        # input not already in the autocast dtype is cast (copied), as cached_cast does.
        dt = torch.get_autocast_cpu_dtype()
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if dropout_p > 0 else 0  # Philox seed
    attn_output = FusedAttentionEmulation.apply(query, key, value, causal, scaling, dropout_p, seed,
                                                n_rep if grouped else 1)
    attn_output = attn_output.transpose(1, 2).contiguous()   # already (b,s,h,d)-contiguous: no copy
    return attn_output


def attention_core(cfg, query, key, value, mask, *, n_rep, causal):
    """q, k, v (b, heads, s, d) in, attn_output (b, s, heads, d) out; eager or sdpa, wrapped in
    a checkpoint for "selective" checkpointing."""
    kwargs = dict(n_rep=n_rep, scaling=cfg.head_dim ** -0.5, dropout_p=cfg.attention_dropout)
    if cfg.attention == "sdpa":
        fn = functools.partial(sdpa_attention, causal=causal, **kwargs)
    else:
        fn = functools.partial(eager_attention, softmax_fp32=cfg.family != "gpt2", softcap=cfg.attn_softcap, **kwargs)
    if cfg.checkpointing == "selective":
        return checkpoint(fn, query, key, value, mask, use_reentrant=cfg.use_reentrant)
    return fn(query, key, value, mask)


def sliding_eager_mask(b, s, dtype, window):
    """Gemma 2's sliding layers' eager mask (create_sliding_window_causal_mask): also finfo.min
    where a key is `window` or more tokens behind the query."""
    min_dtype = torch.finfo(dtype).min
    keep = torch.ones((s, s), dtype=torch.bool).tril().triu(diagonal=-(window - 1))  # (s,s) temporaries
    causal_mask = torch.where(keep, torch.tensor(0.0, dtype=dtype), torch.tensor(min_dtype, dtype=dtype))
    return causal_mask[None, None, :, :].expand(b, 1, s, s).contiguous()


def sliding_layer(cfg, i):
    """Gemma2Config.layer_types: sliding unless (i + 1) % pattern == 0."""
    return cfg.sliding_window > 0 and (cfg.sliding_pattern == 0 or (i + 1) % cfg.sliding_pattern != 0)


def decoder_eager_mask(b, s, dtype):
    """The eager 4D causal mask, (b, 1, s, s) in the embeddings' dtype: 0 on and below the
    diagonal, finfo.min above. The attention mask is all ones, so padding adds nothing."""
    min_dtype = torch.finfo(dtype).min
    causal_mask = torch.full((s, s), min_dtype, dtype=dtype)        # (s,s) temporary
    causal_mask = torch.triu(causal_mask, diagonal=1)               # (s,s) temporary
    return causal_mask[None, None, :, :].expand(b, 1, s, s).contiguous()  # the (b,1,s,s) mask


# ---------------------------------------------------------------------------------------------
# GPT-2 (GPT2LMHeadModel).

class GPT2Attention(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        # HF's Conv1D keeps its weight as (h, 3h); nn.Linear's (3h, h) has the same size.
        self.c_attn = nn.Linear(h, 3 * h, dtype=dtype, device=device)
        self.c_proj = nn.Linear(h, h, dtype=dtype, device=device)
        self.resid_dropout = Dropout(cfg.hidden_dropout)

    def forward(self, hidden_states, mask):
        cfg = self.cfg
        b, s, _ = hidden_states.shape
        query, key, value = self.c_attn(hidden_states).split(cfg.hidden, dim=2)   # (b,s,3h), three views
        query = query.view(b, s, -1, cfg.head_dim).transpose(1, 2)
        key = key.view(b, s, -1, cfg.head_dim).transpose(1, 2)
        value = value.view(b, s, -1, cfg.head_dim).transpose(1, 2)
        if cfg.use_cache and cfg.attention == "sdpa" and not cfg.loss_megatron:
            # DynamicLayer.update (transformers 5.x cache_utils.py): torch.cat onto an empty
            # tensor, a contiguous copy of each that the attention then takes. Under eager
            # attention the copies stand in for the ones matmul makes of the non-contiguous views
            # (measured: the same bytes with and without the cache), so they are left out there.
            key = torch.cat([key.new_empty(b, key.shape[1], 0, cfg.head_dim), key], dim=-2)
            value = torch.cat([value.new_empty(b, value.shape[1], 0, cfg.head_dim), value], dim=-2)
        attn_output = attention_core(cfg, query, key, value, mask, n_rep=1, causal=True)
        attn_output = attn_output.reshape(b, s, -1).contiguous()   # a view
        attn_output = self.c_proj(attn_output)
        attn_output = self.resid_dropout(attn_output)
        return attn_output


class GPT2MLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.act = cfg.act
        self.c_fc = nn.Linear(cfg.hidden, cfg.inter, dtype=dtype, device=device)
        self.c_proj = nn.Linear(cfg.inter, cfg.hidden, dtype=dtype, device=device)
        self.dropout = Dropout(cfg.hidden_dropout)

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = activation(self.act, hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.attn = GPT2Attention(cfg, dtype, device)
        self.ln_2 = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.mlp = GPT2MLP(cfg, dtype, device)

    def forward(self, hidden_states, mask):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states, mask)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return hidden_states


class GPT2Model(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype, device=device)
        self.wpe = nn.Embedding(cfg.max_pos, cfg.hidden, dtype=dtype, device=device)
        self.drop = Dropout(cfg.hidden_dropout)
        self.h = nn.ModuleList([GPT2Block(cfg, dtype, device) for _ in range(cfg.layers)])
        self.ln_f = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)

    def forward(self, input_ids, attention_mask):
        cfg = self.cfg
        b, s = input_ids.shape
        inputs_embeds = self.wte(input_ids)
        position_ids = torch.arange(s)[None]                      # cache_position.unsqueeze(0)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds
        del inputs_embeds, position_embeds
        mask = decoder_eager_mask(b, s, hidden_states.dtype) if cfg.attention == "eager" else None
        hidden_states = self.drop(hidden_states)
        for i, block in enumerate(self.h):
            hidden_states = run_layer(cfg, i, block, hidden_states, mask)
        hidden_states = self.ln_f(hidden_states)
        return hidden_states


def output_head(cfg, embedding, dtype, device):
    """The decoders' vocabulary projection: its own weight, or (tied) the embedding's, built on
    meta and then tied, so that no transient V x h weight exists (from_pretrained's way)."""
    if not cfg.tie:
        return nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dtype, device=device)
    head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dtype, device="meta")
    head.weight = embedding.weight
    return head


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg, dtype, device, **unused):
        super().__init__()
        self.cfg = cfg
        self.transformer = GPT2Model(cfg, dtype, device)
        self.lm_head = output_head(cfg, self.transformer.wte, dtype, device)

    def forward(self, input_ids, attention_mask, labels):
        return decoder_head_and_loss(self.cfg, self.lm_head, [self.transformer(input_ids, attention_mask)], labels)


def causal_lm_loss(logits, labels, vocab_size, ignore_index=-100, upcast=True):
    """HF ForCausalLMLoss (mean reduction); upcast=False: the loss in the model's dtype
    (nanoGPT-style, no logits.float(); CPU autocast still runs it in fp32)."""
    if upcast:
        logits = logits.float()                                       # a copy unless already fp32
    labels = F.pad(labels, (0, 1), value=ignore_index)                # (b, s+1)
    shift_labels = labels[..., 1:].contiguous()                       # (b, s)
    del labels
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1)
    return F.cross_entropy(logits, shift_labels, ignore_index=ignore_index)


class MegatronVocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's _VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py,
    d98e8a6: VocabParallelCrossEntropy.calculate_logits_max, calculate_predicted_logits,
    calculate_cross_entropy_loss, prepare_gradient_calculation_operands, calculate_gradients;
    forward l.121-183, backward l.186-210) on one tensor-parallel rank, no label smoothing.
    `vocab_start_index` is where the rank's slice of the vocabulary starts; `all_reduce(tensor,
    op)` is Megatron's in-place all-reduce over the tensor-parallel group (None with t = 1, where
    the slice is the whole vocabulary and the all-reduces change nothing)."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, vocab_start_index=0, all_reduce=None):
        reduce = all_reduce or (lambda tensor, op: None)
        vocab_parallel_logits = vocab_parallel_logits.float()
        logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]
        reduce(logits_max, "max")
        vocab_end_index = vocab_start_index + vocab_parallel_logits.size(-1)
        vocab_parallel_logits -= logits_max.unsqueeze(dim=-1)
        target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
        masked_target = target.clone() - vocab_start_index
        masked_target[target_mask] = 0
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size()[0], device=logits_2d.device)
        predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]
        predicted_logits_1d = predicted_logits_1d.clone().contiguous()
        predicted_logits = predicted_logits_1d.view_as(target)
        predicted_logits[target_mask] = 0.0
        reduce(predicted_logits, "sum")
        exp_logits = vocab_parallel_logits
        torch.exp(vocab_parallel_logits, out=exp_logits)
        sum_exp_logits = exp_logits.sum(dim=-1)
        reduce(sum_exp_logits, "sum")
        del logits_2d, arange_1d, predicted_logits_1d, masked_target, vocab_parallel_logits
        loss = torch.log(sum_exp_logits) - predicted_logits
        exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = softmax
        partition_vocab_size = softmax.size()[-1]
        grad_2d = grad_input.view(-1, partition_vocab_size)
        arange_1d = torch.arange(start=0, end=grad_2d.size()[0], device=grad_2d.device)
        softmax_update = 1.0 - target_mask.view(-1).float()
        grad_2d[arange_1d, masked_target_1d] -= softmax_update
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None, None, None


def megatron_language_model_loss(logits, labels, vocab_start_index=0, all_reduce=None):
    """GPTModel's loss: LanguageModule.compute_language_model_loss (language_module.py l.172,
    l.200, l.205), then pretrain_gpt.py loss_func (l.254-256) with the batch's fp32 loss_mask
    (made here, with the loss). Megatron's logits are [s, b, V]; the harness's are [b, s, V], so
    the [s, b] labels are viewed as [b, s] (no copy) to meet them: the same bytes, another token
    order (the loss value is not Megatron's; its memory is)."""
    labels = labels.transpose(0, 1).contiguous()
    loss = MegatronVocabParallelCrossEntropy.apply(logits, labels.view(logits.shape[:-1]), vocab_start_index, all_reduce)
    del labels
    loss = loss.transpose(0, 1).contiguous()
    loss_mask = torch.ones(loss.shape, dtype=torch.float)
    losses = loss.view(-1).float()
    del loss
    loss_mask = loss_mask.view(-1).float()
    return torch.sum(losses * loss_mask)


def decoder_head_and_loss(cfg, lm_head, holder, labels):
    """The LM head and the loss: HF's (full logits, ForCausalLMLoss) or, with cfg.loss_chunks,
    torchtune's: TransformerDecoder.chunked_output, then the recipe's label shift and
    CEWithChunkedOutputLoss.forward (torchtune/modules/loss/ce_chunked_output_loss.py).
    `holder` is a one-element list the caller hands the final hidden states over in, keeping no
    reference of its own: HF's *ForCausalLM.forward keeps them (here the local below) until it
    returns, after the loss; torchtune's TransformerDecoder returns the chunk logits first, so
    `h` goes before the recipe's loss (the `del` below)."""
    hidden_states = holder.pop()
    if cfg.loss_megatron:
        logits = lm_head(hidden_states)          # ColumnParallelLinear, parallel_output=True (t = 1)
        return megatron_language_model_loss(logits, labels), logits
    if not cfg.loss_chunks:
        logits = lm_head(hidden_states)          # logits_to_keep=0: all positions (a view slice)
        if cfg.final_softcap:                    # Gemma2ForCausalLM's final_logit_softcapping
            logits = logits / cfg.final_softcap
            logits = torch.tanh(logits)
            logits = logits * cfg.final_softcap
        if cfg.granite:                          # GraniteForCausalLM: logits / logits_scaling
            logits = logits / 8.0
        return causal_lm_loss(logits, labels, cfg.vocab, upcast=cfg.loss_upcast), logits
    logits = [lm_head(chunk) for chunk in hidden_states.chunk(cfg.loss_chunks, dim=1)]
    del hidden_states
    # The recipe: labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[:b])).
    labels = torch.hstack((labels[..., 1:], torch.full((labels.shape[0], 1), -100, dtype=labels.dtype)))
    total_elements = (labels != -100).sum()
    labels = [c.reshape(-1) for c in labels.chunk(cfg.loss_chunks, dim=1)]
    chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    total_loss = 0.0
    for logits_chunk, labels_chunk in zip(chunks, labels):
        x = logits_chunk.float() if cfg.loss_upcast else logits_chunk
        total_loss += F.cross_entropy(x, labels_chunk, ignore_index=-100, reduction="sum")
        del x
    del logits_chunk, labels_chunk, chunks, labels  # the loop's names would keep the last alive
    return total_loss / total_elements, logits


# ---------------------------------------------------------------------------------------------
# Llama family (LlamaForCausalLM; Mistral, Qwen2 via numKeyValueHeads / attentionBias;
# Mixtral / Qwen2-MoE via numExperts).

class _MeanKeepingSize(torch.autograd.Function):
    """x.mean(-1, keepdim=True) as torch >= 2.0 differentiates it: its backward keeps only the
    input's size (derivatives.yaml: mean_backward(grad, self.sym_sizes(), …)). torch 1.13's
    MeanBackward1 kept the input itself, one hidden-sized fp32 tensor per RMSNorm that current
    releases no longer hold; the estimator follows current releases."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.mean(-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape) / ctx.shape[-1]


def mean_last_dim(x):
    if torch.__version__ < "2":
        return _MeanKeepingSize.apply(x)
    return x.mean(-1, keepdim=True)


class LlamaRMSNorm(nn.Module):
    """LlamaRMSNorm, or with unit_offset GemmaRMSNorm (transformers models/gemma/modeling_gemma.py:
    the weight applied as 1 + weight in fp32 before the cast back)."""

    def __init__(self, hidden, eps, dtype, device, unit_offset=False, olmo=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.variance_epsilon = eps
        self.unit_offset = unit_offset
        self.olmo = olmo   # Olmo2RMSNorm: (weight * fp32 rows).to(input_dtype)

    def _sum_scratch_on_cuda(self, out):
        """The weight's gradient, grad * x at full size (x the 16-bit cast, or Gemma's fp32 rows
        times 1 + weight), is summed over the rows on CUDA with a scratch buffer
        (validate.cuda_sum_scratch); the full-size product is still live then, and freed by the
        time the node's post hook runs here, so it is counted in."""
        if out.grad_fn is not None and self.weight.requires_grad:
            n = self.weight.numel()
            rows, element_bytes = out.numel() // n, out.element_size()
            product = out.numel() * out.element_size()
            out.grad_fn.register_hook(
                lambda grad_inputs, grad_outputs: cuda_sum_scratch(rows, n, element_bytes, product))
        return out

    def forward(self, hidden_states):
        if self.unit_offset:
            h = hidden_states.float()
            h = h * torch.rsqrt(mean_last_dim(h.pow(2)) + self.variance_epsilon)
            return self._sum_scratch_on_cuda(h * (1.0 + self.weight.float())).type_as(hidden_states)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = mean_last_dim(hidden_states.pow(2))
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.olmo:
            return self._sum_scratch_on_cuda(self.weight * hidden_states).to(input_dtype)
        return self._sum_scratch_on_cuda(self.weight * hidden_states.to(input_dtype))


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, cfg, device, base=10000.0):
        super().__init__()
        d = cfg.rotary_dim
        self.keep_fp32 = getattr(cfg, "rotary_fp32", False)   # Olmo2RotaryEmbedding: no cast
        inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)   # fp32 (d/2,)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast("cpu", enabled=False):  # HF forces fp32 here
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos()
            sin = emb.sin()
        if self.keep_fp32:
            return cos, sin
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)   # (1, s, d) each


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate(x, cos, sin):
    return (x * cos) + (rotate_half(x) * sin)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, cast_back=False):
    # OLMo 2 and 3 cast the rotated q and k back to their dtype (q_embed.to(q_type)); Llama's
    # keep the promoted dtype (fp32 under autocast, where the tables are fp32).
    q_type, k_type = q.dtype, k.dtype
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed, k_embed = rotate(q, cos, sin), rotate(k, cos, sin)
    if cast_back:
        return q_embed.to(q_type), k_embed.to(k_type)
    return q_embed, k_embed


class LlamaAttention(nn.Module):
    def __init__(self, cfg, dtype, device, use_rope=True):
        super().__init__()
        self.cfg = cfg
        self.use_rope = use_rope   # SmolLM3Attention: config.no_rope_layers[layer_idx]
        h, d = cfg.hidden, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, cfg.heads * d, bias=bias, dtype=dtype, device=device)
        self.k_proj = nn.Linear(h, cfg.kv_heads * d, bias=bias, dtype=dtype, device=device)
        self.v_proj = nn.Linear(h, cfg.kv_heads * d, bias=bias, dtype=dtype, device=device)
        # (LlamaAttention's o_proj takes attention_bias too; Qwen2's has none.)
        self.o_proj = nn.Linear(cfg.heads * d, h, bias=cfg.output_bias, dtype=dtype, device=device)
        if cfg.qk_norm and cfg.olmo2_layout:   # Olmo2Attention: over the whole projections
            self.q_norm = LlamaRMSNorm(cfg.heads * d, cfg.rms_eps, dtype, device, olmo=True)
            self.k_norm = LlamaRMSNorm(cfg.kv_heads * d, cfg.rms_eps, dtype, device, olmo=True)
        elif cfg.qk_norm:   # Qwen3Attention: an RMSNorm over each head of q and k
            self.q_norm = LlamaRMSNorm(d, cfg.rms_eps, dtype, device, cfg.rms_unit_offset)
            self.k_norm = LlamaRMSNorm(d, cfg.rms_eps, dtype, device, cfg.rms_unit_offset)

    def forward(self, hidden_states, mask, cos, sin):
        cfg = self.cfg
        b, s, _ = hidden_states.shape
        hidden_shape = (b, s, -1, cfg.head_dim)
        if cfg.olmo2_layout:
            # Olmo2Attention: q_norm(q_proj(x)), k_norm(k_proj(x)), v_proj(x), then the views.
            query_states = self.q_norm(self.q_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
            key_states = self.k_norm(self.k_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        elif cfg.qk_norm and cfg.gemma3_layout:
            # Gemma3Attention: the three projections first, then q_norm and k_norm on the heads.
            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        elif cfg.qk_norm:
            query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        else:
            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if not (cfg.qk_norm and cfg.gemma3_layout):
            value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if self.use_rope:
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin,
                                                            cast_back=cfg.olmo2_layout)
        attn_output = attention_core(cfg, query_states, key_states, value_states, mask,
                                     n_rep=cfg.heads // cfg.kv_heads, causal=True)
        attn_output = attn_output.reshape(b, s, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output


def phi3_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Phi-3's (transformers models/phi3/modeling_phi3.py): the rotary part, then a cat with the
    pass-through part (empty when the rotary dimension is the whole head)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([rotate(q_rot, cos, sin), q_pass], dim=-1)
    k_embed = torch.cat([rotate(k_rot, cos, sin), k_pass], dim=-1)
    return q_embed, k_embed


class Phi3Attention(nn.Module):
    """Phi3Attention: one qkv_proj, sliced into q, k and v."""

    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.head_dim
        op_size = cfg.heads * d + 2 * (cfg.kv_heads * d)
        self.o_proj = nn.Linear(cfg.heads * d, h, bias=False, dtype=dtype, device=device)
        self.qkv_proj = nn.Linear(h, op_size, bias=False, dtype=dtype, device=device)

    def forward(self, hidden_states, mask, cos, sin):
        cfg = self.cfg
        b, s, _ = hidden_states.shape
        hidden_shape = (b, s, -1, cfg.head_dim)
        qkv = self.qkv_proj(hidden_states)
        query_pos = cfg.heads * cfg.head_dim
        query_states = qkv[..., :query_pos]
        key_states = qkv[..., query_pos:query_pos + cfg.kv_heads * cfg.head_dim]
        value_states = qkv[..., query_pos + cfg.kv_heads * cfg.head_dim:]
        query_states = query_states.view(hidden_shape).transpose(1, 2)
        key_states = key_states.view(hidden_shape).transpose(1, 2)
        value_states = value_states.view(hidden_shape).transpose(1, 2)
        query_states, key_states = phi3_apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cfg.use_cache and cfg.attention == "sdpa":
            # DynamicLayer.update's copies, as GPT2Attention's above: SDPA then saves them, not
            # the value's view of qkv.
            key_states = torch.cat([key_states.new_empty(b, key_states.shape[1], 0, cfg.head_dim), key_states], dim=-2)
            value_states = torch.cat([value_states.new_empty(b, value_states.shape[1], 0, cfg.head_dim),
                                      value_states], dim=-2)
        attn_output = attention_core(cfg, query_states, key_states, value_states, mask,
                                     n_rep=cfg.heads // cfg.kv_heads, causal=True)
        attn_output = attn_output.reshape(b, s, -1).contiguous()
        return self.o_proj(attn_output)   # qkv, a local, lives until this returns


class Phi3MLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.act = cfg.act
        self.gate_up_proj = nn.Linear(cfg.hidden, 2 * cfg.inter, bias=False, dtype=dtype, device=device)
        self.down_proj = nn.Linear(cfg.inter, cfg.hidden, bias=False, dtype=dtype, device=device)

    def forward(self, hidden_states):
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * activation(self.act, gate)
        return self.down_proj(up_states)


class LlamaMLP(nn.Module):
    def __init__(self, cfg, inter, dtype, device):
        super().__init__()
        self.act = cfg.act
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden, inter, bias=bias, dtype=dtype, device=device)
        self.up_proj = nn.Linear(cfg.hidden, inter, bias=bias, dtype=dtype, device=device)
        self.down_proj = nn.Linear(inter, cfg.hidden, bias=bias, dtype=dtype, device=device)

    def forward(self, x):
        return self.down_proj(activation(self.act, self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    """MixtralBlockSparseTop2MLP."""

    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.act = cfg.act
        self.w1 = nn.Linear(cfg.hidden, cfg.expert_inter, bias=False, dtype=dtype, device=device)
        self.w2 = nn.Linear(cfg.expert_inter, cfg.hidden, bias=False, dtype=dtype, device=device)
        self.w3 = nn.Linear(cfg.hidden, cfg.expert_inter, bias=False, dtype=dtype, device=device)

    def forward(self, hidden_states):
        current_hidden_states = activation(self.act, self.w1(hidden_states)) * self.w3(hidden_states)
        return self.w2(current_hidden_states)


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock, plus Qwen2-MoE's shared expert when sharedExpertIntermediateSize > 0.

    Validation only: `route_bias` (T x E, built before the measurement, not a parameter) is added
    in place to the router logits so token t picks experts (t*k + j) mod E, j < k: every expert
    gets b*s*k/E tokens (exactly, when E divides b*s*k) whatever the random gate weights say.
    The gate stays a trainable parameter with a real gradient."""

    def __init__(self, cfg, dtype, device, route_bias=None):
        super().__init__()
        self.cfg = cfg
        self.route_bias = route_bias   # a plain attribute: not a parameter, not a buffer
        self.gate = nn.Linear(cfg.hidden, cfg.num_experts, bias=False, dtype=dtype, device=device)
        self.experts = nn.ModuleList([MixtralExpert(cfg, dtype, device) for _ in range(cfg.num_experts)])
        if cfg.shared_inter:
            self.shared_expert = LlamaMLP(cfg, cfg.shared_inter, dtype, device)
            if cfg.shared_gate:
                self.shared_expert_gate = nn.Linear(cfg.hidden, 1, bias=False, dtype=dtype, device=device)

    def forward(self, hidden_states):
        cfg = self.cfg
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)                              # (T, E)
        if self.route_bias is not None:
            router_logits.add_(self.route_bias[router_logits.dtype])          # in place: no allocation
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, cfg.top_k, dim=-1)
        if cfg.norm_topk:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype)
        expert_mask = F.one_hot(selected_experts, num_classes=cfg.num_experts).permute(2, 1, 0)   # (E, k, T)
        for expert_idx in range(cfg.num_experts):
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)   # gathered copy
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
            del idx, top_x, current_state, current_hidden_states
        if cfg.shared_inter:
            shared_expert_output = self.shared_expert(hidden_states)
            if cfg.shared_gate:
                shared_expert_output = torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output
            final_hidden_states = final_hidden_states + shared_expert_output
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)


class Olmo2DecoderLayer(nn.Module):
    """Olmo2DecoderLayer (transformers models/olmo2/modeling_olmo2.py): no input norms, each
    sub-layer's output normalised before its residual add; modules in its registration order."""

    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, dtype, device)
        self.mlp = LlamaMLP(cfg, cfg.inter, dtype, device)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, olmo=True)
        self.post_feedforward_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, olmo=True)

    def forward(self, hidden_states, mask, cos, sin):
        residual = hidden_states
        hidden_states = self.self_attn(hidden_states, mask, cos, sin)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        return residual + hidden_states


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, dtype, device, route_bias=None, index=0):
        super().__init__()
        if cfg.fused_projections:
            self.self_attn = Phi3Attention(cfg, dtype, device)
        else:
            use_rope = not cfg.no_rope_interval or (index + 1) % cfg.no_rope_interval != 0
            self.self_attn = LlamaAttention(cfg, dtype, device, use_rope=use_rope)
        if cfg.fused_projections:
            self.mlp = Phi3MLP(cfg, dtype, device)
        elif cfg.num_experts:
            self.block_sparse_moe = SparseMoeBlock(cfg, dtype, device, route_bias)
        else:
            self.mlp = LlamaMLP(cfg, cfg.inter, dtype, device)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, cfg.rms_unit_offset)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, cfg.rms_unit_offset)
        if cfg.sandwich_norms:  # Gemma2DecoderLayer
            self.pre_feedforward_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, cfg.rms_unit_offset)
            self.post_feedforward_layernorm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device,
                                                           cfg.rms_unit_offset)
        self.sandwich = cfg.sandwich_norms
        self.granite = cfg.granite

    def forward(self, hidden_states, mask, cos, sin):
        ffn = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        if self.sandwich:   # Gemma2DecoderLayer.forward
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states = self.self_attn(hidden_states, mask, cos, sin)
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.pre_feedforward_layernorm(hidden_states)
            hidden_states = ffn(hidden_states)
            hidden_states = self.post_feedforward_layernorm(hidden_states)
            return residual + hidden_states
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, mask, cos, sin)
        if self.granite:   # GraniteDecoderLayer: residual + hidden_states * residual_multiplier
            hidden_states = residual + hidden_states * 0.22
        else:
            hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = ffn(hidden_states)
        if self.granite:
            hidden_states = residual + hidden_states * 0.22
        else:
            hidden_states = residual + hidden_states
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self, cfg, dtype, device, route_bias=None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList([Olmo2DecoderLayer(cfg, dtype, device) if cfg.olmo2_layout
                                     else LlamaDecoderLayer(cfg, dtype, device, route_bias, index=i)
                                     for i in range(cfg.layers)])
        self.norm = LlamaRMSNorm(cfg.hidden, cfg.rms_eps, dtype, device, cfg.rms_unit_offset, olmo=cfg.olmo2_layout)
        self.rotary_emb = LlamaRotaryEmbedding(cfg, device)

    def forward(self, input_ids, attention_mask):
        cfg = self.cfg
        b, s = input_ids.shape
        inputs_embeds = self.embed_tokens(input_ids)
        if cfg.gemma3_layout:
            # Gemma3TextScaledWordEmbedding: the module scales its rows; the unscaled ones go.
            inputs_embeds = inputs_embeds * torch.tensor(cfg.hidden ** 0.5, dtype=inputs_embeds.dtype)
        if cfg.granite:
            # GraniteModel.forward: inputs_embeds = inputs_embeds * embedding_multiplier (a float).
            inputs_embeds = inputs_embeds * 12.0
        cache_position = torch.arange(s)
        position_ids = cache_position.unsqueeze(0)
        # Mistral's sliding_window (every layer slides: pattern 0) makes only the sliding mask.
        only_sliding = cfg.sliding_window and not cfg.sliding_pattern
        mask = decoder_eager_mask(b, s, inputs_embeds.dtype) if cfg.attention == "eager" and not only_sliding else None
        sliding_mask = None
        if cfg.sliding_window:
            if cfg.attention != "eager" and s >= cfg.sliding_window:
                raise ValueError("the reference's SDPA takes no mask: keep the sequence shorter than the window")
            if cfg.attention == "eager":
                sliding_mask = sliding_eager_mask(b, s, inputs_embeds.dtype, cfg.sliding_window)
        hidden_states = inputs_embeds
        sliding_cos = sliding_sin = None
        if cfg.gemma3_layout and cfg.sliding_window:
            # Gemma3TextModel: one table per layer type (the sliding layers' base differs; layer 0
            # slides, so its table is made first).
            sliding_cos, sliding_sin = self.rotary_emb(hidden_states, position_ids)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        if cfg.embedding_scale and not cfg.gemma3_layout:
            # GemmaModel: the embeddings times √hidden in their own dtype; inputs_embeds stays
            # referenced by the forward until it returns.
            normalizer = torch.tensor(cfg.hidden ** 0.5, dtype=hidden_states.dtype)
            hidden_states = hidden_states * normalizer
        else:
            del inputs_embeds
        for i, layer in enumerate(self.layers):
            sliding = sliding_layer(cfg, i)
            layer_mask = sliding_mask if sliding_mask is not None and sliding else mask
            layer_cos, layer_sin = (sliding_cos, sliding_sin) if sliding_cos is not None and sliding else (cos, sin)
            hidden_states = run_layer(cfg, i, layer, hidden_states, layer_mask, layer_cos, layer_sin)
        if cfg.embedding_scale and not cfg.gemma3_layout:
            del inputs_embeds
        hidden_states = self.norm(hidden_states)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg, dtype, device, route_bias=None):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg, dtype, device, route_bias)
        self.lm_head = output_head(cfg, self.model.embed_tokens, dtype, device)

    def forward(self, input_ids, attention_mask, labels):
        return decoder_head_and_loss(self.cfg, self.lm_head, [self.model(input_ids, attention_mask)], labels)


# ---------------------------------------------------------------------------------------------
# GPT-NeoX (GPTNeoXForCausalLM: Pythia), transformers models/gpt_neox/modeling_gpt_neox.py.

class GPTNeoXAttention(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.query_key_value = nn.Linear(h, 3 * h, bias=cfg.attention_bias, dtype=dtype, device=device)
        self.dense = nn.Linear(h, h, bias=cfg.attention_bias, dtype=dtype, device=device)

    def forward(self, hidden_states, mask, cos, sin):
        cfg = self.cfg
        b, s, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(b, s, -1, 3 * cfg.head_dim).transpose(1, 2)
        query_states, key_states, value_states = qkv.chunk(3, dim=-1)
        # apply_rotary_pos_emb: the rotary_pct share rotated, cat with the rest (as Phi-3's).
        query_states, key_states = phi3_apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cfg.use_cache and cfg.attention == "sdpa":
            # DynamicLayer.update's copies (as Phi3Attention's): SDPA saves them, not the views of qkv.
            key_states = torch.cat([key_states.new_empty(b, key_states.shape[1], 0, cfg.head_dim), key_states], dim=-2)
            value_states = torch.cat([value_states.new_empty(b, value_states.shape[1], 0, cfg.head_dim),
                                      value_states], dim=-2)
        attn_output = attention_core(cfg, query_states, key_states, value_states, mask, n_rep=1, causal=True)
        attn_output = attn_output.reshape(b, s, -1).contiguous()
        return self.dense(attn_output)   # qkv, a local, lives until this returns


class GPTNeoXMLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.act = cfg.act
        self.dense_h_to_4h = nn.Linear(cfg.hidden, cfg.inter, dtype=dtype, device=device)
        self.dense_4h_to_h = nn.Linear(cfg.inter, cfg.hidden, dtype=dtype, device=device)

    def forward(self, hidden_states):
        return self.dense_4h_to_h(activation(self.act, self.dense_h_to_4h(hidden_states)))


class GPTNeoXLayer(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.use_parallel_residual = cfg.parallel_residual
        self.input_layernorm = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.post_attention_layernorm = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.post_attention_dropout = Dropout(cfg.hidden_dropout)
        self.post_mlp_dropout = Dropout(cfg.hidden_dropout)
        self.attention = GPTNeoXAttention(cfg, dtype, device)
        self.mlp = GPTNeoXMLP(cfg, dtype, device)

    def forward(self, hidden_states, mask, cos, sin):
        attn_output = self.attention(self.input_layernorm(hidden_states), mask, cos, sin)
        attn_output = self.post_attention_dropout(attn_output)
        if self.use_parallel_residual:
            mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
            mlp_output = self.post_mlp_dropout(mlp_output)
            return mlp_output + attn_output + hidden_states
        attn_output = attn_output + hidden_states
        mlp_output = self.mlp(self.post_attention_layernorm(attn_output))
        mlp_output = self.post_mlp_dropout(mlp_output)
        return mlp_output + attn_output


class GPTNeoXModel(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        self.embed_in = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype, device=device)
        self.emb_dropout = Dropout(cfg.hidden_dropout)
        self.layers = nn.ModuleList([GPTNeoXLayer(cfg, dtype, device) for _ in range(cfg.layers)])
        self.final_layer_norm = LayerNorm(cfg.hidden, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.rotary_emb = LlamaRotaryEmbedding(cfg, device)

    def forward(self, input_ids, attention_mask):
        cfg = self.cfg
        b, s = input_ids.shape
        inputs_embeds = self.embed_in(input_ids)
        position_ids = torch.arange(s).unsqueeze(0)
        mask = decoder_eager_mask(b, s, inputs_embeds.dtype) if cfg.attention == "eager" else None
        hidden_states = self.emb_dropout(inputs_embeds)
        del inputs_embeds
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        for i, layer in enumerate(self.layers):
            hidden_states = run_layer(cfg, i, layer, hidden_states, mask, cos, sin)
        return self.final_layer_norm(hidden_states)


class GPTNeoXForCausalLM(nn.Module):
    def __init__(self, cfg, dtype, device, **unused):
        super().__init__()
        self.cfg = cfg
        self.gpt_neox = GPTNeoXModel(cfg, dtype, device)
        self.embed_out = output_head(cfg, self.gpt_neox.embed_in, dtype, device)

    def forward(self, input_ids, attention_mask, labels):
        return decoder_head_and_loss(self.cfg, self.embed_out, [self.gpt_neox(input_ids, attention_mask)], labels)


# ---------------------------------------------------------------------------------------------
# BERT (BertForSequenceClassification, BertForMaskedLM).

def _container(**modules):
    m = nn.Module()
    for name, module in modules.items():
        m.add_module(name, module)
    return m


class BertEmbeddings(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        h = cfg.hidden
        self.word_embeddings = nn.Embedding(cfg.vocab, h, dtype=dtype, device=device)
        self.position_embeddings = nn.Embedding(cfg.max_pos, h, dtype=dtype, device=device)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab, h, dtype=dtype, device=device)
        self.LayerNorm = LayerNorm(h, eps=cfg.ln_eps, dtype=dtype, device=device)
        self.dropout = Dropout(cfg.hidden_dropout)
        # HF's non-persistent int64 buffers (1, P), allocated with the model.
        self.register_buffer("position_ids", torch.arange(cfg.max_pos, device=device).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, cfg.max_pos), dtype=torch.long, device=device), persistent=False)

    def forward(self, input_ids, token_type_ids):
        s = input_ids.shape[1]
        position_ids = self.position_ids[:, :s]                     # a view of the buffer
        inputs_embeds = self.word_embeddings(input_ids)
        token_type_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + token_type_embeddings
        del inputs_embeds, token_type_embeddings
        position_embeddings = self.position_embeddings(position_ids)
        embeddings = embeddings + position_embeddings               # HF: `embeddings += ...` (in place)
        del position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        return embeddings


class BertSelfAttention(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.query = nn.Linear(h, h, dtype=dtype, device=device)
        self.key = nn.Linear(h, h, dtype=dtype, device=device)
        self.value = nn.Linear(h, h, dtype=dtype, device=device)

    def forward(self, hidden_states, mask):
        cfg = self.cfg
        b, s, _ = hidden_states.shape
        hidden_shape = (b, s, -1, cfg.head_dim)
        query_layer = self.query(hidden_states).view(hidden_shape).transpose(1, 2)
        key_layer = self.key(hidden_states).view(hidden_shape).transpose(1, 2)
        value_layer = self.value(hidden_states).view(hidden_shape).transpose(1, 2)
        attn_output = attention_core(cfg, query_layer, key_layer, value_layer, mask, n_rep=1, causal=False)
        return attn_output.reshape(b, s, -1).contiguous()


class BertLayer(nn.Module):
    def __init__(self, cfg, dtype, device):
        super().__init__()
        h, eps = cfg.hidden, cfg.ln_eps
        self.act = cfg.act
        self.attention = _container(
            self=BertSelfAttention(cfg, dtype, device),
            output=_container(dense=nn.Linear(h, h, dtype=dtype, device=device),
                              LayerNorm=LayerNorm(h, eps=eps, dtype=dtype, device=device),
                              dropout=Dropout(cfg.hidden_dropout)))
        self.intermediate = _container(dense=nn.Linear(h, cfg.inter, dtype=dtype, device=device))
        self.output = _container(dense=nn.Linear(cfg.inter, h, dtype=dtype, device=device),
                                 LayerNorm=LayerNorm(h, eps=eps, dtype=dtype, device=device),
                                 dropout=Dropout(cfg.hidden_dropout))

    def forward(self, hidden_states, mask):
        self_outputs = self.attention.self(hidden_states, mask)
        # BertSelfOutput
        x = self.attention.output.dense(self_outputs)
        x = self.attention.output.dropout(x)
        attention_output = self.attention.output.LayerNorm(x + hidden_states)
        del x, self_outputs
        # BertIntermediate
        intermediate_output = self.intermediate.dense(attention_output)
        intermediate_output = activation(self.act, intermediate_output)
        # BertOutput
        x = self.output.dense(intermediate_output)
        x = self.output.dropout(x)
        return self.output.LayerNorm(x + attention_output)


class BertModel(nn.Module):
    def __init__(self, cfg, dtype, device, pooler):
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg, dtype, device)
        self.encoder = _container(layer=nn.ModuleList([BertLayer(cfg, dtype, device) for _ in range(cfg.layers)]))
        if pooler:
            self.pooler = _container(dense=nn.Linear(cfg.hidden, cfg.hidden, dtype=dtype, device=device))

    def forward(self, input_ids, attention_mask, token_type_ids):
        cfg = self.cfg
        embedding_output = self.embeddings(input_ids, token_type_ids)
        if cfg.attention == "eager":
            # get_extended_attention_mask: (b,1,1,s) in the model's dtype
            dtype = embedding_output.dtype
            mask = attention_mask[:, None, None, :].to(dtype)
            mask = (1.0 - mask) * torch.finfo(dtype).min
        else:
            mask = None   # all-ones padding mask: _prepare_4d_attention_mask_for_sdpa returns None
        hidden_states = embedding_output
        del embedding_output
        for i, layer in enumerate(self.encoder.layer):
            hidden_states = run_layer(cfg, i, layer, hidden_states, mask)
        pooled_output = None
        if hasattr(self, "pooler"):
            first_token_tensor = hidden_states[:, 0]
            pooled_output = torch.tanh(self.pooler.dense(first_token_tensor))
        return hidden_states, pooled_output


class BertForSequenceClassification(nn.Module):
    def __init__(self, cfg, dtype, device, **unused):
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, dtype, device, pooler=True)
        self.dropout = Dropout(cfg.hidden_dropout)   # classifier_dropout=None -> hidden_dropout_prob
        self.classifier = nn.Linear(cfg.hidden, cfg.num_labels, dtype=dtype, device=device)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        _, pooled_output = self.bert(input_ids, attention_mask, token_type_ids)
        pooled_output = self.dropout(pooled_output)
        logits = self.classifier(pooled_output)
        if self.cfg.num_labels == 1:   # problem_type "regression"
            loss = F.mse_loss(logits.squeeze(), labels.squeeze())
        else:                          # "single_label_classification"
            loss = F.cross_entropy(logits.view(-1, self.cfg.num_labels), labels.view(-1))
        return loss, logits


class BertForMaskedLM(nn.Module):
    def __init__(self, cfg, dtype, device, **unused):
        super().__init__()
        self.cfg = cfg
        h, V = cfg.hidden, cfg.vocab
        self.bert = BertModel(cfg, dtype, device, pooler=False)
        decoder = nn.Linear(h, V, bias=False, dtype=dtype, device="meta" if cfg.tie else device)
        predictions = _container(
            transform=_container(dense=nn.Linear(h, h, dtype=dtype, device=device),
                                 LayerNorm=LayerNorm(h, eps=cfg.ln_eps, dtype=dtype, device=device)),
            decoder=decoder)
        predictions.bias = nn.Parameter(torch.zeros(V, dtype=dtype, device=device))
        decoder.bias = predictions.bias
        if cfg.tie:
            decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.cls = _container(predictions=predictions)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        sequence_output, _ = self.bert(input_ids, attention_mask, token_type_ids)
        p = self.cls.predictions
        hidden_states = p.transform.dense(sequence_output)
        hidden_states = activation(self.cfg.act, hidden_states)
        hidden_states = p.transform.LayerNorm(hidden_states)
        prediction_scores = p.decoder(hidden_states)
        loss = F.cross_entropy(prediction_scores.view(-1, self.cfg.vocab), labels.view(-1))
        return loss, prediction_scores


# ---------------------------------------------------------------------------------------------
# Building, counting, batches.

def model_class(cfg):
    if cfg.family == "gpt2":
        return GPT2LMHeadModel
    if cfg.family == "gptNeox":
        return GPTNeoXForCausalLM
    if cfg.family == "llama":
        return LlamaForCausalLM
    if cfg.head == "maskedLm":
        return BertForMaskedLM
    if cfg.head == "classification":
        return BertForSequenceClassification
    raise ValueError(f"unknown encoderHead {cfg.head!r}")


def build_model(setup, dtype=torch.float32, device="cpu", route_bias=None):
    """The model of the setup, parameters created directly in `dtype` on `device`, train mode."""
    cfg = setup if isinstance(setup, SimpleNamespace) else read_config(setup)
    return model_class(cfg)(cfg, dtype, device, route_bias=route_bias).train()


def parameter_count(setup):
    """Sum of numel over the built model's parameters, tied ones counted once (built on meta)."""
    model = build_model(setup, torch.float32, device="meta")
    return sum(p.numel() for p in model.parameters())


def make_route_bias(cfg, b, s):
    """{dtype: (b*s, E)} logit offsets sending token t to experts (t*k + j) mod E, j < k."""
    T, E, k = b * s, cfg.num_experts, cfg.top_k
    preferred = (torch.arange(T)[:, None] * k + torch.arange(k)[None, :]) % E
    bias = torch.zeros(T, E).scatter_(1, preferred, 30.0)
    return {dt: bias.to(dt) for dt in (torch.float32, torch.bfloat16)}


def make_batch(cfg, b, s):
    """A collated batch as the Trainer hands it to the model: int64 tensors."""
    batch = {"input_ids": torch.randint(0, cfg.vocab, (b, s)),
             "attention_mask": torch.ones((b, s), dtype=torch.long)}
    if cfg.family == "bert":
        batch["token_type_ids"] = torch.zeros((b, s), dtype=torch.long)
        if cfg.head == "classification":
            batch["labels"] = torch.randint(0, cfg.num_labels, (b,)) if cfg.num_labels > 1 else torch.randn(b)
            return batch
    batch["labels"] = torch.randint(0, cfg.vocab, (b, s))
    return batch


def compute_loss(model, batch):
    """Trainer.compute_loss: the model returns (loss, logits); only the loss comes back."""
    outputs = model(**batch)
    return outputs[0]


def _storage(tensor):
    st = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    return st.data_ptr(), st.nbytes()


# ---------------------------------------------------------------------------------------------
# The measurement.

PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
                # CPU torch 1.13 has no fp16 matmul: the fp16 regimes run in bf16 (same sizes).
                "bf16Mixed": torch.bfloat16, "fp16Mixed": torch.bfloat16,
                "ampBf16": torch.float32, "ampFp16": torch.float32}


def fast_allocation_events(fn):
    """validate.allocation_events without torch.profiler's Python post-processing of every op
    event, which it discards anyway: the same kineto session with the same configuration (CPU,
    profile_memory, no shapes or stacks), whose result is read the same way. The emulated fused
    attention makes ~10^5 small ops per step, where that post-processing takes minutes; the
    self-test checks that both trackers give identical figures."""
    prof = torch.autograd.profiler.profile(use_kineto=True, use_cpu=True, profile_memory=True)
    prof._prepare_trace()
    prof._start_trace()
    try:
        fn()
    finally:
        results = torch.autograd._disable_profiler()
    memory, ranges = [], []
    for ev in results.events():
        if ev.name() == "[memory]":
            memory.append((ev.start_us(), ev.nbytes()))
        elif ev.name().startswith("gpumem:"):
            ranges.append((ev.name()[len("gpumem:"):], ev.start_us(), ev.start_us() + ev.duration_us()))
    return memory, ranges


def measure_transformer(setup, tracker=fast_allocation_events):
    """Init and two training steps of the setup's transformer; returns measured figures with
    validate.measure's keys: parameters, masterWeights, gradients, optimizerStates (bytes, from
    the live objects), saved (distinct storages saved for backward in step 1's forward, less the
    batch, parameters and buffers), peak and phasePeaks. `tracker` is fast_allocation_events or
    validate.allocation_events (same figures, slower)."""
    cfg = read_config(setup)
    t = setup["training"]
    precision, b, s = t["precision"], t["batchSize"], t["sequenceLength"]
    if precision not in PARAM_DTYPES:
        raise ValueError(f"unknown precision {precision!r}")
    dtype = PARAM_DTYPES[precision]
    mixed = precision.endswith("Mixed")
    amp = precision.startswith("amp")
    loss_scale = AMP_FP16_SCALE if precision == "ampFp16" else None
    impl = t.get("optimizerImplementation", "forEach")
    in_backward = t.get("optimizerInBackward", False)
    if in_backward and (mixed or loss_scale):
        raise ValueError("optimizerInBackward is validated without master weights or loss scaling")
    accumulation = setup.get("parallel", {}).get("gradientAccumulationSteps", 1)
    torch.manual_seed(0)
    # Validation machinery, built before the tracker starts so it is not measured.
    route_bias = make_route_bias(cfg, b, s) if cfg.num_experts else None
    state = {}

    leaves = []  # enable_input_require_grads' leaves (storage pointer, bytes), step by step

    def run():
        with record_function("gpumem:init"):
            model = build_model(cfg, dtype, route_bias=route_bias)
            # Fine-tuning (finetune_reference.py): frozen parameters, LoRA / DoRA wrappers; the
            # optimizer and the masters see only what trains.
            if finetune_reference.apply(model, setup, dtype, Dropout):
                # Held after forward counts the hook's leaf too: the graph holds it (and later
                # its .grad) while the loss lives, though no node saves it.
                finetune_reference.hook_input_grads(model, cfg.family, on_leaf=lambda out: leaves.append(_storage(out)))
            emulate_cuda_bias_sums(model)  # CUDA's bias-gradient sums take scratch (validate.py)
            all_params = list(model.parameters())
            params = [p for p in all_params if p.requires_grad]
            if mixed:
                masters = [p.detach().float() for p in params]
                groups = [masters] if impl == "forEach" else [[m] for m in masters]
                optimizers = [make_optimizer(t["optimizer"], impl, g) for g in groups]
            elif in_backward:
                optimizers, hooks = validate.optimizer_in_backward(t["optimizer"], impl, params)
            else:
                optimizers = [make_optimizer(t["optimizer"], impl, params)]
        model_ptrs = {_storage(p)[0] for p in all_params} | {_storage(x)[0] for x in model.buffers()}
        saved = {}
        for step in (1, 2):
            # Gradient accumulation: m forward / backward passes per optimizer step, each
            # adding into the .grads the first one made (AccumulateGrad). A micro-batch before
            # the last lets go of its batch and loss once its backward is done (a training loop
            # fetches the next batch into the same names; HF's Trainer returns from
            # training_step), the last keeps them through the step as below.
            for micro in range(accumulation):
                with record_function(f"gpumem:forward:{step}"):
                    batch = make_batch(cfg, b, s)
                    excluded = model_ptrs | {_storage(x)[0] for x in batch.values()}
                    saved.clear()
                    leaves.clear()

                    def pack(tensor):
                        ptr, nbytes = _storage(tensor)
                        if ptr not in excluded:
                            saved[ptr] = nbytes
                        return tensor

                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                        with torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
                            loss = compute_loss(model, batch)
                if step == 1:
                    for ptr, nbytes in leaves:  # (pointer, bytes) only: a reference would keep it
                        saved.setdefault(ptr, nbytes)
                    state["saved"] = sum(saved.values())
                with record_function(f"gpumem:backward:{step}"):
                    if loss_scale:
                        (loss * loss_scale).backward()   # GradScaler.scale(loss).backward()
                    else:
                        loss.backward()
                    if micro < accumulation - 1:
                        del loss, batch
            if step == 1:
                state["gradients"] = sum(p.grad.numel() * p.grad.element_size() for p in params
                                         if p.grad is not None)
            with record_function(f"gpumem:optimizerStep:{step}"):
                if loss_scale:
                    # GradScaler.unscale_, by hand: CPU torch 1.13 has no
                    # _amp_foreach_non_finite_check_and_unscale_. The in-place unscale is the
                    # same; the inf/nan check (one found_inf scalar on CUDA) is skipped, since
                    # every CPU way to do it allocates grad-sized temporaries.
                    torch._foreach_mul_([p.grad for p in params], 1.0 / loss_scale)
                if not in_backward:
                    validate.optimizer_step(model, params, masters if mixed else None, optimizers,
                                            set_to_none=t.get("zeroGradSetToNone", True))
                del loss, batch
        state.update(validate.model_state_bytes(params, masters if mixed else None, optimizers))
        state["parameters"] = sum(p.numel() * p.element_size() for p in all_params)
        state["keep"] = (model, optimizers, hooks if in_backward else None)  # nothing is freed inside the profile

    memory, ranges = tracker(run)
    del state["keep"]
    state["peak"], state["phasePeaks"] = summarise(memory, ranges)
    return {k: state[k] for k in ("parameters", "masterWeights", "gradients", "optimizerStates",
                                  "saved", "peak", "phasePeaks")}


# ---------------------------------------------------------------------------------------------
# Self-test.

def transformer_setup(arch, batch=2, seq=64, precision="fp32", optimizer="adamw", impl="forEach",
                      attention="eager", checkpointing="none", interval=2):
    return {"model": {"kind": "transformer", "architecture": arch},
            "training": {"batchSize": batch, "sequenceLength": seq, "precision": precision,
                         "optimizer": optimizer, "optimizerImplementation": impl,
                         "attention": attention, "checkpointing": checkpointing,
                         "checkpointInterval": interval},
            "gpu": {"memoryGiB": 80}}


def formula_count(setup):
    """Parameter count by hand, family by family, for the self-test."""
    c = read_config(setup)
    V, h, L, I = c.vocab, c.hidden, c.layers, c.inter
    if c.family == "gpt2":
        layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * I + I) + (I * h + h)
        return V * h + c.max_pos * h + L * layer + 2 * h + (0 if c.tie else V * h)
    if c.family == "llama":
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        attn = (h * q + 2 * h * kv + q * h + ((q + 2 * kv) if c.attention_bias else 0)
                + (2 * c.head_dim if c.qk_norm else 0))
        if c.num_experts:
            ffn = c.num_experts * h + c.num_experts * 3 * h * c.expert_inter
            if c.shared_inter:
                ffn += 3 * h * c.shared_inter + (h if c.shared_gate else 0)
        else:
            ffn = 3 * h * I
        norms = (4 if c.sandwich_norms else 2) * h
        return V * h + L * (norms + attn + ffn) + h + (0 if c.tie else V * h)
    if c.family == "gptNeox":
        bias = c.attention_bias
        layer = 2 * 2 * h + (h * 3 * h + (3 * h if bias else 0)) + (h * h + (h if bias else 0)) + (h * I + I) + (I * h + h)
        return V * h + L * layer + 2 * h + (0 if c.tie else V * h)
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * I + I) + (I * h + h)
    base = V * h + c.max_pos * h + c.type_vocab * h + 2 * h + L * layer
    if c.head == "classification":
        return base + (h * h + h) + (h * c.num_labels + c.num_labels)
    return base + (h * h + h) + 2 * h + V + (0 if c.tie else V * h)


REAL_COUNTS = [
    ("gpt2 (124M)", {"family": "gpt2", "vocabSize": 50257, "hiddenSize": 768, "numLayers": 12,
                     "numHeads": 12, "maxPositionEmbeddings": 1024}, 124_439_808),
    ("bert-base-uncased MLM", {"family": "bert", "vocabSize": 30522, "hiddenSize": 768, "numLayers": 12,
                               "numHeads": 12, "maxPositionEmbeddings": 512, "encoderHead": "maskedLm"},
     109_514_298),
    ("bert-base-uncased 2-label", {"family": "bert", "vocabSize": 30522, "hiddenSize": 768, "numLayers": 12,
                                   "numHeads": 12, "maxPositionEmbeddings": 512,
                                   "encoderHead": "classification", "numLabels": 2}, 109_483_778),
    ("TinyLlama-1.1B", {"family": "llama", "vocabSize": 32000, "hiddenSize": 2048, "numLayers": 22,
                        "numHeads": 32, "numKeyValueHeads": 4, "intermediateSize": 5632}, 1_100_048_384),
    ("Qwen2-0.5B", {"family": "llama", "vocabSize": 151936, "hiddenSize": 896, "numLayers": 24,
                    "numHeads": 14, "numKeyValueHeads": 2, "intermediateSize": 4864,
                    "attentionBias": True, "tieWordEmbeddings": True}, 494_032_768),
    ("Mistral-7B", {"family": "llama", "vocabSize": 32000, "hiddenSize": 4096, "numLayers": 32,
                    "numHeads": 32, "numKeyValueHeads": 8, "intermediateSize": 14336}, 7_241_732_096),
    ("Mixtral-8x7B", {"family": "llama", "vocabSize": 32000, "hiddenSize": 4096, "numLayers": 32,
                      "numHeads": 32, "numKeyValueHeads": 8, "intermediateSize": 14336,
                      "numExperts": 8, "expertsPerToken": 2}, 46_702_792_704),
]

TINY = {
    "gpt2": {"family": "gpt2", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
             "maxPositionEmbeddings": 256},
    "llama": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
              "intermediateSize": 352},
    "qwen2-gqa": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                  "numKeyValueHeads": 2, "intermediateSize": 352, "attentionBias": True,
                  "tieWordEmbeddings": True},
    "qwen3": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
              "numKeyValueHeads": 2, "headDim": 48, "intermediateSize": 352, "queryKeyNorm": True,
              "tieWordEmbeddings": True},
    "gemma": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
              "numKeyValueHeads": 1, "headDim": 64, "intermediateSize": 512, "hiddenAct": "geluTanh",
              "rmsNormUnitOffset": True, "embeddingScale": True, "tieWordEmbeddings": True},
    "gemma2": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
               "numKeyValueHeads": 2, "headDim": 64, "intermediateSize": 512, "hiddenAct": "geluTanh",
               "rmsNormUnitOffset": True, "embeddingScale": True, "tieWordEmbeddings": True,
               "sandwichNorms": True, "attentionLogitSoftcap": 50.0, "finalLogitSoftcap": 30.0,
               "slidingWindow": 32, "slidingWindowPattern": 2},
    "gpt-neox": {"family": "gptNeox", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                 "intermediateSize": 512, "partialRotaryFactor": 0.25, "attentionBias": True,
                 "parallelResidual": True, "hiddenAct": "gelu", "tieWordEmbeddings": False},
    "phi3": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
             "numKeyValueHeads": 4, "intermediateSize": 352, "fusedProjections": True},
    "mixtral": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                "numKeyValueHeads": 2, "intermediateSize": 256, "numExperts": 4, "expertsPerToken": 2},
    "qwen2-moe": {"family": "llama", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                  "intermediateSize": 256, "numExperts": 4, "expertsPerToken": 2,
                  "expertIntermediateSize": 64, "sharedExpertIntermediateSize": 256,
                  "sharedExpertGate": True, "attentionBias": True},
    "bert-cls": {"family": "bert", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                 "maxPositionEmbeddings": 256, "encoderHead": "classification", "numLabels": 3,
                 "hiddenDropout": 0.1, "attentionDropout": 0.1},
    "bert-mlm": {"family": "bert", "vocabSize": 1000, "hiddenSize": 128, "numLayers": 2, "numHeads": 4,
                 "maxPositionEmbeddings": 256, "encoderHead": "maskedLm"},
}


def check_fused_attention():
    """The emulated kernel against eager attention (values and gradients), and gradcheck of its
    backward with dropout (the keep-masks must be regenerated identically)."""
    torch.manual_seed(1)
    for causal, n_rep in ((True, 1), (True, 2), (False, 1)):
        b, h, s, d = 2, 4, 150, 16
        q = torch.randn(b, h, s, d, requires_grad=True)
        k = torch.randn(b, h // n_rep, s, d, requires_grad=True)
        v = torch.randn(b, h // n_rep, s, d, requires_grad=True)
        mask = decoder_eager_mask(b, s, torch.float32) if causal else None
        ref = eager_attention(q, k, v, mask, n_rep=n_rep, scaling=d ** -0.5, dropout_p=0.0)
        out = sdpa_attention(q, k, v, None, n_rep=n_rep, scaling=d ** -0.5, dropout_p=0.0, causal=causal)
        g = torch.randn_like(ref)
        grads_ref = torch.autograd.grad(ref, (q, k, v), g)
        grads = torch.autograd.grad(out, (q, k, v), g)
        assert torch.allclose(ref, out, atol=1e-5), (causal, n_rep, (ref - out).abs().max())
        for a, c in zip(grads_ref, grads):
            assert torch.allclose(a, c, atol=1e-4), (causal, n_rep, (a - c).abs().max())
        # The grouped kernel (enable_gqa: k, v not repeated, dk, dv summed over each group).
        grouped = FusedAttentionEmulation.apply(q, k, v, causal, d ** -0.5, 0.0, 0, n_rep)
        grads = torch.autograd.grad(grouped.transpose(1, 2).contiguous(), (q, k, v), g)
        assert torch.allclose(ref, grouped.transpose(1, 2), atol=1e-5), (causal, n_rep)
        for a, c in zip(grads_ref, grads):
            assert torch.allclose(a, c, atol=1e-4), (causal, n_rep, "grouped", (a - c).abs().max())
    q, k, v = (torch.randn(1, 2, 70, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(
        lambda q, k, v: FusedAttentionEmulation.apply(q, k, v, True, 0.5, 0.3, 1234), (q, k, v))
    q = torch.randn(1, 4, 40, 3, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 40, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: FusedAttentionEmulation.apply(q, k, v, True, 0.5, 0.3, 1234, 2), (q, k, v))
    print("fused-attention emulation: matches eager (values, grads; causal, GQA, bidirectional); "
          "gradcheck with dropout passes")


def selftest():
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} thread(s)\n")
    print("parameter counts (built on meta) against published figures:")
    for name, arch, expected in REAL_COUNTS:
        setup = transformer_setup(arch)
        n, f = parameter_count(setup), formula_count(setup)
        assert n == expected == f, (name, n, f, expected)
        print(f"  {name:28} {n:>15,}  ok")
    print("tiny models, built count = formula:")
    for name, arch in TINY.items():
        setup = transformer_setup(arch)
        n, f = parameter_count(setup), formula_count(setup)
        assert n == f, (name, n, f)
        print(f"  {name:28} {n:>15,}  ok")
    print()
    check_fused_attention()

    print("\ntrackers: fast_allocation_events and validate.allocation_events agree:")
    for name, kw in (("qwen2-gqa", {"precision": "ampBf16", "attention": "sdpa", "checkpointing": "everyKthBlock"}),
                     ("bert-cls", {"precision": "bf16Mixed", "impl": "perParameter"})):
        setup = transformer_setup(TINY[name], **kw)
        fast, slow = measure_transformer(setup), measure_transformer(setup, tracker=allocation_events)
        assert fast == slow, (name, fast, slow)
        print(f"  {name} {kw}: identical (peak {fast['peak']:,})")

    print("\none measure per family:")
    cases = [
        ("gpt2 fp32 eager adamw", TINY["gpt2"], {}),
        ("llama bf16Mixed eager adamw", TINY["llama"], {"precision": "bf16Mixed"}),
        ("qwen2-gqa ampBf16 sdpa", TINY["qwen2-gqa"], {"precision": "ampBf16", "attention": "sdpa"}),
        ("mixtral bf16 everyBlock", TINY["mixtral"], {"precision": "bf16", "checkpointing": "everyBlock"}),
        ("qwen2-moe fp32 selective", TINY["qwen2-moe"], {"checkpointing": "selective"}),
        ("bert-cls fp32 eager dropout", TINY["bert-cls"], {"optimizer": "adam"}),
        ("bert-mlm ampFp16 sdpa everyKth", TINY["bert-mlm"], {"precision": "ampFp16", "attention": "sdpa",
                                                              "checkpointing": "everyKthBlock"}),
    ]
    for name, arch, kw in cases:
        t0 = time.time()
        m = measure_transformer(transformer_setup(arch, **kw))
        print(f"  {name} ({time.time() - t0:.1f} s)\n    {json.dumps(m)}")
        assert m["saved"] > 0 and m["peak"] >= max(m["phasePeaks"].values())

    print("\nevery knob once (3-layer Qwen2-style GQA llama, b=2, s=64; then gpt2 x optimizers):")
    small_gqa = dict(TINY["qwen2-gqa"], numLayers=3)
    for precision in PARAM_DTYPES:
        for attention in ("eager", "sdpa"):
            for ckpt in ("none", "everyBlock", "everyKthBlock", "selective"):
                t0 = time.time()
                m = measure_transformer(transformer_setup(small_gqa, precision=precision, attention=attention,
                                                          checkpointing=ckpt))
                print(f"  {precision:9} {attention:5} {ckpt:13} saved {m['saved']:>10,} peak {m['peak']:>11,}"
                      f"  ({time.time() - t0:.1f} s)")
    for opt in ("sgd", "sgdMomentum", "adam", "adamw"):
        for impl in ("forEach", "perParameter"):
            m = measure_transformer(transformer_setup(TINY["gpt2"], optimizer=opt, impl=impl))
            print(f"  gpt2 {opt:11} {impl:12} optimizerStates {m['optimizerStates']:>10,} peak {m['peak']:>11,}")
    print("\nselftest passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument("setup", nargs="?", help="a setup JSON file ('-' for stdin): print its measured figures")
    args = parser.parse_args()
    if args.selftest:
        selftest()
    elif args.setup:
        with (sys.stdin if args.setup == "-" else open(args.setup)) as f:
            setup = json.load(f)
        print(json.dumps({"parameterCount": parameter_count(setup), **measure_transformer(setup)}, indent=2))
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
