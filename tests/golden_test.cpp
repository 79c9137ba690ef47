// Every golden estimate recomputed and compared byte for byte (see golden.hpp).
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "golden.hpp"

#ifndef GPUMEM_TEST_DATA
#define GPUMEM_TEST_DATA "tests/data"
#endif

TEST_CASE("Golden estimates: every line recomputed byte for byte", "[golden]") {
  std::ifstream in(GPUMEM_TEST_DATA "/golden-estimates.jsonl");
  REQUIRE(in.good());
  const std::vector<std::string> setups = gpumem::golden::Setups();
  std::string line;
  std::size_t n = 0, mismatches = 0;
  while (std::getline(in, line)) {
    REQUIRE(n < setups.size());
    const std::string now = gpumem::golden::Line(setups[n]);
    if (now != line && ++mismatches <= 5) {
      INFO("golden: " << line);
      INFO("now:    " << now);
      CHECK(now == line);
    }
    ++n;
  }
  CHECK(mismatches == 0);
  CHECK(n == setups.size());
  CHECK(n > 8000);
}
