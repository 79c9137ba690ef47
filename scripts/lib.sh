# Shared steps of the README's commands: install what is missing, build native and wasm,
# assemble the page. Sourced by scripts/build, scripts/serve and scripts/test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
# Debian's emscripten needs node's bundled modules (acorn) on NODE_PATH at -O1 and above.
export NODE_PATH="/usr/share/nodejs${NODE_PATH:+:$NODE_PATH}"

log() { printf '\n==> %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build and the tests need; only the missing ones are installed.
APT_PACKAGES=(g++ cmake make catch2 emscripten nlohmann-json3-dev chromium python3)

ensure_system_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    log "Installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

ensure_node_modules() {
  if [ ! -d "$ROOT/node_modules/playwright-core" ]; then
    log "Installing npm packages (npm ci)"
    (cd "$ROOT" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

build_native() {
  log "Native build (core, CLI, Catch2 tests)"
  cmake -S "$ROOT" -B "$ROOT/build/native" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$ROOT/build/native" -j "$JOBS"
}

build_wasm() {
  log "WebAssembly build (module for the page, Catch2 suite for node)"
  # emcmake's default emulator flag --experimental-wasm-threads is refused by node 20.
  emcmake cmake -S "$ROOT" -B "$ROOT/build/wasm" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CROSSCOMPILING_EMULATOR="$(command -v node)" >/dev/null
  cmake --build "$ROOT/build/wasm" -j "$JOBS"
}

assemble_web() {
  log "Assembling the page (build/web) and the single-file page (dist/gpumem.html)"
  node "$ROOT/scripts/assemble-web.mjs"
}

# --- Hardening: the sanitizer build and the fuzz targets (scripts/test's last two suites) ---

# clang with libFuzzer and the sanitizer runtimes. On bookworm the runtimes
# (libclang_rt.fuzzer, .asan, .ubsan) are in libclang-rt-14-dev, only a recommendation of clang.
FUZZ_APT_PACKAGES=(clang libclang-rt-14-dev)
# Seconds each fuzz target runs in scripts/test.
GPUMEM_FUZZ_SECONDS="${GPUMEM_FUZZ_SECONDS:-60}"
FUZZ_TARGETS=(fuzz_estimate_json fuzz_import_config_json fuzz_import_safetensors_json
              fuzz_import_safetensors_with_setup_json fuzz_solve_json fuzz_snapshot fuzz_measure_script_json)

ensure_fuzz_packages() {
  local missing=()
  for p in "${FUZZ_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "Installing Debian packages for the sanitizer and fuzz builds: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# build/asan: clang, -fsanitize=address,undefined on everything (asserts kept), the Catch2 suite,
# the CLI and the libFuzzer targets (GPUMEM_SANITIZE, GPUMEM_FUZZ in cmake/Hardening.cmake).
build_sanitized() {
  ensure_fuzz_packages || return 1
  log "Sanitizer build (build/asan: clang, ASan + UBSan, Catch2 suite and fuzz targets)"
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$ROOT/build/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGPUMEM_SANITIZE=ON -DGPUMEM_FUZZ=ON >/dev/null || return 1
  cmake --build "$ROOT/build/asan" -j "$JOBS" --target gpumem gpumem_tests "${FUZZ_TARGETS[@]}" || return 1
}

# The native Catch2 suite and the CLI tests under ASan + UBSan; any report aborts the test.
# The golden test (8,224 estimates, ~3 minutes natively) is excluded: under the sanitizers it
# takes several times longer, past the test command's time budget; it runs in catch2-native.
run_sanitizer_suite() {
  build_sanitized || return 1
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir "$ROOT/build/asan" --no-tests=error --output-on-failure -j "$JOBS" -E "^Golden estimates"
}

# One fuzz target for GPUMEM_FUZZ_SECONDS from a copy of its committed corpus (the committed one
# is never written). Fails on a crash, a leak, a timeout (10 s per input), memory over 2 GiB or a
# sanitizer report; prints the executions. SolveJson runs dozens of estimates per input: its
# inputs are kept to 1 KiB so it still gets many executions.
run_fuzz_target() {
  local target="$1"
  local work="$ROOT/build/asan/fuzz-run/$target"
  local max_len=4096
  [ "$target" = fuzz_solve_json ] && max_len=1024
  local dict="$ROOT/tests/fuzz/gpumem.dict"
  [ "$target" = fuzz_snapshot ] && dict="$ROOT/tests/fuzz/snapshot.dict"  # pickle opcodes and keys
  rm -rf "$work" && mkdir -p "$work/corpus" || return 1
  cp "$ROOT/tests/fuzz/corpus/$target/"* "$work/corpus/" || return 1
  local status=0
  "$ROOT/build/asan/tests/fuzz/$target" -max_total_time="$GPUMEM_FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$max_len" -dict="$dict" -artifact_prefix="$work/" -print_final_stats=1 \
    "$work/corpus" >"$work/log" 2>&1 || status=$?
  local executions
  executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")"
  if [ "$status" -ne 0 ]; then
    echo "FAIL $target (exit $status) after ${executions:-?} executions; log: $work/log"
    grep -E "ERROR|SUMMARY|Test unit written|envelope broken|runtime error" "$work/log" | head -20
    return 1
  fi
  printf 'ok   %-42s %10s executions in %s s\n' "$target" "$executions" "$GPUMEM_FUZZ_SECONDS"
}

# Every fuzz target, JOBS at a time; fails if any one does (each leaves its verdict in a file:
# the exit statuses of jobs reaped by `wait -n` are not reliably there for a later `wait PID`).
run_fuzz_suite() {
  build_sanitized || return 1
  log "Fuzzing each target for $GPUMEM_FUZZ_SECONDS s (GPUMEM_FUZZ_SECONDS)"
  local verdicts="$ROOT/build/asan/fuzz-run/verdicts"
  rm -rf "$verdicts" && mkdir -p "$verdicts" || return 1
  for target in "${FUZZ_TARGETS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    ( if run_fuzz_target "$target"; then touch "$verdicts/$target.ok"; fi ) &
  done
  wait
  local failed=0
  for target in "${FUZZ_TARGETS[@]}"; do [ -e "$verdicts/$target.ok" ] || failed=1; done
  [ "$failed" -eq 0 ]
}
