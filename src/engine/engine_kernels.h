// Host entry points of the engine's own kernels (routing, permutation, finalize, synthetic weights).
// Every launcher is asynchronous on `stream`, allocates nothing, and returns the launch error, if any,
// as a Status naming the kernel. Plain C++ header: no CUDA types.
#pragma once
#include <cstdint>

#include "fp4moe/config.h"
#include "fp4moe/status.h"
#include "fp4moe/tactic.h"

namespace fp4moe::engine {

// --- routing (routing.cu) ---------------------------------------------------------------------------
// logits [T, E] fp32 = x [T, H] (bf16) . router_weight [E, H]^T (fp32), fp32 accumulation (R2).
Status launch_router_logits(const uint16_t* x, const float* router_weight, int64_t tokens, int64_t hidden,
                            int64_t experts, float* logits, Stream stream);
// Top-k routing of cfg.routing (softmax top-k, or sigmoid grouped with the correction bias `bias`, which
// may be null) with the reference's semantics (src/reference/routing.cpp): ids [T, topk] best first,
// ties to the lower index; weights [T, topk] fp32.
Status launch_routing(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg, int32_t* ids,
                      float* weights, Stream stream);
// The same with the generic per-token kernel only (launch_routing takes a register fast path when the
// shape allows; tests compare the two).
Status launch_routing_generic(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg,
                              int32_t* ids, float* weights, Stream stream);
// Shared-memory opt-ins for very wide routers; once at engine creation (never inside a capture).
Status prepare_routing_kernels(const MoeConfig& cfg);

// --- permutation (permute.cu) -----------------------------------------------------------------------
// Groups the T*topk (token, rank) pairs by expert, stably (pair order inside an expert), so the result
// is deterministic. Buffers (device):
struct PermuteBuffers {
  int32_t* rank = nullptr;            // [pairs] rank of the pair among its chunk's pairs of the same expert
  int32_t* chunk_base = nullptr;      // [permute_chunks(pairs)][E] per-chunk counts, then row bases
  int32_t* offsets = nullptr;         // [E + 1] expert row offsets (the grouped GEMMs' expert_offsets)
  int32_t* gather = nullptr;          // [pairs (+ tokens appended)] token of each grouped row (FC1's a_row_index)
  int32_t* pair_pos = nullptr;        // [pairs] grouped row of pair t*topk + k (for finalize)
  int32_t* shared_offsets = nullptr;  // [2] or null: set to {0, T} for the shared expert's GEMMs
};
int64_t permute_chunks(int64_t pairs);  // chunks of 256 pairs
Status prepare_permute_kernels(int64_t experts);  // once at engine creation
// dst[0] = 0, dst[1] = tokens (the shared expert's offsets: one expert holding every row).
Status launch_write_offsets(int32_t* dst, int64_t tokens, Stream stream);
Status launch_permute(const int32_t* ids, int64_t tokens, int64_t topk, int64_t experts, const PermuteBuffers& b,
                      Stream stream);
// out[r, :] = x[gather[r], :] for r < rows, and r < *row_limit when row_limit (device int) is given
// (cols bf16 per row; cols and ld multiples of 8, x and out 16-byte aligned, else kInvalidArgument):
// FC1's token rows in grouped order, read without a row index.
Status launch_gather_rows(const uint16_t* x, int64_t ld, const int32_t* gather, int64_t rows,
                          const int32_t* row_limit, int64_t cols, uint16_t* out, Stream stream);

// --- the small-batch front end (front_small.cu) --------------------------------------------------------
// launch_routing (its register fast path), launch_local_expert_ids for an expert shard, launch_permute and
// launch_gather_rows of the kept rows, in one launch for decode-sized batches: the same bytes in ids and
// weights [T, topk] (global expert ids), b.offsets [E + 1, or count + 2 for a shard], b.gather,
// b.pair_pos and y [kept rows, H]; b.rank, b.chunk_base and b.shared_offsets are not touched. x rows are
// ld bf16 apart, y rows H; H and ld multiples of 8, x and y 16-byte aligned, else kInvalidArgument.
// append_tokens (the whole layer only): every token also as the rows of one more expert E, b.offsets
// [E + 2] with offsets[E + 1] = P + T and y[P + t] = x[t] (the engine's shared expert folded into the
// routed launch); b.gather covers the P routed rows, then (append) the T appended rows' tokens.
struct FrontShard {
  int64_t first = 0, count = 0;  // the experts held: [first, first + count); all E = the whole layer
};
// Whether the fused path takes `tokens` tokens of cfg over `permute_experts` (E, or count + 1).
bool front_small_supported(const MoeConfig& cfg, int64_t tokens, int64_t permute_experts);
Status launch_front_small(const float* logits, const float* bias, int64_t tokens, const MoeConfig& cfg,
                          const FrontShard& shard, const uint16_t* x, int64_t ld, int32_t* ids, float* weights,
                          const PermuteBuffers& b, uint16_t* y, Stream stream, bool append_tokens = false);
// (y null: no copy; FC1 reads the token rows through b.gather, which also holds the appended rows' tokens.)

// --- finalize (finalize.cu) -------------------------------------------------------------------------
// out[t] = bf16( sum_k w[t,k] * y[pair_pos[t*topk+k]] (+ y_shared[t]) ), fp32, k in order then shared (R5).
// y [pairs, H] bf16, y_shared [T, H] bf16 or null, out [T, H] bf16; H a multiple of 8, 16-byte aligned rows.
Status launch_finalize(const uint16_t* y, const int32_t* pair_pos, const float* weights, const uint16_t* y_shared,
                       int64_t tokens, int64_t topk, int64_t hidden, uint16_t* out, Stream stream);
// The same combine over the pairs whose grouped row is below *kept_rows (a device int, e.g. the permuted
// offsets' start of the expert-parallel dropped bucket); the other pairs are skipped, as if their weight
// were 0, and their rows are never read. kept_rows null: every pair (== launch_finalize).
// reset (16-byte aligned, reset_bytes a multiple of 16) or null: bytes the kernel zeroes after its
// programmatic-launch wait, i.e. once the kernel before it on the stream has ended (the chained GEMM
// launch's counters, GroupedGemmArgs::caller_resets).
// y32 (16-byte aligned) or null: FC2's rows as fp32 sums instead of y (GroupedGemmArgs::fp32_rows_to_caller),
// rounded to bf16 here and zeroed as they are read; y32_shared: the shared expert's T rows likewise (then
// y_shared null).
Status launch_finalize_partial(const uint16_t* y, const int32_t* pair_pos, const float* weights,
                               const int32_t* kept_rows, const uint16_t* y_shared, int64_t tokens, int64_t topk,
                               int64_t hidden, uint16_t* out, Stream stream, void* reset = nullptr,
                               size_t reset_bytes = 0, float* y32 = nullptr, float* y32_shared = nullptr);

// --- expert parallelism (expert_parallel.cu) --------------------------------------------------------
// local_ids[i] = ids[i] - first when first <= ids[i] < first + count, else count (the dropped bucket),
// for i < pairs. The permutation then groups the pairs over count + 1 experts.
Status launch_local_expert_ids(const int32_t* ids, int64_t pairs, int64_t first, int64_t count, int32_t* local_ids,
                               Stream stream);

// --- synthetic weights (synthetic.cu) ---------------------------------------------------------------
// `count` experts of one tensor: dst + i * dst_stride receives the bytes of expert (expert0 + i), byte j =
// synthetic_code_byte(seed, expert, tensor, j) (codes) or synthetic_scale_byte(...) (scales), j < bytes.
// Expert index kSyntheticSharedExpert (with count 1) is the shared expert.
Status launch_synthetic_bytes(uint64_t seed, int64_t expert0, int64_t count, uint32_t tensor, bool scales,
                              uint8_t* dst, int64_t dst_stride, int64_t bytes, Stream stream);
// Router weight [E, H] (synthetic_router_value) and correction bias [E] (synthetic_bias_value).
Status launch_synthetic_router(uint64_t seed, int64_t experts, int64_t hidden, float scale, float* dst, Stream stream);
Status launch_synthetic_bias(uint64_t seed, int64_t experts, float* dst, Stream stream);

}  // namespace fp4moe::engine
