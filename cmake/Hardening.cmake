# Hardening builds: the whole project under AddressSanitizer + UndefinedBehaviorSanitizer, and the
# libFuzzer targets of tests/fuzz. Both are for a build folder of their own (scripts/test uses
# build/asan with clang and both options); a normal build is unaffected.
#
#   CC=clang CXX=clang++ cmake -S . -B build/asan -DGPUMEM_SANITIZE=ON -DGPUMEM_FUZZ=ON
#
# Sources: https://clang.llvm.org/docs/AddressSanitizer.html,
# https://clang.llvm.org/docs/UndefinedBehaviorSanitizer.html, https://llvm.org/docs/LibFuzzer.html
option(GPUMEM_SANITIZE "Build everything with -fsanitize=address,undefined (any report aborts)" OFF)
option(GPUMEM_FUZZ "Also build the libFuzzer targets of tests/fuzz (clang only; implies GPUMEM_SANITIZE)" OFF)

if(GPUMEM_FUZZ AND NOT GPUMEM_SANITIZE)
  set(GPUMEM_SANITIZE ON CACHE BOOL "" FORCE)
endif()
if(GPUMEM_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "GPUMEM_FUZZ needs clang with libFuzzer (CXX=clang++; Debian: clang, libclang-rt-14-dev)")
endif()

if(GPUMEM_SANITIZE)
  # -fno-sanitize-recover=all: every UBSan report aborts, so a test or a fuzz run fails on it
  # instead of printing a line nobody reads.
  set(GPUMEM_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(${GPUMEM_SANITIZER_FLAGS})
  add_link_options(${GPUMEM_SANITIZER_FLAGS})
  # Keep assert() on: nlohmann-json guards misuse (operator[] on a const object with a missing
  # key, iterator misuse) with JSON_ASSERT, which NDEBUG would silence.
  foreach(config RELEASE RELWITHDEBINFO MINSIZEREL)
    string(REPLACE "-DNDEBUG" "" CMAKE_CXX_FLAGS_${config} "${CMAKE_CXX_FLAGS_${config}}")
  endforeach()
endif()

# Called after core/ is added: the core gets libFuzzer's coverage instrumentation (only the code
# under test is instrumented; the fuzz drivers themselves link -fsanitize=fuzzer). The Catch2
# suite in the same folder links that core too: the sanitizer runtime provides weak no-op
# definitions of the coverage hooks, so it runs as a plain ASan+UBSan program.
function(gpumem_enable_fuzzing)
  if(GPUMEM_FUZZ)
    target_compile_options(gpumem_core PRIVATE -fsanitize=fuzzer-no-link)
    add_subdirectory(tests/fuzz)
  endif()
endfunction()
