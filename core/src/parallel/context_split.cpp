// Transformer Engine's ring attention on the simulated rank (context_split.hpp states the rules).
#include "parallel/context_split.hpp"

namespace gpumem::context_split {

ValueId RingAttention(Model& m, ValueId q, ValueId k, ValueId v) {
  Tape& t = m.t;
  const std::int64_t c = m.contextShards, b = m.b, s = m.s, heads = m.a.numHeads, d = HeadDim(m.a);
  const std::int64_t kvHeads = KeyValueHeads(m.a);
  const ValueId q16 = t.ForMatmul(q);
  const ValueId k16 = t.ForMatmul(k);
  const ValueId v16 = t.ForMatmul(v);
  const DType type = t.TypeOf(q16);
  const std::int64_t qElements = b * heads * s * d;
  const std::int64_t kvElements = 2 * b * kvHeads * s * d;  // k and v of one chunk, concatenated
  const std::int64_t lseElements = b * heads * s;
  // The forward's lists, alive together when it returns: c − 1 k/v buffers besides the one it
  // saves (p2p_comm_buffers[0] is cat(k, v), then one received per step), c per-step outputs
  // and log-sum-exps, and the fp32 output before its cast.
  ValueId buffers = t.Fresh({(c - 1) * kvElements}, type, "ring attention: p2p_comm_buffers[:-1] (k/v chunks)");
  ValueId outs = t.Fresh({c * qElements}, type, "ring attention: out_per_step");
  ValueId lses = t.Fresh({c * lseElements}, DType::FP32, "ring attention: softmax_lse_per_step");
  ValueId out32 = t.Fresh({qElements}, DType::FP32, "ring attention: out (fp32, corrected)");
  const ValueId out = t.Apply({.name = "ring attention (AttnFuncWithCPAndKVP2P)",
                               .inputs = {{q16}, {k16}, {v16}},
                               .shape = {b, s, heads, d},
                               .type = type,
                               .saves = {q16},
                               .savesOutput = true,
                               .saveNew = {{{kvElements}, type, "kv = p2p_comm_buffers[-1]"},
                                           {{b, heads, s}, DType::FP32, "softmax_lse"}},
                               .backwardTemps = {{{2 * qElements}, type, "dq_buffer and one step's dq_"},
                                                 {{5 * kvElements}, type,
                                                  "p2p_comm_buffers 2 × (2, kv) and one step's dk_, dv_"}}});
  for (ValueId x : {buffers, outs, lses, out32}) t.Drop(x);
  t.Drop(q16);
  t.Drop(k16);
  t.Drop(v16);
  return out;
}

}  // namespace gpumem::context_split
