// The native side of scripts/bench.mjs: the same setups through EstimateJson (the text the wasm
// module returns, without a timeline) and SolveJson, median and 95th percentile per call, and
// the fastest call (on a machine shared with other work, the figure least disturbed by it).
// Usage: build/native/tests/gpumem_bench [runs] [only cases whose name contains this]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpumem/json.hpp"

namespace {

double Millis(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 50;
  const std::pair<const char*, const char*> cases[] = {
      {"GPT-2, 1 x 1024", R"({"model":{"preset":"gpt2"},"training":{"batchSize":1,"sequenceLength":1024}})"},
      {"Llama 2 7B, 1 x 4096, sdpa",
       R"({"model":{"preset":"llama-2-7b"},"training":{"batchSize":1,"sequenceLength":4096,"attention":"sdpa"}})"},
      {"Llama 3 8B, 1 x 8192, ckpt",
       R"({"model":{"preset":"llama-3-8b"},"training":{"batchSize":1,"sequenceLength":8192,"attention":"sdpa","checkpointing":"everyBlock","precision":"ampBf16"}})"},
      {"Mixtral 8x7B, 1 x 4096",
       R"({"model":{"preset":"mixtral-8x7b"},"training":{"batchSize":1,"sequenceLength":4096,"attention":"sdpa","precision":"bf16Mixed"}})"},
      {"Llama 3.1 405B, 1 x 8192, ckpt",
       R"({"model":{"preset":"llama-3.1-405b"},"training":{"batchSize":1,"sequenceLength":8192,"attention":"sdpa","checkpointing":"everyBlock","precision":"bf16Mixed"}})"},
  };
  const gpumem::EstimateOptions none{.timeline = gpumem::EstimateOptions::Timeline::None};
  std::printf("%-34s %9s %9s %9s\n", "estimate (native)", "median", "p95", "min");
  const std::string only = argc > 2 ? argv[2] : "";
  for (const auto& [name, setup] : cases) {
    if (!only.empty() && std::string(name).find(only) == std::string::npos) continue;
    std::vector<double> times;
    for (int i = 0; i < runs + 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string out = gpumem::EstimateJson(setup, -1, none);
      const auto t1 = std::chrono::steady_clock::now();
      if (out.rfind("{\"ok\":true", 0) != 0) {
        std::printf("%s: %s\n", name, out.substr(0, 300).c_str());
        return 1;
      }
      if (i >= 3) times.push_back(Millis(t1 - t0));
    }
    std::sort(times.begin(), times.end());
    std::printf("%-34s %6.3f ms %6.3f ms %6.3f ms\n", name, times[times.size() / 2], times[times.size() * 95 / 100],
                times.front());
  }
  // The solves of scripts/bench.mjs; fastest of 3.
  const std::pair<const char*, const char*> solves[] = {
      {"GPT-2, 8 x 1024 on 24 GiB",
       R"({"model":{"preset":"gpt2"},"training":{"batchSize":8,"sequenceLength":1024},"gpu":{"memoryGiB":24}})"},
      {"Llama 2 7B, 1 x 4096 on 80 GiB",
       R"({"model":{"preset":"llama-2-7b"},"training":{"batchSize":1,"sequenceLength":4096,"attention":"sdpa"}})"},
      {"Llama 3.1 405B, 1 x 8192",
       R"({"model":{"preset":"llama-3.1-405b"},"training":{"batchSize":1,"sequenceLength":8192,"attention":"sdpa"}})"},
      {"Mixtral 8x22B, 1 x 8192",
       R"({"model":{"preset":"mixtral-8x22b"},"training":{"batchSize":1,"sequenceLength":8192,"attention":"sdpa"}})"},
  };
  for (const auto& [name, setup] : solves) {
    if (!only.empty()) break;
    double best = 1e300;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string out = gpumem::SolveJson(setup);
      best = std::min(best, Millis(std::chrono::steady_clock::now() - t0));
      (void)out;
    }
    std::printf("solve: %-32s %6.1f ms\n", name, best);
  }
  return 0;
}
