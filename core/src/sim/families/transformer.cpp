// Forward of a transformer, op by op, as Hugging Face transformers' eager / SDPA code runs it
// under the Trainer (the model returns logits and loss; compute_loss keeps only the loss, so
// the logits are dropped before backward). Backward is the Tape's autograd model.
//
// What each op keeps for backward (PyTorch derivatives.yaml, CUDA kernels):
//   linear / matmul: both operands (under autocast: their 16-bit copies)
//   softmax: its output        gelu, silu, pow: their input        tanh, sigmoid, rsqrt: output
//   mul: each operand only if the other needs a gradient        add, scalar mul, views: nothing
//   dropout (0 < p < 1): a 1-byte mask        layer_norm: input, mean and rstd (fp32)
//   embedding: the ids        log_softmax: its output        nll_loss: target and total_weight
//   fused SDPA (flash / memory-efficient): q, k, v, its output and an fp32 log-sum-exp
//   index (x[idx]): the indices        index_add_: the indices and its source
// Autocast (CUDA lists): linear and matmul cast their inputs to 16-bit (weights once per
// forward, cached); layer_norm, softmax, log_softmax and the loss run in fp32; elementwise
// ops promote. The simulation follows the CUDA kernels; docs/validation.md lists where CPU
// PyTorch keeps something else.
#include <map>
#include <memory>
#include <string>

