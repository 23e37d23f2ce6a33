// The SM clock the card is running at, measured on the card: one warp spins on %globaltimer for a
// window and counts clock64 cycles meanwhile. nvidia-smi's clocks.sm reads the clock the card asks for,
// sampled every few milliseconds; this reads the cycles an SM actually saw, in the stream, where a
// benchmark needs it (docs/perf.md, sm90 step 60: a T = 1 forward right after the engine's set-up runs
// at a lower clock than the same forward after some milliseconds of steady load).
#pragma once
#include <cstdint>

#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe {

// Enqueues the probe on `stream`: one block of one warp; `slot` is device memory of two uint64_t that
// receive (SM cycles, nanoseconds) of a window of at least window_ns (1 us .. 10 ms). CUDA builds only;
// kInvalidArgument for a window out of range or a null slot, kCudaError naming the launch's failure.
Status enqueue_sm_clock_probe(Stream stream, int64_t window_ns, uint64_t* slot);

// MHz from a slot copied back to the host (0 when the window is empty).
inline double sm_clock_mhz(const uint64_t slot[2]) {
  return slot[1] == 0 ? 0.0 : 1e3 * static_cast<double>(slot[0]) / static_cast<double>(slot[1]);
}

}  // namespace fp4moe
