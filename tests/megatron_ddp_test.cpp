// Megatron's DistributedDataParallel without the distributed optimizer (parallel.gradReduceInFp32
// with zeroStage 0): one unpadded fp32 gradient buffer for the whole model
// (megatron/core/distributed/param_and_grad_buffer.py _compute_default_per_buffer_param_layout,
// _ParamAndGradBuffer), each bf16 .grad added into its main_grad view and let go
// (distributed_data_parallel.py _make_backward_post_hook), and Float16OptimizerWithFloat16Params
// (megatron/core/optimizer/optimizer.py): whole fp32 main params and Adam states, whose gradients
// are the buffer's fp32 views (_copy_model_grads_to_main_grads: main_grad.float(), no copy).
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/parallel.hpp"
#include "parallel/parallel_fidelity.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// The functional test gpt3_mcore_te_tp1_pp1_uniform_full_recompute: every block recomputed, DP 8.
Setup FullRecomputeRun() {
  Setup s = MegatronGpt12x512();
  s.training.checkpointing = Checkpointing::EveryBlock;
  s.parallel.dataParallel = 8;
  return s;
}

int CountAllocated(const Estimate& e, const std::string& label) {
  int n = 0;
  for (const TimelinePoint& p : e.timeline) n += p.deltaBytes > 0 && p.label.find(label) != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("Megatron DDP: the fp32 gradient buffer without the distributed optimizer pinned by hand", "[parallel][megatron-ddp]") {
  Setup s = FullRecomputeRun();
  s.parallel.gradReduceInFp32 = true;
  const Estimate e = MustEstimateLabelled(s);
  // Ψ by hand: wte 50,304·512 = 25,755,648; wpe 1,024·512 = 524,288; a block: two LayerNorms
  // 2·1,024, c_attn 512·1,536 + 1,536 = 787,968, attn c_proj 512·512 + 512 = 262,656, c_fc
  // 512·2,048 + 2,048 = 1,050,624, mlp c_proj 2,048·512 + 512 = 1,049,088: 3,152,384, × 12 =
  // 37,828,608; ln_f 1,024. Ψ = 64,109,568.
  const std::int64_t psi = 64'109'568;
  CHECK(e.modelStates.parameterCount == psi);
  CHECK(e.modelStates.parametersBytes == 128'219'136);    // 2Ψ bf16
  CHECK(e.modelStates.gradientsBytes == 256'438'272);     // 4Ψ: the fp32 buffer, no padding
  CHECK(e.modelStates.masterWeightsBytes == 256'438'272); // 4Ψ fp32 main params, whole
  CHECK(e.modelStates.optimizerStatesBytes == 512'876'544);  // 8Ψ Adam, whole
  CHECK(e.modelStates.totalBytes == 1'153'972'224);       // 18Ψ
  CHECK(MegatronGradBufferElements(BuildInventory(s), 8, false) == psi);
  // The buffer is made at construction; no torch DDP bucket exists; each bf16 .grad (here the
  // last MLP projection's weight, 2,048·512·2 B) lives for an instant.
  CHECK(FirstAllocBytes(e, "Megatron DDP init: fp32 gradient buffer") == 256'438'272);
  CHECK(FirstAllocBytes(e, "DDP init: reducer bucket") == -1);
  CHECK(FirstAllocBytes(e, "h.11.mlp.c_proj.weight.grad") == 2048LL * 512 * 2);

  // Against torch DDP with gradient_as_bucket_view (what the published row was read as before):
  // the gradients go from 2Ψ (bf16 bucket views) to 4Ψ; nothing else of the model states moves.
  Setup torchDdp = FullRecomputeRun();
  torchDdp.parallel.gradientAsBucketView = true;
  const Estimate ddp = MustEstimateLabelled(torchDdp);
  CHECK(ddp.modelStates.gradientsBytes == 128'219'136);
  CHECK(e.modelStates.totalBytes - ddp.modelStates.totalBytes == 2 * psi);
  CHECK(e.peak.totalBytes > ddp.peak.totalBytes);
}

TEST_CASE("Megatron DDP: the main params take fp32 views of the buffer and upcast nothing", "[parallel][megatron-ddp]") {
  // With a foreach Adam torch DDP's masters upcast every bf16 gradient to fp32 in the step;
  // Float16OptimizerWithFloat16Params hands Adam the buffer's fp32 views instead.
  Setup s = FullRecomputeRun();
  s.training.optimizerImplementation = OptimizerImplementation::ForEach;
  s.parallel.gradientAsBucketView = true;
  CHECK(StepAllocBytes(MustEstimateLabelled(s), "foreach: gradients upcast to fp32") == 64'109'568LL * 4);
  s.parallel.gradReduceInFp32 = true;
  const Estimate megatron = MustEstimateLabelled(s);
  CHECK(StepAllocBytes(megatron, "foreach: gradients upcast to fp32") == -1);
  CHECK(StepAllocBytes(megatron, "_foreach_sqrt(exp_avg_sq)") == 64'109'568LL * 4);
}

TEST_CASE("Megatron DDP: one GPU and tensor parallel alone keep the buffer", "[parallel][megatron-ddp]") {
  // Megatron wraps the model in its DDP whatever the data-parallel size.
  Setup s = FullRecomputeRun();
  s.parallel.dataParallel = 1;
  s.parallel.gradReduceInFp32 = true;
  const Estimate one = MustEstimateLabelled(s);
  CHECK(one.modelStates.gradientsBytes == 64'109'568LL * 4);
  CHECK(CountAllocated(one, "Megatron DDP init: fp32 gradient buffer") == 1);
  s.parallel.tensorParallel = 2;
  const Estimate tp = MustEstimateLabelled(s);
  const std::int64_t rank = tp.modelStates.parameterCount;
  CHECK(rank < 64'109'568);
  CHECK(tp.modelStates.gradientsBytes == rank * 4);
}

TEST_CASE("Megatron DDP: refused with the engines it is not", "[parallel][megatron-ddp]") {
  Setup s = FullRecomputeRun();
  s.parallel.gradReduceInFp32 = true;
  CHECK(EstimateMemory(s).ok());
  Setup z2 = s;
  z2.parallel.zeroStage = 2;
  CHECK(HasErrorOn(EstimateMemory(z2).errors, "parallel.gradReduceInFp32"));
  Setup fsdp = s;
  fsdp.parallel.fsdp = FsdpMode::FullShard;
  CHECK(HasErrorOn(EstimateMemory(fsdp).errors, "parallel.gradReduceInFp32"));
  Setup zro = s;
  zro.parallel.zeroRedundancyOptimizer = true;
  CHECK(HasErrorOn(EstimateMemory(zro).errors, "parallel.gradReduceInFp32"));
  Setup offload = s;
  offload.parallel.zeroStage = 1;
  offload.parallel.offload = OffloadKind::Optimizer;
  CHECK(HasErrorOn(EstimateMemory(offload).errors, "parallel.gradReduceInFp32"));
}

TEST_CASE("Megatron DDP: the import sets the buffer with --bf16 without the distributed optimizer", "[parallel][megatron-ddp]") {
  const Setup base = FullRecomputeRun();
  const ParallelImport r = ImportMegatronArguments("--bf16 --micro-batch-size 4 --seq-length 1024", base);
  REQUIRE(r.ok());
  CHECK(r.setup.parallel.gradReduceInFp32);
  CHECK(r.setup.parallel.zeroStage == 0);
  CHECK(EstimateMemory(r.setup).ok());
  CHECK_FALSE(ImportMegatronArguments("--fp16", base).setup.parallel.gradReduceInFp32);
  CHECK(ImportMegatronArguments("--fp16 --accumulate-allreduce-grads-in-fp32", base).setup.parallel.gradReduceInFp32);
}
