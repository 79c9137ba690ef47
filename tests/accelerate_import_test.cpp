// accelerate's FSDP config import (docs/parallel.md, "Imports"): the YAML subset, the FSDP keys,
// what is listed and what is refused.
#include <catch2/catch.hpp>

#include <string>

#include "gpumem/json.hpp"
#include "gpumem/parallel.hpp"
#include "test_support.hpp"

using namespace gpumem;
using namespace gpumem::test;

namespace {
// As `accelerate config` writes it (accelerate 0.3x, FSDP on one machine with two GPUs).
const char* kFsdpConfig = R"(compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)";

bool Listed(const ParallelImport& r, const std::string& key) {
  for (const std::string& k : r.ignoredFields) {
    if (k == key) return true;
  }
  return false;
}
}  // namespace

TEST_CASE("Accelerate: an FSDP config as accelerate writes it", "[accelerate]") {
  const ParallelImport r = ImportAccelerateConfig(kFsdpConfig, DefaultSetup());
  REQUIRE(r.ok());
  CHECK(r.setup.parallel.fsdp == FsdpMode::FullShard);
  CHECK(r.setup.parallel.dataParallel == 2);
  CHECK(r.setup.training.precision == Precision::BF16Mixed);
  CHECK(r.setup.parallel.backwardPrefetch);
  CHECK_FALSE(r.setup.parallel.forwardPrefetch);
  CHECK(r.setup.parallel.offload == OffloadKind::None);
  CHECK(Listed(r, "fsdp_config.fsdp_use_orig_params"));
  CHECK(Listed(r, "fsdp_config.fsdp_state_dict_type"));
  CHECK(Listed(r, "compute_environment"));
  CHECK(Listed(r, "tpu_env"));
  CHECK(Validate(r.setup).empty());
}

TEST_CASE("Accelerate: sharding strategies by name and by number and FSDP2", "[accelerate]") {
  auto with = [](const std::string& body) {
    return ImportAccelerateConfig("distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n" + body, DefaultSetup());
  };
  CHECK(with("  fsdp_sharding_strategy: 2\n").setup.parallel.fsdp == FsdpMode::ShardGradOp);
  CHECK(with("  fsdp_sharding_strategy: HYBRID_SHARD\n").setup.parallel.fsdp == FsdpMode::HybridShard);
  CHECK(with("  fsdp_sharding_strategy: 1  # full\n").setup.parallel.fsdp == FsdpMode::FullShard);
  CHECK(with("  fsdp_sharding_strategy: NO_SHARD\n").setup.parallel.fsdp == FsdpMode::Off);
  CHECK(HasErrorOn(with("  fsdp_sharding_strategy: 5\n").errors, "fsdp_config.fsdp_sharding_strategy"));
  CHECK(HasErrorOn(with("  fsdp_sharding_strategy: HALF\n").errors, "fsdp_config.fsdp_sharding_strategy"));
  // Newer accelerate writes the FSDP1 strategy under fsdp_reshard_after_forward.
  CHECK(with("  fsdp_reshard_after_forward: SHARD_GRAD_OP\n").setup.parallel.fsdp == FsdpMode::ShardGradOp);
  const ParallelImport v2 = with("  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n  fsdp_offload_params: true\n");
  REQUIRE(v2.ok());
  CHECK(v2.setup.parallel.fsdp == FsdpMode::FullyShard);
  CHECK_FALSE(v2.setup.parallel.reshardAfterForward);
  CHECK(v2.setup.parallel.offload == OffloadKind::OptimizerAndParameters);
  CHECK(with("  fsdp_activation_checkpointing: true\n").setup.training.checkpointing == Checkpointing::EveryBlock);
  // accelerate wraps each block in checkpoint_wrapper(checkpoint_impl=CheckpointImpl.NO_REENTRANT).
  CHECK_FALSE(with("  fsdp_activation_checkpointing: true\n").setup.training.useReentrant);
  CHECK(with("  fsdp_activation_checkpointing: false\n").setup.training.useReentrant);
  CHECK(HasErrorOn(with("  fsdp_offload_params: maybe\n").errors, "fsdp_config.fsdp_offload_params"));
  CHECK(HasErrorOn(with("  fsdp_version: 3\n").errors, "fsdp_config.fsdp_version"));
}

TEST_CASE("Accelerate: top-level values and what is refused", "[accelerate]") {
  const Setup base = DefaultSetup();
  CHECK(ImportAccelerateConfig("mixed_precision: 'no'\n", base).setup.training.precision == Precision::FP32);
  CHECK(ImportAccelerateConfig("mixed_precision: fp16\n", base).setup.training.precision == Precision::FP16Mixed);
  CHECK(HasErrorOn(ImportAccelerateConfig("mixed_precision: fp8\n", base).errors, "mixed_precision"));
  for (const char* n : {"num_processes: 0\n", "num_processes: -2\n", "num_processes: two\n", "num_processes: 2000000\n"}) {
    CHECK(HasErrorOn(ImportAccelerateConfig(n, base).errors, "num_processes"));
  }
  const ParallelImport ddp = ImportAccelerateConfig("distributed_type: MULTI_GPU\nnum_processes: 4\n", base);
  CHECK(ddp.setup.parallel.fsdp == FsdpMode::Off);
  CHECK(ddp.setup.parallel.dataParallel == 4);
  CHECK(HasErrorOn(ImportAccelerateConfig("distributed_type: DEEPSPEED\n", base).errors, "distributed_type"));
  // Outside the YAML subset: refused with the line.
  CHECK_FALSE(ImportAccelerateConfig("a:\n  - 1\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("a:\n  b:\n    c: 1\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("a: [1, 2]\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("a: |\n  text\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("a: &x 1\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("\tb: 1\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("  b: 1\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("just text\n", base).ok());
  CHECK_FALSE(ImportAccelerateConfig("a: 'open\n", base).ok());
  CHECK(HasErrorOn(ImportAccelerateConfig("ok: 1\nx: [1]\n", base).errors, "line 2"));
  CHECK_FALSE(ImportAccelerateConfig(std::string(70'000, '#'), base).ok());
  // Empty text and comments only: nothing changes.
  CHECK(ImportAccelerateConfig("# nothing\n\n---\n", base).setup.parallel.fsdp == FsdpMode::FullShard);
}

TEST_CASE("Accelerate: the import as JSON", "[accelerate]") {
  const std::string out = ImportAccelerateJson(kFsdpConfig, R"({"model":{"preset":"gpt2"}})");
  CHECK(out.find("\"ok\":true") != std::string::npos);
  CHECK(out.find("\"fsdp\":\"FULL_SHARD\"") != std::string::npos);
  CHECK(ImportAccelerateJson("a: [1]").find("\"ok\":false") != std::string::npos);
}

TEST_CASE("Accelerate: random text never breaks the YAML reader", "[accelerate]") {
  // Lines built from YAML's significant characters: every input gets a result or an error.
  const std::string alphabet = "ab_:- '\"#[]{}|>&*!\n\t 12fsdp_config";
  std::uint64_t x = 88172645463325252ULL;  // xorshift64
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    const std::size_t length = next() % 120;
    for (std::size_t j = 0; j < length; ++j) text += alphabet[next() % alphabet.size()];
    const ParallelImport r = ImportAccelerateConfig(text, DefaultSetup());
    if (!r.ok()) {
      ++refused;
      for (const FieldError& e : r.errors) CHECK_FALSE(e.message.empty());
    }
  }
  CHECK(refused > 0);
}
