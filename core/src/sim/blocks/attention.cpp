// Attention: heads, rotary embeddings, the core (eager with its materialised scores, or the
// fused SDPA kernel), selective recomputation, and the output projection.
#include "sim/blocks/blocks.hpp"
#include "parallel/context_split.hpp"
#include "parallel/sequence_split.hpp"

namespace gpumem::blocks {

// Megatron's GPT: the GPT-2 family with tensor (and so sequence) or context parallelism,
// Megatron's loss or its masked-softmax fusion, which the Megatron import sets.
// Sequence parallelism needs t > 1, so it is covered by the tensor-parallel size.
bool MegatronGpt(const ArchitectureDef& a, const TrainingDef& t, std::int64_t tensorParallel,
                 std::int64_t contextParallel) {
  return a.family == Family::GPT2 &&
         (tensorParallel > 1 || contextParallel > 1 || t.maskedSoftmaxFusion ||
          t.lossImplementation == LossImplementation::MegatronVocabParallel);
}
bool MegatronGpt(const Model& m) { return MegatronGpt(m.a, m.training, m.vocabShards, m.contextShards); }

namespace {

// Hugging Face's eager scores → probabilities: scaled, the mask added, softmax (saved), cast back
// to the value's dtype. Llama's eager_attention_forward asks softmax for fp32
// (softmax(..., dtype=torch.float32).to(query.dtype)); GPT-2's (transformers 5.x
// modeling_gpt2.py eager_attention_forward) calls softmax in the scores' own dtype, then
// .type(value.dtype), a no-op: in 16-bit weights without autocast its probabilities stay 16-bit.
// Measured on an H100 (tests/data/cuda/stacks, GPT-2 bf16: the softmax output is the bf16
// scores' size). Under autocast softmax runs in fp32 either way (autocast's fp32 op list).
// Gemma 2's attn_logit_softcapping (softcap > 0; modeling_gemma2.py eager_attention_forward)
// comes between the scaling and the mask: scores / cap, tanh (which saves its output), × cap,
// each a new [b, heads, s, s] tensor in the scores' dtype (tanh is on no autocast list).
// Releases `raw`.
ValueId EagerSoftmax(Tape& t, ValueId raw, ValueId mask, DType type, bool softmaxInFp32, double softcap) {
  ValueId scaled = ops::Scale(t, raw, "scores × 1/√d");
  t.Drop(raw);
  if (softcap > 0.0) {
    const ValueId divided = ops::Scale(t, scaled, "scores / softcap");
    t.Drop(scaled);
    const ValueId capped = ops::SavesOutput(t, divided, "tanh(scores / softcap)", t.TypeOf(divided));
    t.Drop(divided);
    scaled = ops::Scale(t, capped, "scores × softcap");
    t.Drop(capped);
  }
  if (mask != kNoValue) {
    const ValueId masked = ops::AddConstant(t, scaled, mask, "scores + mask");
    t.Drop(scaled);
    scaled = masked;
  }
  if (!softmaxInFp32 && !t.autocast()) {
    const ValueId probs = ops::Softmax(t, scaled, "softmax", t.TypeOf(scaled));
    t.Drop(scaled);
    return probs;
  }
  const ValueId probs32 = ops::Softmax(t, scaled, "softmax (fp32)", DType::FP32);
  // Llama's one statement `attn_weights = softmax(attn_weights, dtype=torch.float32).to(dtype)`
  // rebinds the scores only once the cast has returned: they are held through it, and let go
  // after the fp32 temporary (measured on CPU torch, bert-cls-ckpt-ampbf16: the checkpointed
  // forward's peak is that cast, with the fp32 scores, their softmax and the 16-bit copy
  // alive). GPT-2's cast is a statement of its own, after the scores were rebound.
  if (!softmaxInFp32) t.Drop(scaled);
  const ValueId probs = ops::To(t, probs32, type);
  t.Drop(probs32);
  if (softmaxInFp32) t.Drop(scaled);
  return probs;
}

// Whether the eager softmax is asked for fp32: everywhere but Hugging Face's GPT-2. Megatron's
// GPT keeps the fp32 softmax the simulation has always given it.
bool SoftmaxInFp32(const Model& m) { return m.a.family != Family::GPT2 || MegatronGpt(m); }

// Megatron's FusedScaleMaskSoftmax on its fused path (megatron/core/fusions/fused_softmax.py
// forward_fused_softmax, causal: ScaledUpperTriangMaskedSoftmax.apply): scale, causal mask and
// softmax in one kernel on the 16-bit scores, whose 16-bit output is the only tensor made and
// the only one saved (ctx.save_for_backward(softmax_results, scale_t)); the mask is generated in
// the kernel, not read. Not modelled: apex's backward (scaled_upper_triang_masked_softmax_cuda
// bwd) writes the input gradient into the incoming one in place, where the tape makes a new one.
// Releases `raw`.
ValueId FusedScaleMaskSoftmax(Tape& t, ValueId raw) {
  const ValueId probs = t.Apply({.name = "scaled_upper_triang_masked_softmax (fused)", .inputs = {{raw}},
                                 .shape = t.ShapeOf(raw), .type = t.TypeOf(raw), .savesOutput = true});
  t.Drop(raw);
  return probs;
}

// q: [b, heads, s, d]; k, v: [b, kvHeads, s, d]. Returns [b, s, heads, d] (contiguous).
ValueId AttentionCore(Model& m, ValueId q, ValueId k, ValueId v, ValueId mask) {
  // Context parallelism: Transformer Engine's ring attention on the rank's s/c tokens.
  if (m.contextShards > 1) return context_split::RingAttention(m, q, k, v);
  Tape& t = m.t;
  const std::int64_t b = m.b, s = m.s, heads = m.a.numHeads, d = HeadDim(m.a), kv = KeyValueHeads(m.a);
  const Shape full = {b, heads, s, d};
  // repeat_kv: expand + reshape copies k and v to every query head (GQA); Megatron's unfused
  // DotProductAttention does the same with key.repeat_interleave(np / ng, dim=2)
  // (megatron/core/transformer/dot_product_attention.py). The GPT-2 family's grouped-query
  // attention is Megatron's GPT, whose fused attention (SDPA here) is Transformer Engine's
  // DotProductAttention, given num_gqa_groups (megatron/core/extensions/transformer_engine.py
  // TEDotProductAttention) and reading the g key/value heads as they are: no copies.
  //
  // Hugging Face's SDPA path does not repeat either where it can help it: sdpa_attention_forward
  // (transformers integrations/sdpa_attention.py) passes enable_gqa=True instead of calling
  // repeat_kv when use_gqa_in_sdpa holds, i.e. PyTorch >= 2.5 and no attention mask (decoders
  // without padding: the causal mask is dropped for is_causal). FlashAttention, the kernel for
  // 16-bit q, k, v, then reads the kv heads as they are and saves them so (measured on an H100,
  // torch 2.11, transformers 5.17: the stack-labelled snapshots in tests/data/cuda/stacks/ hold no
  // repeat_kv allocation, and Llama 3.2 1B / Qwen2.5 1.5B under SDPA read +2.3 % / +1.3 %
  // allocated with the copies). In fp32 flash does not run; which kernel takes grouped heads
  // there has changed between PyTorch versions (memory-efficient, else math), so fp32 keeps
  // repeat_kv's copies.
  const bool sdpa = m.training.attention == AttentionImplementation::SDPA;
  const bool sixteenBit = t.autocast() || t.TypeOf(q) != DType::FP32;
  const bool hfGroupedHeads = kv != heads && sdpa && m.a.family != Family::GPT2 && mask == kNoValue &&
                              t.sdpaEnableGqa() && sixteenBit;
  const bool native = (kv != heads && sdpa && m.a.family == Family::GPT2) || hfGroupedHeads;
  const ValueId keys = kv == heads || native ? t.Keep(k) : ops::Copy(t, k, full, "repeat_kv(key)", In::Compute);
  const ValueId vals = kv == heads || native ? t.Keep(v) : ops::Copy(t, v, full, "repeat_kv(value)", In::Compute);
  ValueId out = kNoValue;
  if (m.training.attention == AttentionImplementation::SDPA && mask != kNoValue) {
    // An explicit mask (packed sequences' block-causal one): scaled_dot_product_attention
    // (aten/src/ATen/native/transformers/attention.cpp) cannot pick flash, which takes no mask
    // (sdp_utils check_for_attn_mask), and runs the memory-efficient kernel on
    // convert_boolean_attn_mask(mask, query dtype): zeros_like in q's dtype, then
    // masked_fill_(mask.logical_not(), -inf) (a transient bool). preprocess_mask pads the last
    // dim to a multiple of 8 when the strides are not aligned (pad_bias: a new, wider tensor) and
    // expands to [b, heads, s, s] (a view). _scaled_dot_product_efficient_attention saves that
    // bias with q, k, v, the output and a logsumexp of ceil(s / 32)·32 per row (kAlignLSE).
    const ValueId q16 = t.ForMatmul(q);
    const ValueId k16 = t.ForMatmul(keys);
    const ValueId v16 = t.ForMatmul(vals);
    const DType qt = t.TypeOf(q16);
    ValueId bias = t.Fresh({b, 1, s, s}, qt, "attn_mask as float (convert_boolean_attn_mask)");
    t.Drop(t.Fresh({b, 1, s, s}, DType::Bool, "attn_mask.logical_not()"));
    if (s % 8 != 0) {
      const ValueId padded = t.Fresh({b, 1, s, s + 8 - s % 8}, qt, "attn_mask padded to 8 (pad_bias)");
      t.Drop(bias);
      bias = padded;
    }
    const std::int64_t lse = (s + 31) / 32 * 32;
    out = t.Apply({.name = "scaled_dot_product_attention (memory-efficient, mask)",
                   .inputs = {{q16}, {k16}, {v16}, {bias, In::NoGrad}},
                   .shape = {b, s, heads, d},
                   .type = qt,
                   .saves = {q16, k16, v16, bias},
                   .savesOutput = true,
                   .saveNew = {{{b, heads, lse}, DType::FP32, "logsumexp"}},
                   .backwardTemps = {{full, DType::FP32, "dq accumulator (fp32)"},
                                     {{b, heads, s}, DType::FP32, "delta = rowsum(dO·O)"}},
                   .sac = Tape::OpSpec::Sac::Attention});
    for (ValueId x : {bias, q16, k16, v16, keys, vals}) t.Drop(x);
    return out;
  }
  if (m.training.attention == AttentionImplementation::SDPA) {
    const ValueId q16 = t.ForMatmul(q);
    const ValueId k16 = t.ForMatmul(keys);
    const ValueId v16 = t.ForMatmul(vals);
    // The kernels write their output in [b, s, heads, d] memory order and return it
    // transposed, so HF's .transpose(1, 2).contiguous() afterwards copies nothing. Flash keeps
    // q, k, v, its output and an fp32 log-sum-exp; its backward holds FA2's fp32 dq
    // accumulator and the row sums of dO·O. With grouped kv heads taken as they are, its
    // backward writes dk and dv per query head and sums them over each group after the kernel
    // (PyTorch's flash_attn/flash_api.cpp mha_bwd: dk_expanded, dv_expanded [b, s, heads, d] in
    // q's dtype, then at::sum_out into dk, dv).
    Tape::OpSpec spec{.name = "scaled_dot_product_attention",
                      .inputs = {{q16}, {k16}, {v16}},
                      .shape = {b, s, heads, d},
                      .type = t.TypeOf(q16),
                      .saves = {q16, k16, v16},
                      .savesOutput = true,
                      .saveNew = {{{b, heads, s}, DType::FP32, "logsumexp"}},
                      .backwardTemps = {{full, DType::FP32, "dq accumulator (fp32)"},
                                        {{b, heads, s}, DType::FP32, "softmax_d = rowsum(dO·O)"}},
                      .sac = Tape::OpSpec::Sac::Attention};
    if (hfGroupedHeads) {
      spec.backwardTemps.push_back({full, t.TypeOf(q16), "dk per query head (dk_expanded)"});
      spec.backwardTemps.push_back({full, t.TypeOf(q16), "dv per query head (dv_expanded)"});
    }
    out = t.Apply(spec);
    t.Drop(q16);
    t.Drop(k16);
    t.Drop(v16);
    t.Drop(keys);
    t.Drop(vals);
    return out;
  }
  const Shape scores = {b, heads, s, s};
  const ValueId kT = ops::View(t, keys, {b, heads, d, s}, "keyᵀ");
  const ValueId raw = ops::MatMul(t, q, kT, scores, "q·kᵀ");
  t.Drop(kT);
  const ValueId probs = m.training.maskedSoftmaxFusion && MaskedSoftmaxKernelAvailable(b, heads, s, s, t.TypeOf(raw))
                            ? FusedScaleMaskSoftmax(t, raw)
                            : EagerSoftmax(t, raw, mask, t.TypeOf(q), SoftmaxInFp32(m), m.a.attentionLogitSoftcap);
  const ValueId dropped = ops::Dropout(t, probs, m.a.attentionDropout, "attention dropout");
  t.Drop(probs);
  // torch.matmul reshapes a 4-D operand to 3-D for bmm, copying a value view that cannot be
  // viewed so (a transposed projection), and bmm saves that copy. Where the value is a
  // projection's own output the saved view keeps the same bytes, so only Phi-3's value, a slice
  // of the wider fused qkv, is copied here: the copy is saved and qkv can go.
  // GPT-NeoX's value is a chunk of its transposed query_key_value the same way.
  const bool copiesValue = (m.a.fusedProjections || m.a.family == Family::GPTNeoX) && kv == heads;
  const ValueId read = copiesValue ? ops::Copy(t, vals, full, "value.reshape (matmul's copy of the view)") : t.Keep(vals);
  out = ops::MatMul(t, dropped, read, full, "probs·v");
  t.Drop(read);
  t.Drop(dropped);
  t.Drop(keys);
  t.Drop(vals);
  const ValueId transposed = ops::View(t, out, {b, s, heads, d}, "transpose(1, 2)");
  t.Drop(out);
  const ValueId contiguous = ops::Copy(t, transposed, {b, s, heads, d}, "attention output .contiguous()");
  t.Drop(transposed);
  return contiguous;
}

// The core, wrapped in a checkpoint under selective recomputation.
ValueId Attention(Model& m, ValueId q, ValueId k, ValueId v, ValueId mask) {
  if (m.training.checkpointing != Checkpointing::Selective) return AttentionCore(m, q, k, v, mask);
  Tape::Values inputs = {q, k, v};
  if (mask != kNoValue) inputs.push_back(mask);
  Model* model = &m;
  const Tape::Values outs = m.t.Checkpoint("attention core", inputs, [model](Tape&, const Tape::Values& in) {
    return Tape::Values{AttentionCore(*model, in[0], in[1], in[2], in.size() > 3 ? in[3] : kNoValue)};
  });
  return outs.front();
}

}  // namespace

bool MaskedSoftmaxKernelAvailable(std::int64_t b, std::int64_t heads, std::int64_t sq, std::int64_t sk, DType scores) {
  // FusedScaleMaskSoftmax.is_kernel_available (megatron/core/fusions/fused_softmax.py): 16-bit
  // input, 16 < sk ≤ 4096, sq and sk multiples of 4, b·np a multiple of 4, and for the causal
  // mask b·np a multiple of the kernel's batch_per_block: apex csrc/megatron/
  // scaled_masked_softmax.h get_batch_per_block: with p = next power of two ≥ sk, warp =
  // min(p, 32), 128 threads a block, (128 / warp) · (p ≤ 128 ? 2 : 1) rows a block.
  const std::int64_t batches = b * heads;
  const bool float16 = scores == DType::BF16 || scores == DType::FP16;
  if (!float16 || sk <= 16 || sk > 4096 || sq % 4 != 0 || sk % 4 != 0 || batches % 4 != 0) return false;
  std::int64_t power = 1;
  while (power < sk) power *= 2;
  const std::int64_t warp = power < 32 ? power : 32;
  const std::int64_t perBlock = 128 / warp * (power <= 128 ? 2 : 1);
  return batches % perBlock == 0;
}

ValueId Heads(Model& m, ValueId x, std::int64_t n, const char* name) {
  Tape& t = m.t;
  const std::int64_t d = HeadDim(m.a);
  const TextPart base = TextPart::View(name);
  const ValueId split = ops::View(t, x, {m.b, m.s, n, d}, t.T({base, " view"}));
  const ValueId heads = ops::View(t, split, {m.b, n, m.s, d}, t.T({base, " transpose"}));
  t.Drop(split);
  return heads;
}

ValueId NormedHeads(Model& m, ValueId projected, std::int64_t n, const Module& norm, const char* name) {
  Tape& t = m.t;
  const TextPart base = TextPart::View(name);
  const ValueId split = ops::View(t, projected, {m.b, m.s, n, HeadDim(m.a)}, t.T({base, " view"}));
  t.Drop(projected);
  const ValueId normed = RmsNorm(m, split, norm);
  t.Drop(split);
  const ValueId heads = ops::View(t, normed, {m.b, n, m.s, HeadDim(m.a)}, t.T({base, " transpose"}));
  t.Drop(normed);
  return heads;
}

namespace {

// x[..., from:from + width] along the last dimension: a view whose backward (SliceBackward0,
// slice_backward) makes a zero gradient of x's whole size and copies its own into it.
ValueId SliceLast(Tape& t, ValueId x, std::int64_t width, TextPart name) {
  Shape shape = t.ShapeOf(x);
  shape.back() = width;
  return t.Apply({.name = name, .inputs = {{x}}, .shape = shape, .type = t.TypeOf(x), .viewOf = x});
}

}  // namespace

void DynamicCacheCopies(Model& m, ValueId& k, ValueId& v) {
  Tape& t = m.t;
  // DynamicLayer.update's first call (transformers 5.x cache_utils.py): torch.cat onto the empty
  // tensor of lazy_initialization, a contiguous copy of the key and of the value that the
  // attention then reads (and SDPA saves) in place of the caller's.
  const ValueId cachedKey = ops::Copy(t, k, t.ShapeOf(k), "DynamicCache.update: torch.cat (key)");
  t.Drop(k);
  k = cachedKey;
  const ValueId cachedValue = ops::Copy(t, v, t.ShapeOf(v), "DynamicCache.update: torch.cat (value)");
  t.Drop(v);
  v = cachedValue;
}

FusedHeads FusedQkvHeads(Model& m, ValueId qkv) {
  Tape& t = m.t;
  const std::int64_t heads = m.a.numHeads, kv = KeyValueHeads(m.a), d = HeadDim(m.a);
  // Phi3Attention.forward (transformers models/phi3/modeling_phi3.py): query, key and value are
  // slices of qkv's last dimension, each viewed as heads and transposed. The slices keep qkv's
  // storage: while SDPA saves the value view, the whole projection stays.
  const ValueId qs = SliceLast(t, qkv, heads * d, "qkv[..., :query_pos]");
  const ValueId ks = SliceLast(t, qkv, kv * d, "qkv[..., query_pos:query_pos + kv·d]");
  const ValueId vs = SliceLast(t, qkv, kv * d, "qkv[..., query_pos + kv·d:]");
  FusedHeads out;
  out.q = Heads(m, qs, heads, "query");
  out.k = Heads(m, ks, kv, "key");
  out.v = Heads(m, vs, kv, "value");
  t.Drop(qs);
  t.Drop(ks);
  t.Drop(vs);
  return out;
}

std::pair<ValueId, ValueId> RopeWithPass(Model& m, ValueId q, ValueId k, ValueId cos, ValueId sin) {
  Tape& t = m.t;
  // Phi-3's apply_rotary_pos_emb: q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:] (and
  // k's), then torch.cat([q_rot·cos + rotate_half(q_rot)·sin, q_pass], dim=-1). With the rotary
  // dimension the whole head, q[..., :d] is q itself (indexing returns self for a full slice)
  // and q_pass an empty view whose SliceBackward0 still makes a zero gradient of q's size; with
  // a partial one (partial_rotary_factor) both are slices, each with such a gradient. The cat is
  // a new tensor; its backward hands each part a narrowed view of its gradient.
  const std::int64_t d = HeadDim(m.a), rotary = RotaryDim(m.a);
  auto rot = [&](ValueId x, const char* name) {
    return rotary == d ? t.Keep(x) : SliceLast(t, x, rotary, t.T({TextPart::View(name), "[..., :rotary_dim]"}));
  };
  const ValueId qRot = rot(q, "q");
  const ValueId qPass = SliceLast(t, q, d - rotary, "q[..., rotary_dim:]");
  const ValueId kRot = rot(k, "k");
  const ValueId kPass = SliceLast(t, k, d - rotary, "k[..., rotary_dim:]");
  auto embed = [&](ValueId x, ValueId pass, const char* name) {
    Shape shape = t.ShapeOf(x);
    shape.back() = d;
    const ValueId rotated = Rope(m, x, cos, sin, name);
    t.Drop(x);
    const ValueId y = t.Apply({.name = t.T({TextPart::View(name), " cat([rotated, pass])"}),
                               .inputs = {{rotated, In::PassThrough}, {pass, In::PassThrough}},
                               .shape = shape, .type = t.TypeOf(rotated)});
    t.Drop(rotated);
    t.Drop(pass);
    return y;
  };
  const ValueId qEmbed = embed(qRot, qPass, "q");
  const ValueId kEmbed = embed(kRot, kPass, "k");
  return {qEmbed, kEmbed};
}

ValueId Rope(Model& m, ValueId x, ValueId cos, ValueId sin, const char* name) {
  Tape& t = m.t;
  const TextPart n = TextPart::View(name);
  Shape half = t.ShapeOf(x);
  half.back() /= 2;
  const ValueId xc = ops::Mul(t, x, cos, t.T({n, "·cos"}));
  const ValueId x1 = SliceLast(t, x, half.back(), t.T({n, "[..., :d/2]"}));
  const ValueId x2 = SliceLast(t, x, half.back(), t.T({n, "[..., d/2:]"}));
  const ValueId negated = t.Apply({.name = t.T({"−", n, "₂"}), .inputs = {{x2}}, .shape = half, .type = t.TypeOf(x)});
  const Text rotatedName = t.T({"rotate_half(", n, ")"});
  const ValueId rotated = t.Apply({.name = rotatedName,
                                   .inputs = {{negated, In::PassThrough}, {x1, In::PassThrough}},
                                   .shape = t.ShapeOf(x), .type = t.TypeOf(x)});
  t.Drop(negated);
  t.Drop(x1);
  t.Drop(x2);
  const ValueId xs = ops::Mul(t, rotated, sin, t.T({rotatedName, "·sin"}));
  t.Drop(rotated);
  const ValueId y = ops::Add(t, xc, xs, t.T({n, " with RoPE"}));
  t.Drop(xc);
  t.Drop(xs);
  return y;
}

ValueId AttentionOutput(Model& m, ValueId q, ValueId k, ValueId v, ValueId mask, bool causal,
                        const Module& out, const char* name, double dropout) {
  (void)causal;  // the mask (eager) or the kernel's is_causal (SDPA) carries causality
  Tape& t = m.t;
  const ValueId core = Attention(m, q, k, v, mask);
  t.Drop(q);
  t.Drop(k);
  t.Drop(v);
  const ValueId merged = ops::View(t, core, {m.b, m.s, m.a.numHeads * HeadDim(m.a)}, "merge heads");
  t.Drop(core);
  const TextPart n = TextPart::View(name);
  // A RowParallelLinear under tensor parallelism: heads/t · head_dim in, the whole h out.
  ValueId projected = Linear(m, merged, out, m.a.hiddenSize, n);
  t.Drop(merged);
  projected = sequence_split::RowParallelOutput(m, projected, t.T({n, " reduce-scatter (s/t)"}));
  const ValueId dropped = ops::Dropout(t, projected, dropout, t.T({n, " dropout"}));
  t.Drop(projected);
  return dropped;
}

}  // namespace gpumem::blocks
