// Expert parallelism: the global -> local expert id map that lets one rank's engine permute and compute
// only its own experts (src/engine/expert_shard.h).
//
// local_ids_kernel: one thread per (token, rank) pair i < pairs, 256 threads per block, no shared memory.
// Reads the global id ids[i] (written by routing, kept unchanged for ForwardOutputs) and writes
// local_ids[i] = ids[i] - first for a held expert, else `count`, the dropped bucket: the permutation then
// groups the pairs over count + 1 experts, so offsets[count] is where the dropped rows begin, the grouped
// GEMMs run over the first `count` experts only (they never touch rows past their last offset), and
// finalize skips pairs whose row is >= offsets[count].
#include <cuda_runtime.h>

#include "engine/cuda_check.h"
#include "engine/engine_kernels.h"

namespace fp4moe::engine {

namespace {

constexpr int kLocalIdThreads = 256;

__global__ void __launch_bounds__(kLocalIdThreads)
    local_ids_kernel(const int32_t* __restrict__ ids, int pairs, int first, int count, int32_t* __restrict__ local_ids) {
  const int i = blockIdx.x * kLocalIdThreads + threadIdx.x;
  if (i >= pairs) return;
  // One unsigned compare covers both ends: ids below `first` wrap to large values.
  const unsigned local = static_cast<unsigned>(ids[i] - first);
  local_ids[i] = local < static_cast<unsigned>(count) ? static_cast<int32_t>(local) : count;
}

}  // namespace

Status launch_local_expert_ids(const int32_t* ids, int64_t pairs, int64_t first, int64_t count, int32_t* local_ids,
                               Stream stream) {
  if (pairs == 0) return Status::ok();
  if (pairs > (int64_t{1} << 30) || first < 0 || count < 1 || first + count > (int64_t{1} << 30))
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("local expert ids: pairs = {}, first = {}, count = {} out of range", pairs, first, count));
  const unsigned blocks = static_cast<unsigned>((pairs + kLocalIdThreads - 1) / kLocalIdThreads);
  local_ids_kernel<<<blocks, kLocalIdThreads, 0, stream>>>(ids, static_cast<int>(pairs), static_cast<int>(first),
                                                           static_cast<int>(count), local_ids);
  return cuda_launch_status("local_ids_kernel launch", __FILE__, __LINE__);
}

}  // namespace fp4moe::engine
