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
