// Keeps the large buffers of one estimate for the next, per thread. An estimate fills a few
// megabytes of vectors (events, text parts, the tape's values and nodes); freeing them and
// asking again made every estimate pay the operating system's page faults (a 405B estimate
// went from 2.7 ms to 20 ms natively when its reservations grew). Recycled buffers keep their
// capacity; their contents are cleared.
#pragma once

#include <utility>
#include <vector>

// Per-thread storage of the kept buffers. A wasm module built without threads has one thread,
// and wasm-ld refuses thread-local storage without the 'atomics' feature once bulk memory is on
// (the top-level CMakeLists.txt enables it: memcpy and memmove become memory.copy): there it is
// static.
#if defined(__EMSCRIPTEN__) && !defined(__EMSCRIPTEN_PTHREADS__)
#define GPUMEM_THREAD_LOCAL static
#else
#define GPUMEM_THREAD_LOCAL thread_local
#endif

namespace gpumem {

// `Tag` tells apart two buffers of the same element type (an estimate's alloc and free indices).
template <typename T, typename Tag = void>
class Recycled {
 public:
  // A cleared vector, with the capacity of the largest one given back on this thread.
  static std::vector<T> Take() {
    std::vector<T> v = std::move(Spare());
    Spare() = std::vector<T>();
    v.clear();
    return v;
  }
  // Keeps `v` for the next Take when it is larger than what is kept.
  static void Give(std::vector<T>&& v) {
    if (v.capacity() > Spare().capacity()) Spare() = std::move(v);
  }

 private:
  static std::vector<T>& Spare() {
    GPUMEM_THREAD_LOCAL std::vector<T> spare;
    return spare;
  }
};

}  // namespace gpumem