#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/tape.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {
namespace {

using Shape = std::vector<std::int64_t>;

Shape WithLast(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

class TransformerPass final : public ModelPass {
 public:
  TransformerPass(const Setup& setup, const Inventory& inventory, const Regime& regime)
      : a_(setup.model.architecture), t_(setup.training), inventory_(inventory), regime_(regime),
        b_(setup.training.batchSize), s_(setup.training.sequenceLength) {
    for (std::size_t i = 0; i < inventory.parameters.size(); ++i) index_[inventory.parameters[i].name] = i;
  }

  void Forward(TraceBuilder& b) override {
    tape_ = std::make_unique<Tape>(b, regime_.compute, regime_.autocast);
    parameters_.clear();
    Tape& t = *tape_;
    t.SetScope("batch", -1);
    const DType i64 = DType::Int64;
    const bool classification = a_.family == Family::BERT && a_.encoderHead == EncoderHead::Classification;
    batch_.push_back(b.Alloc(Category::InputBatch, b_ * s_ * 8, "input_ids", "batch: input_ids",
                             TensorFormula({b_, s_}, i64)));
    batch_.push_back(b.Alloc(Category::InputBatch, b_ * s_ * 8, "attention_mask", "batch: attention_mask",
                             TensorFormula({b_, s_}, i64)));
    if (a_.family == Family::BERT) {
      batch_.push_back(b.Alloc(Category::InputBatch, b_ * s_ * 8, "token_type_ids",
                               "batch: token_type_ids", TensorFormula({b_, s_}, i64)));
    }
    const Shape labelShape = classification ? Shape{b_} : Shape{b_, s_};
    batch_.push_back(b.Alloc(Category::InputBatch, (classification ? b_ : b_ * s_) * 8, "labels",
                             "batch: labels", TensorFormula(labelShape, i64)));
    ids_ = t.External(batch_[0], {b_, s_}, i64, "input_ids");
    labels_ = t.External(batch_.back(), labelShape, i64, "labels");
    tokenTypes_ = a_.family == Family::BERT ? t.External(batch_[2], {b_, s_}, i64, "token_type_ids") : kNoValue;

    ValueId logits = a_.family == Family::BERT ? EncoderForward() : DecoderForward();
    loss_ = Loss(logits);
    t.Drop(logits);  // compute_loss returns the loss only: the model output goes
    t.EndAutocast();
  }

  void Backward(TraceBuilder& b, GradientSink& gradients) override {
    (void)b;
    tape_->Backward(loss_, gradients);
  }

  void EndStep(TraceBuilder& b) override {
    tape_->SetScope("end of step", -1);
    tape_->Drop(loss_);
    tape_->Drop(ids_);
    tape_->Drop(labels_);
    tape_->Drop(tokenTypes_);
    for (TensorHandle h : batch_) b.Release(h, "end of step: batch released");
    batch_.clear();
    tape_.reset();
  }

 private:
  // ---------------------------------------------------------------------------------------
  // Parameters and primitive ops.

  ValueId P(const std::string& name) {
    if (auto it = parameters_.find(name); it != parameters_.end()) return it->second;
    const std::size_t index = index_.at(name);
    const ValueId v = tape_->Parameter(index, inventory_.parameters[index].shape, regime_.weights, name);
    parameters_[name] = v;
    return v;
  }
  ValueId POptional(const std::string& name) {
    return index_.count(name) ? P(name) : kNoValue;
  }

  // x @ Wᵀ + b. `transposedWeight` for GPT-2's Conv1D ([in, out] storage).
  ValueId Linear(ValueId x, ValueId weight, ValueId bias, std::int64_t out, const std::string& name) {
    Tape& t = *tape_;
    const ValueId x16 = t.ForMatmul(x);
    const ValueId w16 = t.ForMatmul(weight);
    const ValueId b16 = bias == kNoValue ? kNoValue : t.ForMatmul(bias);
    const DType type = t.autocast() ? t.computeType() : Promote(t.TypeOf(x16), t.TypeOf(w16));
    std::vector<In> inputs = {{x16}, {w16}};
    if (b16 != kNoValue) inputs.push_back({b16});
    const ValueId y = t.Apply({.name = name, .inputs = inputs, .shape = WithLast(t.ShapeOf(x), out),
                               .type = type, .saves = {x16, w16}});
    t.Drop(x16);
    t.Drop(w16);
    t.Drop(b16);
    return y;
  }
  ValueId Linear(ValueId x, const std::string& module, std::int64_t out, const std::string& name) {
    return Linear(x, P(module + ".weight"), POptional(module + ".bias"), out, name);
  }

  ValueId MatMul(ValueId a, ValueId b, Shape shape, const std::string& name) {
    Tape& t = *tape_;
    const ValueId a16 = t.ForMatmul(a), b16 = t.ForMatmul(b);
    const DType type = t.autocast() ? t.computeType() : Promote(t.TypeOf(a16), t.TypeOf(b16));
    const ValueId y = t.Apply({.name = name, .inputs = {{a16}, {b16}}, .shape = std::move(shape),
                               .type = type, .saves = {a16, b16}});
    t.Drop(a16);
    t.Drop(b16);
    return y;
  }

  ValueId View(ValueId x, Shape shape, const std::string& name) {
    return tape_->Apply({.name = name, .inputs = {{x, In::PassThrough}}, .shape = std::move(shape),
                         .type = tape_->TypeOf(x), .viewOf = x});
  }

  // A copy into a new tensor with no saves: .contiguous(), repeat_kv's reshape.
  ValueId Copy(ValueId x, Shape shape, const std::string& name, In::Rule rule = In::PassThrough) {
    return tape_->Apply({.name = name, .inputs = {{x, rule}}, .shape = std::move(shape), .type = tape_->TypeOf(x)});
  }

  ValueId To(ValueId x, DType type) {
    if (tape_->TypeOf(x) == type) return tape_->Keep(x);
    return tape_->Apply({.name = std::string("to(") + DTypeId(type) + ")", .inputs = {{x}},
                         .shape = tape_->ShapeOf(x), .type = type});
  }

  ValueId Add(ValueId a, ValueId b, const std::string& name) {
    Tape& t = *tape_;
    Shape shape = t.Elements(a) >= t.Elements(b) ? t.ShapeOf(a) : t.ShapeOf(b);
    return t.Apply({.name = name, .inputs = {{a, In::PassThrough}, {b, In::PassThrough}},
                    .shape = shape, .type = Promote(t.TypeOf(a), t.TypeOf(b))});
  }

  // An additive constant (mask) or a scalar: the gradient passes to `a` only.
  ValueId AddConstant(ValueId a, ValueId constant, const std::string& name) {
    Tape& t = *tape_;
    const DType type = constant == kNoValue ? t.TypeOf(a) : Promote(t.TypeOf(a), t.TypeOf(constant));
    std::vector<In> inputs = {{a, In::PassThrough}};
    if (constant != kNoValue) inputs.push_back({constant, In::NoGrad});
    return t.Apply({.name = name, .inputs = inputs, .shape = t.ShapeOf(a), .type = type});
  }

  ValueId Scale(ValueId a, const std::string& name) {  // a * python float
    return tape_->Apply({.name = name, .inputs = {{a}}, .shape = tape_->ShapeOf(a), .type = tape_->TypeOf(a)});
  }

  ValueId Mul(ValueId a, ValueId b, const std::string& name) {
    Tape& t = *tape_;
    // Each operand is saved only if the other one needs a gradient.
    std::vector<ValueId> saves;
    if (Grad(a)) saves.push_back(b);
    if (Grad(b)) saves.push_back(a);
    Shape shape = t.Elements(a) >= t.Elements(b) ? t.ShapeOf(a) : t.ShapeOf(b);
    return t.Apply({.name = name, .inputs = {{a}, {b}}, .shape = shape,
                    .type = Promote(t.TypeOf(a), t.TypeOf(b)), .saves = saves});
  }
  bool Grad(ValueId v) { return tape_->recording() && tape_->RequiresGrad(v); }

  ValueId SavesInput(ValueId x, const std::string& name) {  // gelu, silu
    return tape_->Apply({.name = name, .inputs = {{x}}, .shape = tape_->ShapeOf(x),
                         .type = tape_->TypeOf(x), .saves = {x}});
  }
  ValueId SavesOutput(ValueId x, const std::string& name, DType type) {  // tanh, sigmoid, softmax
    return tape_->Apply({.name = name, .inputs = {{x}}, .shape = tape_->ShapeOf(x), .type = type,
                         .savesOutput = true});
  }

  ValueId Dropout(ValueId x, double p, const std::string& name) {
    if (p <= 0.0) return tape_->Keep(x);  // F.dropout with p = 0 returns its input
    return tape_->Apply({.name = name, .inputs = {{x}}, .shape = tape_->ShapeOf(x), .type = tape_->TypeOf(x),
                         .saveNew = {{tape_->ShapeOf(x), DType::Bool, "mask"}}});
  }

  ValueId LayerNorm(ValueId x, const std::string& module) {
    Tape& t = *tape_;
    // Under autocast layer_norm runs in fp32: a 16-bit input is copied to fp32 first.
    const ValueId in = t.autocast() ? To(x, DType::FP32) : t.Keep(x);
    Shape rows = t.ShapeOf(x);
    rows.back() = 1;
    const ValueId y = t.Apply({.name = module, .inputs = {{in}, {P(module + ".weight")}, {P(module + ".bias")}},
                               .shape = t.ShapeOf(x), .type = t.TypeOf(in), .saves = {in},
                               .saveNew = {{rows, DType::FP32, "mean"}, {rows, DType::FP32, "rstd"}}});
    t.Drop(in);
    return y;
  }

  // LlamaRMSNorm, op by op: x.to(fp32); x.pow(2).mean(-1); x * rsqrt(var + eps); w * x.to(dtype).
  ValueId RmsNorm(ValueId x, const std::string& module) {
    Tape& t = *tape_;
    const DType inputType = t.TypeOf(x);
    Shape rows = t.ShapeOf(x);
    rows.back() = 1;
    const ValueId x32 = To(x, DType::FP32);
    const ValueId square = t.Apply({.name = module + " pow(2)", .inputs = {{x32}}, .shape = t.ShapeOf(x),
                                    .type = DType::FP32, .saves = {x32}});
    const ValueId variance = t.Apply({.name = module + " mean", .inputs = {{square}}, .shape = rows, .type = DType::FP32});
    t.Drop(square);
    const ValueId shifted = AddConstant(variance, kNoValue, module + " variance + eps");
    t.Drop(variance);
    const ValueId rstd = SavesOutput(shifted, module + " rsqrt", DType::FP32);
    t.Drop(shifted);
    const ValueId normed = Mul(x32, rstd, module + " x * rsqrt");
    t.Drop(x32);
    t.Drop(rstd);
    const ValueId cast = To(normed, inputType);
    t.Drop(normed);
    const ValueId y = Mul(P(module + ".weight"), cast, module + " weight * x");
    t.Drop(cast);
    return y;
  }

  ValueId Embedding(ValueId ids, ValueId weight, std::int64_t width, const std::string& name) {
    Tape& t = *tape_;
    Shape shape = t.ShapeOf(ids);
    shape.push_back(width);
    return t.Apply({.name = name, .inputs = {{ids, In::NoGrad}, {weight}}, .shape = shape,
                    .type = t.TypeOf(weight), .saves = {ids}});
  }

  ValueId Activation(ValueId x, const std::string& name) {
    Tape& t = *tape_;
    switch (a_.hiddenAct) {
      case HiddenAct::GELU:
      case HiddenAct::GELUTanh:
      case HiddenAct::SiLU:
        return SavesInput(x, name);
      case HiddenAct::GELUNew: {
        // 0.5 * x * (1.0 + tanh(sqrt(2/π) * (x + 0.044715 * x³))), evaluated left to right.
        // Under autocast pow is an fp32 op: it runs on (and saves) an fp32 copy of x, and the
        // rest of the formula is promoted to fp32.
        const ValueId half = Scale(x, name + " 0.5·x");
        const ValueId base = t.autocast() ? To(x, DType::FP32) : t.Keep(x);
        const ValueId cube = t.Apply({.name = name + " x³", .inputs = {{base}}, .shape = t.ShapeOf(x),
                                      .type = t.TypeOf(base), .saves = {base}});
        t.Drop(base);
        const ValueId scaled = Scale(cube, name + " 0.044715·x³");
        t.Drop(cube);
        const ValueId inner = Add(x, scaled, name + " x + 0.044715·x³");
        t.Drop(scaled);
        const ValueId arg = Scale(inner, name + " √(2/π)·(…)");
        t.Drop(inner);
        const ValueId th = SavesOutput(arg, name + " tanh", t.TypeOf(arg));
        t.Drop(arg);
        const ValueId onePlus = AddConstant(th, kNoValue, name + " 1 + tanh");
        t.Drop(th);
        const ValueId y = Mul(half, onePlus, name + " output");
        t.Drop(half);
        t.Drop(onePlus);
        return y;
      }
    }
    return t.Keep(x);
  }

  // ---------------------------------------------------------------------------------------
  // Attention.

  // q: [b, heads, s, d]; k, v: [b, kvHeads, s, d]. Returns [b, s, heads, d] (contiguous).
  ValueId AttentionCore(ValueId q, ValueId k, ValueId v, ValueId mask, bool causal) {
    Tape& t = *tape_;
    const std::int64_t heads = a_.numHeads, d = HeadDim(a_), kv = KeyValueHeads(a_);
    const Shape full = {b_, heads, s_, d};
    (void)causal;
    // repeat_kv: expand + reshape copies k and v to every query head (GQA).
    const ValueId keys = kv == heads ? t.Keep(k) : Copy(k, full, "repeat_kv(key)", In::Compute);
    const ValueId vals = kv == heads ? t.Keep(v) : Copy(v, full, "repeat_kv(value)", In::Compute);
    ValueId out = kNoValue;
    if (t_.attention == AttentionImplementation::SDPA) {
      const ValueId q16 = t.ForMatmul(q), k16 = t.ForMatmul(keys), v16 = t.ForMatmul(vals);
      // The kernels write their output in [b, s, heads, d] memory order and return it
      // transposed, so HF's .transpose(1, 2).contiguous() afterwards copies nothing.
      out = t.Apply({.name = "scaled_dot_product_attention",
                     .inputs = {{q16}, {k16}, {v16}},
                     .shape = {b_, s_, heads, d},
                     .type = t.TypeOf(q16),
                     .saves = {q16, k16, v16},
                     .savesOutput = true,
                     .saveNew = {{{b_, heads, s_}, DType::FP32, "logsumexp"}},
                     .backwardTemps = {{full, DType::FP32, "dq accumulator (fp32)"},
                                       {{b_, heads, s_}, DType::FP32, "softmax_d = rowsum(dO·O)"}}});
      t.Drop(q16);
      t.Drop(k16);
      t.Drop(v16);
      t.Drop(keys);
      t.Drop(vals);
      return out;
    } else {
      const Shape scores = {b_, heads, s_, s_};
      const ValueId kT = View(keys, {b_, heads, d, s_}, "keyᵀ");
      const ValueId raw = MatMul(q, kT, scores, "q·kᵀ");
      t.Drop(kT);
      ValueId scaled = Scale(raw, "scores × 1/√d");
      t.Drop(raw);
      if (mask != kNoValue) {
        const ValueId masked = AddConstant(scaled, mask, "scores + mask");
        t.Drop(scaled);
        scaled = masked;
      }
      const ValueId probs32 = SavesOutput(scaled, "softmax (fp32)", DType::FP32);
      t.Drop(scaled);
      const ValueId probs = To(probs32, t.TypeOf(q));
      t.Drop(probs32);
      const ValueId dropped = Dropout(probs, a_.attentionDropout, "attention dropout");
      t.Drop(probs);
      out = MatMul(dropped, vals, full, "probs·v");
      t.Drop(dropped);
    }
    t.Drop(keys);
    t.Drop(vals);
    const ValueId transposed = View(out, {b_, s_, heads, d}, "transpose(1, 2)");
    t.Drop(out);
    const ValueId contiguous = Copy(transposed, {b_, s_, heads, d}, "attention output .contiguous()");
    t.Drop(transposed);
    return contiguous;
  }

  // Runs the core, wrapped in a checkpoint under selective recomputation.
  ValueId Attention(ValueId q, ValueId k, ValueId v, ValueId mask, bool causal) {
    if (t_.checkpointing != Checkpointing::Selective) return AttentionCore(q, k, v, mask, causal);
    std::vector<ValueId> inputs = {q, k, v};
    if (mask != kNoValue) inputs.push_back(mask);
    auto outs = tape_->Checkpoint("attention core", inputs,
                                  [this, causal](Tape&, const std::vector<ValueId>& in) {
                                    return std::vector<ValueId>{AttentionCore(
                                        in[0], in[1], in[2], in.size() > 3 ? in[3] : kNoValue, causal)};
                                  });
    return outs.front();
  }

  // Attention on q, k, v (the caller's, released here), the heads merged back to
  // [b, s, heads·d], the output projection `module` and its dropout.
  ValueId AttentionOutput(ValueId q, ValueId k, ValueId v, ValueId mask, bool causal,
                          const std::string& module, const std::string& name, double dropout) {
    Tape& t = *tape_;
    const ValueId core = Attention(q, k, v, mask, causal);
    t.Drop(q); t.Drop(k); t.Drop(v);
    const ValueId merged = View(core, {b_, s_, a_.numHeads * HeadDim(a_)}, "merge heads");
    t.Drop(core);
    const ValueId projected = Linear(merged, module, a_.hiddenSize, name);
    t.Drop(merged);
    const ValueId dropped = Dropout(projected, dropout, name + " dropout");
    t.Drop(projected);
    return dropped;
  }

  // [b, s, n·d] → [b, n, s, d] (views).
  ValueId Heads(ValueId x, std::int64_t n, const std::string& name) {
    const std::int64_t d = HeadDim(a_);
    const ValueId split = View(x, {b_, s_, n, d}, name + " view");
    const ValueId heads = View(split, {b_, n, s_, d}, name + " transpose");
    tape_->Drop(split);
    return heads;
  }

  // apply_rotary_pos_emb: x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁).
  ValueId Rope(ValueId x, ValueId cos, ValueId sin, const std::string& name) {
    Tape& t = *tape_;
    Shape half = t.ShapeOf(x);
    half.back() /= 2;
    const ValueId xc = Mul(x, cos, name + "·cos");
    const ValueId x1 = t.Apply({.name = name + "[..., :d/2]", .inputs = {{x}}, .shape = half,
                                .type = t.TypeOf(x), .viewOf = x});
    const ValueId x2 = t.Apply({.name = name + "[..., d/2:]", .inputs = {{x}}, .shape = half,
                                .type = t.TypeOf(x), .viewOf = x});
    const ValueId negated = t.Apply({.name = "−" + name + "₂", .inputs = {{x2}}, .shape = half, .type = t.TypeOf(x)});
    const ValueId rotated = t.Apply({.name = "rotate_half(" + name + ")",
                                     .inputs = {{negated, In::PassThrough}, {x1, In::PassThrough}},
                                     .shape = t.ShapeOf(x), .type = t.TypeOf(x)});
    t.Drop(negated);
    t.Drop(x1);
    t.Drop(x2);
    const ValueId xs = Mul(rotated, sin, "rotate_half(" + name + ")·sin");
    t.Drop(rotated);
    const ValueId y = Add(xc, xs, name + " with RoPE");
    t.Drop(xc);
    t.Drop(xs);
    return y;
  }

  // ---------------------------------------------------------------------------------------
  // Blocks.

  struct Context {
    ValueId mask = kNoValue, cos = kNoValue, sin = kNoValue;
  };

  void Scope(int layer, const std::string& what) {
    tape_->SetScope(layer >= 0 ? "layers." + std::to_string(layer) + " " + what : what, layer);
  }

  ValueId Gpt2Block(ValueId x, const Context& c, int i) {
    Tape& t = *tape_;
    const std::string m = "transformer.h." + std::to_string(i) + ".";
    const std::int64_t h = a_.hiddenSize;
    Scope(i, "attention");
    const ValueId residual = t.Keep(x);
    const ValueId n1 = LayerNorm(x, m + "ln_1");
    const ValueId qkv = Linear(n1, m + "attn.c_attn", 3 * h, "c_attn (qkv)");
    t.Drop(n1);
    std::vector<ValueId> parts = t.Split("qkv.split", qkv, {{b_, s_, h}, {b_, s_, h}, {b_, s_, h}});
    t.Drop(qkv);
    const ValueId q = Heads(parts[0], a_.numHeads, "query");
    const ValueId k = Heads(parts[1], a_.numHeads, "key");
    const ValueId v = Heads(parts[2], a_.numHeads, "value");
    for (ValueId p : parts) t.Drop(p);
    const ValueId dropped = AttentionOutput(q, k, v, c.mask, true, m + "attn.c_proj", "c_proj", a_.hiddenDropout);
    const ValueId x2 = Add(dropped, residual, "residual add");
    t.Drop(dropped);
    t.Drop(residual);
    Scope(i, "mlp");
    const ValueId n2 = LayerNorm(x2, m + "ln_2");
    const ValueId mdrop = PlainMlp(n2, m + "mlp.c_fc", m + "mlp.c_proj", "mlp");
    t.Drop(n2);
    const ValueId y = Add(x2, mdrop, "residual add");
    t.Drop(x2);
    t.Drop(mdrop);
    return y;
  }

  // GPT-2's and BERT's MLP: up-projection, activation, down-projection, dropout.
  ValueId PlainMlp(ValueId x, const std::string& up, const std::string& down, const std::string& label) {
    Tape& t = *tape_;
    const ValueId wide = Linear(x, up, IntermediateSize(a_), label + " up");
    const ValueId act = Activation(wide, label + " activation");
    t.Drop(wide);
    const ValueId narrow = Linear(act, down, a_.hiddenSize, label + " down");
    t.Drop(act);
    const ValueId dropped = Dropout(narrow, a_.hiddenDropout, label + " dropout");
    t.Drop(narrow);
    return dropped;
  }

  ValueId GatedMlp(ValueId x, const std::string& m, std::int64_t inter, const std::string& gate,
                   const std::string& up, const std::string& down, const std::string& label) {
    Tape& t = *tape_;
    const ValueId g = Linear(x, m + gate, inter, label + " " + gate);
    const ValueId act = Activation(g, label + " act_fn");
    t.Drop(g);
    const ValueId u = Linear(x, m + up, inter, label + " " + up);
    const ValueId prod = Mul(act, u, label + " act·up");
    t.Drop(act);
    t.Drop(u);
    const ValueId y = Linear(prod, m + down, a_.hiddenSize, label + " " + down);
    t.Drop(prod);
    return y;
  }

  // MixtralSparseMoeBlock, with tokens routed evenly: expert e receives ⌊T·k/E⌋ tokens, the
  // first (T·k mod E) experts one more. Saved activations depend only on the total T·k.
  ValueId MoE(ValueId x, const std::string& m) {
    Tape& t = *tape_;
    const std::int64_t h = a_.hiddenSize, E = a_.numExperts, k = a_.expertsPerToken, T = b_ * s_;
    const ValueId flat = View(x, {T, h}, "view(-1, hidden)");
    const ValueId router = Linear(flat, m + "block_sparse_moe.gate", E, "router logits");
    const ValueId probs = SavesOutput(router, "router softmax (fp32)", DType::FP32);
    t.Drop(router);
    const ValueId selected = t.Fresh({T, k}, DType::Int64, "selected_experts");
    const ValueId top = t.Apply({.name = "topk weights", .inputs = {{probs}}, .shape = {T, k},
                                 .type = DType::FP32, .saves = {selected}});
    t.Drop(probs);
    const ValueId sum = t.Apply({.name = "routing sum", .inputs = {{top}}, .shape = {T, 1}, .type = DType::FP32});
    const ValueId normed = t.Apply({.name = "routing /= sum", .inputs = {{top}, {sum}}, .shape = {T, k},
                                    .type = DType::FP32, .saves = {top, sum}});
    t.Drop(sum);
    t.Drop(top);
    const ValueId weights = To(normed, t.TypeOf(flat));
    t.Drop(normed);
    ValueId final = t.Fresh({T, h}, t.TypeOf(flat), "final_hidden_states (zeros)");
    const ValueId expertMask = t.Fresh({E, k, T}, DType::Int64, "expert_mask (one_hot)");
    const std::int64_t inter = ExpertIntermediateSize(a_);
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t n = (T * k) / E + (e < (T * k) % E ? 1 : 0);
      if (n == 0) continue;
      const std::string x_ = m + "block_sparse_moe.experts." + std::to_string(e) + ".";
      const std::string label = "expert " + std::to_string(e);
      const ValueId idx = t.Fresh({n}, DType::Int64, label + " idx");
      const ValueId topX = t.Fresh({n}, DType::Int64, label + " top_x");
      const ValueId state = t.Apply({.name = label + " hidden_states[top_x]", .inputs = {{flat}},
                                     .shape = {n, h}, .type = t.TypeOf(flat), .saves = {topX}});
      const ValueId out = GatedMlp(state, x_, inter, "w1", "w3", "w2", label);
      t.Drop(state);
      const ValueId w = t.Apply({.name = label + " routing_weights[top_x, idx]", .inputs = {{weights}},
                                 .shape = {n, 1}, .type = t.TypeOf(weights), .saves = {topX, idx}});
      const ValueId scaled = Mul(out, w, label + " output × routing weight");
      t.Drop(out);
      t.Drop(w);
      const ValueId cast = To(scaled, t.TypeOf(flat));
      t.Drop(scaled);
      // index_add_'s backward expands the gradient "as source": it keeps the source tensor.
      const ValueId added = t.Apply({.name = label + " index_add_", .inputs = {{final, In::PassThrough}, {cast}},
                                     .shape = {T, h}, .type = t.TypeOf(final), .saves = {topX, cast},
                                     .viewOf = final});
      t.Drop(final);
      final = added;
      t.Drop(cast);
      t.Drop(idx);
      t.Drop(topX);
    }
    t.Drop(expertMask);
    t.Drop(weights);
    t.Drop(selected);
    if (a_.sharedExpertIntermediateSize > 0) {
      ValueId shared = GatedMlp(flat, m + "mlp.shared_expert.", a_.sharedExpertIntermediateSize,
                                "gate_proj", "up_proj", "down_proj", "shared expert");
      if (a_.sharedExpertGate) {
        const ValueId g = Linear(flat, m + "mlp.shared_expert_gate", 1, "shared_expert_gate");
        const ValueId sg = SavesOutput(g, "sigmoid(shared_expert_gate)", t.TypeOf(g));
        t.Drop(g);
        const ValueId gated = Mul(sg, shared, "gate × shared expert");
        t.Drop(sg);
        t.Drop(shared);
        shared = gated;
      }
      const ValueId sum2 = Add(final, shared, "routed + shared");
      t.Drop(final);
      t.Drop(shared);
      final = sum2;
    }
    t.Drop(flat);
    const ValueId y = View(final, {b_, s_, h}, "reshape(b, s, hidden)");
    t.Drop(final);
    return y;
  }

  ValueId LlamaBlock(ValueId x, const Context& c, int i) {
    Tape& t = *tape_;
    const std::string m = "model.layers." + std::to_string(i) + ".";
    const std::int64_t heads = a_.numHeads, kv = KeyValueHeads(a_), d = HeadDim(a_);
    Scope(i, "attention");
    const ValueId residual = t.Keep(x);
    const ValueId n1 = RmsNorm(x, m + "input_layernorm");
    const ValueId qp = Linear(n1, m + "self_attn.q_proj", heads * d, "q_proj");
    const ValueId kp = Linear(n1, m + "self_attn.k_proj", kv * d, "k_proj");
    const ValueId vp = Linear(n1, m + "self_attn.v_proj", kv * d, "v_proj");
    t.Drop(n1);
    const ValueId q = Heads(qp, heads, "query");
    const ValueId k = Heads(kp, kv, "key");
    const ValueId v = Heads(vp, kv, "value");
    t.Drop(qp); t.Drop(kp); t.Drop(vp);
    const ValueId qr = Rope(q, c.cos, c.sin, "q");
    const ValueId kr = Rope(k, c.cos, c.sin, "k");
    t.Drop(q); t.Drop(k);
    const ValueId o = AttentionOutput(qr, kr, v, c.mask, true, m + "self_attn.o_proj", "o_proj", 0.0);
    const ValueId x2 = Add(residual, o, "residual add");
    t.Drop(residual);
    t.Drop(o);
    Scope(i, a_.numExperts > 0 ? "moe" : "mlp");
    const ValueId n2 = RmsNorm(x2, m + "post_attention_layernorm");
    const ValueId mlp = a_.numExperts > 0
                            ? MoE(n2, m)
                            : GatedMlp(n2, m + "mlp.", IntermediateSize(a_), "gate_proj", "up_proj", "down_proj", "mlp");
    t.Drop(n2);
    const ValueId y = Add(x2, mlp, "residual add");
    t.Drop(x2);
    t.Drop(mlp);
    return y;
  }

  ValueId BertLayer(ValueId x, const Context& c, int i) {
    Tape& t = *tape_;
    const std::string m = "bert.encoder.layer." + std::to_string(i) + ".";
    const std::int64_t h = a_.hiddenSize;
    Scope(i, "attention");
    const ValueId qp = Linear(x, m + "attention.self.query", h, "query");
    const ValueId q = Heads(qp, a_.numHeads, "query");
    t.Drop(qp);
    const ValueId kp = Linear(x, m + "attention.self.key", h, "key");
    const ValueId k = Heads(kp, a_.numHeads, "key");
    t.Drop(kp);
    const ValueId vp = Linear(x, m + "attention.self.value", h, "value");
    const ValueId v = Heads(vp, a_.numHeads, "value");
    t.Drop(vp);
    const ValueId dropped = AttentionOutput(q, k, v, c.mask, false, m + "attention.output.dense",
                                            "attention output dense", a_.hiddenDropout);
    const ValueId sum = Add(dropped, x, "residual add");
    t.Drop(dropped);
    const ValueId attnOut = LayerNorm(sum, m + "attention.output.LayerNorm");
    t.Drop(sum);
    Scope(i, "mlp");
    const ValueId dropped2 = PlainMlp(attnOut, m + "intermediate.dense", m + "output.dense", "mlp");
    const ValueId sum2 = Add(dropped2, attnOut, "residual add");
    t.Drop(dropped2);
    t.Drop(attnOut);
    const ValueId y = LayerNorm(sum2, m + "output.LayerNorm");
    t.Drop(sum2);
    return y;
  }

  // Runs block i, wrapped in a checkpoint when the setup says so.
  ValueId Block(ValueId x, const Context& c, int i) {
    auto run = [this, i](ValueId in, const Context& ctx) {
      switch (a_.family) {
        case Family::GPT2: return Gpt2Block(in, ctx, i);
        case Family::Llama: return LlamaBlock(in, ctx, i);
        case Family::BERT: return BertLayer(in, ctx, i);
      }
      return tape_->Keep(in);
    };
    const bool checkpoint =
        t_.checkpointing == Checkpointing::EveryBlock ||
        (t_.checkpointing == Checkpointing::EveryKthBlock && i % t_.checkpointInterval == 0);
    if (!checkpoint) return run(x, c);
    tape_->SetScope("layers." + std::to_string(i), i);
    std::vector<ValueId> inputs = {x};
    for (ValueId v : {c.mask, c.cos, c.sin}) if (v != kNoValue) inputs.push_back(v);
    const Context ctx = c;
    auto outs = tape_->Checkpoint("block", inputs, [run, ctx](Tape&, const std::vector<ValueId>& in) {
      // Inputs after the first are the context in the order it was packed.
      Context local = ctx;
      std::size_t next = 1;
      if (ctx.mask != kNoValue) local.mask = in[next++];
      if (ctx.cos != kNoValue) local.cos = in[next++];
      if (ctx.sin != kNoValue) local.sin = in[next++];
      return std::vector<ValueId>{run(in[0], local)};
    });
    return outs.front();
  }

  // ---------------------------------------------------------------------------------------
  // Models.

  ValueId DecoderForward() {
    Tape& t = *tape_;
    const std::int64_t h = a_.hiddenSize;
    Context c;
    ValueId x = kNoValue;
    t.SetScope("embeddings", -1);
    if (a_.family == Family::GPT2) {
      const ValueId tokens = Embedding(ids_, P("transformer.wte.weight"), h, "wte(input_ids)");
      const ValueId positions = t.Fresh({1, s_}, DType::Int64, "position_ids");
      const ValueId pos = Embedding(positions, P("transformer.wpe.weight"), h, "wpe(position_ids)");
      t.Drop(positions);
      const ValueId sum = Add(tokens, pos, "inputs_embeds + position_embeds");
      t.Drop(tokens);
      t.Drop(pos);
      x = Dropout(sum, a_.hiddenDropout, "embedding dropout");
      t.Drop(sum);
    } else {
      x = Embedding(ids_, P("model.embed_tokens.weight"), h, "embed_tokens(input_ids)");
      // Rotary tables for this forward: cos and sin [1, s, head_dim] in the hidden dtype.
      t.SetScope("rotary embedding", -1);
      c.cos = t.Fresh({1, 1, s_, HeadDim(a_)}, t.TypeOf(x), "cos");
      c.sin = t.Fresh({1, 1, s_, HeadDim(a_)}, t.TypeOf(x), "sin");
    }
    if (t_.attention == AttentionImplementation::Eager) {
      t.SetScope("causal mask", -1);
      c.mask = t.Fresh({b_, 1, s_, s_}, t.TypeOf(x), "causal mask (b, 1, s, s)");
    }
    for (int i = 0; i < static_cast<int>(a_.numLayers); ++i) {
      const ValueId y = Block(x, c, i);
      t.Drop(x);
      x = y;
    }
    t.SetScope("final norm", -1);
    const ValueId normed = a_.family == Family::GPT2 ? LayerNorm(x, "transformer.ln_f") : RmsNorm(x, "model.norm");
    t.Drop(x);
    // The base model returns: its mask and rotary tables go.
    t.Drop(c.mask);
    t.Drop(c.cos);
    t.Drop(c.sin);
    t.SetScope("lm_head", -1);
    const std::string head = index_.count("lm_head.weight") ? "lm_head.weight"
                             : a_.family == Family::GPT2   ? "transformer.wte.weight"
                                                           : "model.embed_tokens.weight";
    const ValueId logits = Linear(normed, P(head), kNoValue, a_.vocabSize, "logits");
    t.Drop(normed);
    return logits;
  }

  ValueId EncoderForward() {
    Tape& t = *tape_;
    const std::int64_t h = a_.hiddenSize;
    Context c;
    t.SetScope("embeddings", -1);
    const ValueId words = Embedding(ids_, P("bert.embeddings.word_embeddings.weight"), h, "word_embeddings");
    const ValueId types = Embedding(tokenTypes_, P("bert.embeddings.token_type_embeddings.weight"), h, "token_type_embeddings");
    const ValueId sum = Add(words, types, "words + token types");
    t.Drop(words);
    t.Drop(types);
    const ValueId positions = t.Fresh({1, s_}, DType::Int64, "position_ids");
    const ValueId pos = Embedding(positions, P("bert.embeddings.position_embeddings.weight"), h, "position_embeddings");
    t.Drop(positions);
    const ValueId sum2 = Add(sum, pos, "+ positions");
    t.Drop(sum);
    t.Drop(pos);
    const ValueId normed = LayerNorm(sum2, "bert.embeddings.LayerNorm");
    t.Drop(sum2);
    ValueId x = Dropout(normed, a_.hiddenDropout, "embedding dropout");
    t.Drop(normed);
    if (t_.attention == AttentionImplementation::Eager) {
      t.SetScope("attention mask", -1);
      c.mask = t.Fresh({b_, 1, 1, s_}, t.TypeOf(x), "extended attention mask (b, 1, 1, s)");
    }
    for (int i = 0; i < static_cast<int>(a_.numLayers); ++i) {
      const ValueId y = Block(x, c, i);
      t.Drop(x);
      x = y;
    }
    t.Drop(c.mask);
    ValueId logits = kNoValue;
    if (a_.encoderHead == EncoderHead::Classification) {
      t.SetScope("pooler", -1);
      const ValueId first = t.Apply({.name = "hidden_states[:, 0]", .inputs = {{x}}, .shape = {b_, h},
                                     .type = t.TypeOf(x), .viewOf = x});
      const ValueId dense = Linear(first, "bert.pooler.dense", h, "pooler dense");
      t.Drop(first);
      const ValueId pooled = SavesOutput(dense, "pooler tanh", t.TypeOf(dense));
      t.Drop(dense);
      t.Drop(x);  // the model returns the pooled output; the sequence output goes
      t.SetScope("classifier", -1);
      const ValueId dropped = Dropout(pooled, a_.hiddenDropout, "classifier dropout");
      t.Drop(pooled);
      logits = Linear(dropped, "classifier", a_.numLabels, "logits");
      t.Drop(dropped);
    } else {
      t.SetScope("mlm head", -1);
      const ValueId dense = Linear(x, "cls.predictions.transform.dense", h, "transform dense");
      t.Drop(x);
      const ValueId act = Activation(dense, "transform activation");
      t.Drop(dense);
      const ValueId normed2 = LayerNorm(act, "cls.predictions.transform.LayerNorm");
      t.Drop(act);
      logits = Linear(normed2, P("bert.embeddings.word_embeddings.weight"), P("cls.predictions.bias"),
                      a_.vocabSize, "logits");
      t.Drop(normed2);
    }
    return logits;
  }

  // Cross-entropy = log_softmax (saves its output) + nll_loss (saves target, total_weight).
  // Causal LMs (HF's ForCausalLMLoss) upcast the logits to fp32 and shift the labels by
  // padding; BERT's heads call CrossEntropyLoss on the logits as they are (autocast runs it
  // in fp32).
  ValueId Loss(ValueId logits) {
    Tape& t = *tape_;
    t.SetScope("loss", -1);
    const bool causal = a_.family != Family::BERT;
    const ValueId input = causal || t.autocast() ? To(logits, DType::FP32) : t.Keep(logits);
    ValueId target = t.Keep(labels_);
    if (causal) {
      const ValueId padded = t.Fresh({b_, s_ + 1}, DType::Int64, "labels padded with -100");
      t.Drop(target);
      target = t.Fresh({b_, s_}, DType::Int64, "shift_labels (contiguous)");
      t.Drop(padded);
    }
    const ValueId logProbs = SavesOutput(input, "log_softmax", t.TypeOf(input));
    t.Drop(input);
    ValueId loss = t.Apply({.name = "nll_loss", .inputs = {{logProbs}, {target, In::NoGrad}}, .shape = {1},
                            .type = t.TypeOf(logProbs), .saves = {target},
                            .saveNew = {{{1}, t.TypeOf(logProbs), "total_weight"}}});
    t.Drop(logProbs);
    t.Drop(target);
    if (t_.precision == Precision::AmpFP16) {
      // GradScaler.scale(loss): backward starts from the scaled loss.
      const ValueId scaled = Scale(loss, "loss × scale (GradScaler)");
      t.Drop(loss);
      loss = scaled;
    }
    return loss;
  }

  const ArchitectureDef& a_;
  const TrainingDef& t_;
  const Inventory& inventory_;
  Regime regime_;
  std::int64_t b_, s_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, ValueId> parameters_;
  std::unique_ptr<Tape> tape_;
  std::vector<TensorHandle> batch_;
  ValueId ids_ = kNoValue, labels_ = kNoValue, tokenTypes_ = kNoValue, loss_ = kNoValue;
};

}  // namespace

std::unique_ptr<ModelPass> MakeTransformerPass(const Setup& setup, const Inventory& inventory,
                                               const Regime& regime, std::vector<std::string>& notes) {
  const ArchitectureDef& a = setup.model.architecture;
  if (a.numExperts > 0) {
    notes.push_back("Mixture of experts: tokens are taken as routed evenly (each expert gets b·s·k/E "
                    "of them); all expert weights are held. Saved activations depend only on the "
                    "total b·s·k, so imbalance changes the transients, not the saved total.");
  }
  if (setup.training.attention == AttentionImplementation::SDPA) {
    notes.push_back("Fused attention (SDPA): the kernel keeps its output and an fp32 log-sum-exp per "
                    "row; its backward holds an fp32 dq accumulator (FlashAttention-2).");
  }
  if (setup.training.precision == Precision::AmpFP16) {
    notes.push_back("fp16 autocast with GradScaler: the loss is scaled before backward and the "
                    "gradients are unscaled in place before the step (only scalars are added).");
  }
  return std::make_unique<TransformerPass>(setup, inventory, regime);
}

}  // namespace gpumem
