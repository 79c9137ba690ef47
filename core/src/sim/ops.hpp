// The primitive ops of a forward pass, each with what autograd saves for backward. Every block
// is written in these; a change in how an op behaves (a frozen weight, an adapter, a quantized
// or sharded weight) is made here once.
//
// What each op keeps for backward (PyTorch derivatives.yaml, CUDA kernels):
//   linear / matmul: both operands (under autocast: their 16-bit copies)
//   softmax: its output (and its input before PyTorch 1.11)        gelu, silu, pow: their input        tanh, sigmoid, rsqrt: output
//   mul: each operand only if the other needs a gradient        add, scalar mul, views: nothing
//   dropout (0 < p < 1): a 1-byte mask        layer_norm: input, mean and rstd (fp32)
//   embedding: the ids        log_softmax: as softmax        nll_loss: target and total_weight
//   index (x[idx]): the indices        index_add_: the indices and its source
// Autocast (CUDA lists): linear and matmul cast their inputs to 16-bit (weights once per
// forward, cached); layer_norm, softmax, log_softmax and the loss run in fp32; elementwise
// ops promote.
#pragma once

#include "sim/tape.hpp"

namespace gpumem::ops {

// The scratch a CUDA sum of a [rows, outputs] gradient over its rows allocates (sim/reduction.hpp):
// autograd's sum_to of a bias's or a broadcast weight's gradient, Megatron's grad_output.sum(0).
// Added to `spec` as temporaries made after the node's gradients and freed at once.
void SumToScratch(Tape& t, Tape::OpSpec& spec, std::int64_t rows, std::int64_t outputs, DType type);

// x @ Wᵀ + b (bias may be kNoValue); the output's last dimension is `out`.
ValueId Linear(Tape& t, ValueId x, ValueId weight, ValueId bias, std::int64_t out, TextPart name);
// a @ b with the given output shape.
ValueId MatMul(Tape& t, ValueId a, ValueId b, Shape shape, TextPart name);
// A view of x (no allocation; the gradient passes through).
ValueId View(Tape& t, ValueId x, Shape shape, TextPart name);
// A copy into a new tensor that saves nothing: .contiguous(), repeat_kv's reshape.
ValueId Copy(Tape& t, ValueId x, Shape shape, TextPart name, In::Rule rule = In::PassThrough);
// x.to(type): x itself (one more reference) when it already has that type.
ValueId To(Tape& t, ValueId x, DType type);
// a + b (broadcast to the larger); the gradient passes to both.
ValueId Add(Tape& t, ValueId a, ValueId b, TextPart name);
// a + constant (a mask, or a Python scalar when constant is kNoValue): the gradient goes to a.
ValueId AddConstant(Tape& t, ValueId a, ValueId constant, TextPart name);
// a * Python float.
ValueId Scale(Tape& t, ValueId a, TextPart name);
// a * b: each operand is saved only if the other needs a gradient. A broadcast operand's gradient
// is made full-size (grad * other) and summed down to its shape, with a CUDA sum's scratch when it
// was broadcast over leading dimensions (RMSNorm's weight).
ValueId Mul(Tape& t, ValueId a, ValueId b, TextPart name);
// Element-wise ops that keep their input (gelu, silu) or their output (tanh, sigmoid, softmax).
ValueId SavesInput(Tape& t, ValueId x, TextPart name);
ValueId SavesOutput(Tape& t, ValueId x, TextPart name, DType type);
// softmax / log_softmax in `type`: the output is saved, and before PyTorch 1.11 the input too
// (derivatives.yaml `_softmax_backward_data(grad, result, dim, self)`; PR #65242 replaced `self`
// with its dtype). Tape::softmaxSavesInput says which.
ValueId Softmax(Tape& t, ValueId x, TextPart name, DType type);
// F.dropout: with p = 0 the input itself; else a 1-byte mask is saved.
ValueId Dropout(Tape& t, ValueId x, double p, TextPart name);
// native_layer_norm on x (already in its compute dtype): saves x, mean and rstd (fp32).
ValueId LayerNorm(Tape& t, ValueId x, ValueId weight, ValueId bias, TextPart name);
// weight[ids]: saves the ids; the output's last dimension is `width`.
ValueId Embedding(Tape& t, ValueId ids, ValueId weight, std::int64_t width, TextPart name);
// Whether v takes part in autograd right now (recording, and it needs a gradient).
bool Grad(const Tape& t, ValueId v);

}  // namespace gpumem::ops
