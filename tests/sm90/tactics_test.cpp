// Every registered sm90 tactic against a CPU reference, per GEMM, on random problems with tails:
// experts with 0 rows, 1 row and more rows than a tile, K = 16 * odd, N not a multiple of the tile,
// FC1 gathering token rows (a_row_index) and FC2 reading rows contiguously with a padded row stride.
// Outputs are poisoned with 0xD5 first; rows past offsets[E] must stay poisoned. The reference uses
// the same dequantised weights (e2m1 * e4m3, tensor scale in fp32) and the rounding points of
// reference.h (R3, R4), so only kernel error is measured: relative L2 <= 5e-3. Also: the device pack
// equals the CPU description byte for byte, and shapes a tactic cannot do are refused by check(). The
// chained FC1 -> FC2 launch gives the same bytes as the two launches and leaves its counters at zero;
// the split reduction (forced through FP4MOE_SM90_SPLIT_K) passes the same checks, and so does a chained
// launch whose last expert's weights come from their own buffers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp4moe/device_caps.h"
#include "fp4moe/nvfp4.h"
#include "fp4moe/reference.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "kernels/sm90_wgmma/tile_config.h"
#include "sm90_test_util.h"

namespace fp4moe {
namespace {

using sm90test::DeviceBuffer;

struct Case {
  GemmOp op;
  int64_t n, k;
  std::vector<int> rows;   // rows per expert
  int64_t spare_rows;      // capacity past offsets[E] (must stay poisoned)
  bool gather;             // FC1-style a_row_index
  int64_t a_pad;           // a_ld = k + a_pad
  uint32_t seed;
};

std::string case_name(const Case& c) {
  std::string r;
  for (int x : c.rows) r += std::to_string(x) + ",";
  return fmt::format("{} n={} k={} rows=[{}] gather={} a_ld=k+{}", gemm_op_name(c.op), c.n, c.k, r, c.gather, c.a_pad);
}

// The CPU description of the packed weights in `layout`.
std::vector<uint8_t> cpu_pack(WeightLayout layout, const GemmProblem& p, const void* canonical) {
  return layout == WeightLayout::kSm90E4m3 ? sm90::pack_e4m3_cpu(p, canonical) : sm90::pack_cpu(p, canonical);
}
// The bytes of a tactic's split partials (the workspace's last region): the e4m3 tile (one token per item,
// tile_n 1) keeps the n8 tiles' partials, wgmma's eight columns.
size_t split_partials(const TacticDesc& d) {
  return static_cast<size_t>(sm90::split_partial_bytes(d.tile_m, std::max(d.tile_n, 8)));
}

// partials_touched: poison the workspace's split partials (NaN bytes) before the run and count the bytes
// the run changed (a split item stores its partials, the tile's last part zeroes them): > 0 shows the
// split reduction ran. Every other workspace byte must be zero after the run.
void run_case(GroupedGemmTactic& tactic, const Case& c, int64_t* partials_touched = nullptr) {
  SCOPED_TRACE(tactic.desc().name + " " + case_name(c));
  const int64_t E = static_cast<int64_t>(c.rows.size());
  GemmProblem p;
  p.op = c.op;
  p.num_experts = E;
  p.n = c.n;
  p.k = c.k;
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.rows[e];
  const int64_t used = offsets[E];
  p.total_rows = used + c.spare_rows;
  p.max_rows_per_expert = p.total_rows;
  const DeviceCaps caps = query_device_caps(0);
  const TacticCheck chk = tactic.check(p, caps);
  ASSERT_TRUE(chk.ok) << chk.reason;

  std::mt19937 rng(c.seed);
  // Weights (canonical) and tensor scales.
  const sm90test::RandomWeights w = sm90test::random_weights(p, rng);
  // Activations: FC1 gathers from T tokens, FC2 reads problem rows directly.
  const int64_t a_ld = c.k + c.a_pad;
  const int64_t tokens = c.gather ? std::max<int64_t>(1, used / 2 + 3) : p.total_rows;
  std::vector<uint16_t> a(static_cast<size_t>(tokens * a_ld));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (auto& v : a) v = f32_to_bf16_bits(ux(rng));
  std::vector<int32_t> row_index;
  if (c.gather) {
    row_index.resize(static_cast<size_t>(p.total_rows));
    for (auto& r : row_index) r = static_cast<int32_t>(rng() % tokens);
  }

  // Device buffers; pack through the tactic's layout ops and compare with the CPU description.
  const WeightLayoutOps* ops = sm90_weight_layout_ops(tactic.desc().layout);
  ASSERT_NE(ops, nullptr);
  DeviceBuffer d_canon(w.canonical.size()), d_packed(ops->bytes(p)), d_off(offsets.size() * 4),
      d_a(a.size() * 2), d_idx(std::max<size_t>(4, row_index.size() * 4)), d_ts(w.tensor_scales.size() * 4),
      d_out(static_cast<size_t>(p.total_rows * c.n * 2)), d_ws(std::max<size_t>(16, tactic.workspace_bytes(p)));
  d_canon.upload(w.canonical.data(), w.canonical.size());
  SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));  // the tactic's work counters start at zero
  d_off.upload(offsets.data(), offsets.size() * 4);
  d_a.upload(a.data(), a.size() * 2);
  if (c.gather) d_idx.upload(row_index.data(), row_index.size() * 4);
  d_ts.upload(w.tensor_scales.data(), w.tensor_scales.size() * 4);
  ASSERT_TRUE(ops->pack(p, d_canon.get(), d_packed.get(), nullptr).is_ok());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> packed_cpu = cpu_pack(tactic.desc().layout, p, w.canonical.data());
  std::vector<uint8_t> packed_gpu(packed_cpu.size());
  d_packed.download(packed_gpu.data(), packed_gpu.size());
  ASSERT_TRUE(packed_cpu == packed_gpu) << "device pack differs from the CPU description";

  SM90_CUDA_OK(cudaMemset(d_out.get(), 0xD5, d_out.size()));
  GroupedGemmArgs args;
  args.problem = p;
  args.expert_offsets = static_cast<const int32_t*>(d_off.get());
  args.a = static_cast<const uint16_t*>(d_a.get());
  args.a_row_index = c.gather ? static_cast<const int32_t*>(d_idx.get()) : nullptr;
  args.a_ld = a_ld;
  args.weights = d_packed.get();
  args.tensor_scales = static_cast<const float*>(d_ts.get());
  args.out = static_cast<uint16_t*>(d_out.get());
  args.workspace = d_ws.get();
  const Status init = tactic.init(p);
  ASSERT_TRUE(init.is_ok()) << init.to_string();
  const size_t partial_bytes = split_partials(tactic.desc());
  ASSERT_GE(tactic.workspace_bytes(p), partial_bytes);
  const size_t partial_off = tactic.workspace_bytes(p) - partial_bytes;
  if (partials_touched && partial_bytes > 0)
    SM90_CUDA_OK(cudaMemset(static_cast<uint8_t*>(d_ws.get()) + partial_off, 0xFF, partial_bytes));
  const Status st = tactic.run(args, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  SM90_CUDA_OK(cudaDeviceSynchronize());
  {
    std::vector<uint8_t> ws(d_ws.size());
    d_ws.download(ws.data(), ws.size());
    const size_t counters_end = partials_touched ? partial_off : ws.size();
    ASSERT_TRUE(std::all_of(ws.begin(), ws.begin() + counters_end, [](uint8_t b) { return b == 0; }))
        << "workspace not left zero";
    if (partials_touched) {
      *partials_touched += std::count_if(ws.begin() + partial_off, ws.begin() + partial_off + partial_bytes,
                                         [](uint8_t b) { return b != 0xFF; });
      SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));
    }
  }
  std::vector<uint16_t> out(static_cast<size_t>(p.total_rows * c.n));
  d_out.download(out.data(), out.size() * 2);

  // Reference.
  std::vector<float> ref(static_cast<size_t>(used * c.n)), got(ref.size());
  std::vector<float> x(static_cast<size_t>(c.k));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int64_t src = c.gather ? row_index[r] : r;
      for (int64_t k = 0; k < c.k; ++k) x[k] = bf16_bits_to_f32(a[src * a_ld + k]);
      sm90test::reference_row(p, w, e, x.data(), ref.data() + r * c.n);
    }
  for (int64_t i = 0; i < used * c.n; ++i) got[i] = bf16_bits_to_f32(out[i]);
  const double err = relative_l2_error(got.data(), ref.data(), used * c.n);
  EXPECT_LE(err, 5e-3) << "relative L2 error " << err;
  if (!(err <= 5e-3)) {  // name the first few bad elements to make a failure readable
    int shown = 0;
    for (int64_t i = 0; i < used * c.n && shown < 8; ++i)
      if (!(std::fabs(got[i] - ref[i]) <= 1e-2f * (std::fabs(ref[i]) + 1e-2f))) {
        ADD_FAILURE() << "row " << i / c.n << " col " << i % c.n << ": got " << got[i] << " want " << ref[i];
        ++shown;
      }
  }
  for (int64_t i = used * c.n; i < p.total_rows * c.n; ++i)
    ASSERT_EQ(out[i], 0xD5D5) << "row " << i / c.n << " past offsets[E] was written";
}

std::vector<Case> cases() {
  return {
      // Tails: an expert with 0 rows, 1 row, more rows than any tile; K = 16 * 13; N off the tile grid.
      {GemmOp::kFc2, 200, 208, {0, 1, 37, 8, 130, 3, 0, 300}, 5, false, 8, 11},
      {GemmOp::kFc1SwiGlu, 80, 208, {0, 1, 37, 8, 130, 3, 0, 300}, 5, true, 0, 12},
      // Longer K (many pipeline stages, ring wrap-around), FC1 contiguous and FC2 gathered too.
      {GemmOp::kFc1SwiGlu, 256, 1024, {5, 64, 0, 17, 1}, 0, false, 0, 13},
      {GemmOp::kFc2, 1024, 256, {5, 64, 0, 17, 1}, 3, true, 24, 14},
      // Decode-like: many experts, most with 0 or 1 row.
      {GemmOp::kFc2, 512, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, 0, false, 0, 15},
      {GemmOp::kFc1SwiGlu, 96, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, 0, true, 0, 16},
      // 45 experts (not a multiple of 32: the item decode's two-level search over blocks of two), the
      // last one with rows, so every block of the search is crossed.
      {GemmOp::kFc2, 256, 256, {0, 2, 0, 0, 1, 0, 0, 0, 9, 0, 0, 1, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 1,
                                 0, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 4},
       0, false, 0, 17},
      // K past the e4m3 tile's row cache (TileConfig::kRowCacheK = 8192): row 0 comes from L2 like the others.
      {GemmOp::kFc1SwiGlu, 64, 8320, {1, 2, 0, 1}, 2, false, 8, 18},
  };
}

// A GEMM's weights on the device in the sm90 layout, with their CPU copy for the reference.
struct DeviceGemm {
  GemmProblem p;
  sm90test::RandomWeights w;
  std::unique_ptr<DeviceBuffer> packed, ts;
};

DeviceGemm device_gemm(const GemmProblem& p, WeightLayout layout, std::mt19937& rng) {
  DeviceGemm g;
  g.p = p;
  g.w = sm90test::random_weights(p, rng);
  const WeightLayoutOps* ops = sm90_weight_layout_ops(layout);
  DeviceBuffer canon(g.w.canonical.size());
  canon.upload(g.w.canonical.data(), g.w.canonical.size());
  g.packed = std::make_unique<DeviceBuffer>(ops->bytes(p));
  g.ts = std::make_unique<DeviceBuffer>(g.w.tensor_scales.size() * 4);
  g.ts->upload(g.w.tensor_scales.data(), g.w.tensor_scales.size() * 4);
  const Status st = ops->pack(p, canon.get(), g.packed->get(), nullptr);
  if (!st.is_ok()) throw std::runtime_error(st.to_string());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  return g;
}

std::vector<uint16_t> download_bf16(const DeviceBuffer& b) {
  std::vector<uint16_t> v(b.size() / 2);
  b.download(v.data(), b.size());
  return v;
}

// A chained launch's shape: the offsets of experts with `rows` rows each, 3 spare rows past them, and the
// FC1 / FC2 problems over them, which `tactic` must accept (checked, then initialised).
struct ChainShape {
  std::vector<int32_t> offsets;
  int64_t used = 0, total = 0;
  GemmProblem p1, p2;
};
void chain_shape(GroupedGemmTactic& tactic, const std::vector<int>& rows, int64_t inter, int64_t hidden,
                 ChainShape* out) {
  const int64_t E = static_cast<int64_t>(rows.size());
  out->offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) out->offsets[e + 1] = out->offsets[e] + rows[e];
  out->used = out->offsets[E];
  out->total = out->used + 3;
  out->p1 = GemmProblem{GemmOp::kFc1SwiGlu, E, inter, hidden, out->total, out->total};
  out->p2 = GemmProblem{GemmOp::kFc2, E, hidden, inter, out->total, out->total};
  const DeviceCaps caps = query_device_caps(0);
  for (const GemmProblem* p : {&out->p1, &out->p2})
    ASSERT_TRUE(tactic.check(*p, caps).ok) << tactic.check(*p, caps).reason;
  ASSERT_TRUE(tactic.init(out->p1).is_ok());
}

// The arguments of a chained FC1 -> FC2 launch on a test's buffers: FC1 reads x (through row_index
// when given, else contiguously) into h, FC2 reads h into y.
std::pair<GroupedGemmArgs, GroupedGemmArgs> chain_args(const GemmProblem& p1, const GemmProblem& p2,
                                                       const DeviceBuffer& d_off, const DeviceBuffer& d_x,
                                                       const int32_t* row_index, const DeviceGemm& g1,
                                                       const DeviceGemm& g2, const DeviceBuffer& d_h,
                                                       const DeviceBuffer& d_y, const DeviceBuffer& d_ws) {
  GroupedGemmArgs a1, a2;
  a1.problem = p1;
  a1.expert_offsets = static_cast<const int32_t*>(d_off.get());
  a1.a = static_cast<const uint16_t*>(d_x.get());
  a1.a_row_index = row_index;
  a1.a_ld = p1.k;
  a1.weights = g1.packed->get();
  a1.tensor_scales = static_cast<const float*>(g1.ts->get());
  a1.out = static_cast<uint16_t*>(d_h.get());
  a1.workspace = d_ws.get();
  a2 = a1;
  a2.problem = p2;
  a2.a = a1.out;
  a2.a_row_index = nullptr;
  a2.a_ld = p2.k;
  a2.weights = g2.packed->get();
  a2.tensor_scales = static_cast<const float*>(g2.ts->get());
  a2.out = static_cast<uint16_t*>(d_y.get());
  return {a1, a2};
}

// Expert e's CPU weights for the reference: the problem they were made for, the weights, e's index there.
struct CpuExpert {
  GemmProblem p;
  const sm90test::RandomWeights* w;
  int64_t e;
};

// h (FC1) and y (FC2) of a chained launch against the CPU reference: rows past offsets[E] still poisoned
// (0xD5), FC1 on x row src(r) for problem row r, FC2 on the device's h rows, each within 5e-3 relative L2.
// weights(e, fc2) names expert e's CpuExpert for FC1 (false) or FC2 (true).
template <class Src, class Weights>
void expect_chain_reference(const std::vector<int32_t>& offsets, int64_t total, int64_t inter, int64_t hidden,
                            const std::vector<uint16_t>& x, const std::vector<uint16_t>& h,
                            const std::vector<uint16_t>& y, Src src, Weights weights) {
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1, used = offsets[E];
  for (int64_t i = used * inter; i < total * inter; ++i) ASSERT_EQ(h[i], 0xD5D5) << "h1 past offsets[E] written";
  for (int64_t i = used * hidden; i < total * hidden; ++i) ASSERT_EQ(y[i], 0xD5D5) << "y past offsets[E] written";
  std::vector<float> ref1(static_cast<size_t>(used * inter)), got1(ref1.size()), ref2(static_cast<size_t>(used * hidden)),
      got2(ref2.size()), in(static_cast<size_t>(std::max(inter, hidden)));
  for (int64_t e = 0; e < E; ++e) {
    const CpuExpert w1 = weights(e, false), w2 = weights(e, true);
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int64_t row = src(r);
      for (int64_t k = 0; k < hidden; ++k) in[k] = bf16_bits_to_f32(x[row * hidden + k]);
      sm90test::reference_row(w1.p, *w1.w, w1.e, in.data(), ref1.data() + r * inter);
      for (int64_t k = 0; k < inter; ++k) in[k] = bf16_bits_to_f32(h[r * inter + k]);
      sm90test::reference_row(w2.p, *w2.w, w2.e, in.data(), ref2.data() + r * hidden);
    }
  }
  for (size_t i = 0; i < got1.size(); ++i) got1[i] = bf16_bits_to_f32(h[i]);
  for (size_t i = 0; i < got2.size(); ++i) got2[i] = bf16_bits_to_f32(y[i]);
  const double e1 = relative_l2_error(got1.data(), ref1.data(), used * inter);
  const double e2 = relative_l2_error(got2.data(), ref2.data(), used * hidden);
  EXPECT_LE(e1, 5e-3) << "FC1 relative L2 error " << e1;
  EXPECT_LE(e2, 5e-3) << "FC2 relative L2 error " << e2;
}

// FC1 then FC2 on FC1's rows as one chained launch (run_chained) against the two launches and the CPU
// reference: the same bytes in h1 and y, rows past offsets[E] untouched, y within 5e-3 relative L2 of
// the reference computed on h1, and the workspace counters back at zero after each of three launches
// (so graph replays start clean). The second launch leaves its counters to the caller
// (GroupedGemmArgs::caller_resets): everything past chained_reset_bytes is zero after it, and the third
// launch runs after the test zeroed those bytes, as the engine's finalize does.
void run_chained_case(GroupedGemmTactic& tactic, int64_t inter, int64_t hidden, const std::vector<int>& rows,
                      bool gather, uint32_t seed) {
  std::string rs;
  for (int x : rows) rs += std::to_string(x) + ",";
  SCOPED_TRACE(fmt::format("{} chained I={} H={} rows=[{}] gather={}", tactic.desc().name, inter, hidden, rs, gather));
  ChainShape cs;
  ASSERT_NO_FATAL_FAILURE(chain_shape(tactic, rows, inter, hidden, &cs));
  const std::vector<int32_t>& offsets = cs.offsets;
  const int64_t used = cs.used, total = cs.total;
  const GemmProblem &p1 = cs.p1, &p2 = cs.p2;
  ASSERT_TRUE(tactic.can_chain());
  std::mt19937 rng(seed);
  const WeightLayout layout = tactic.desc().layout;
  const DeviceGemm g1 = device_gemm(p1, layout, rng), g2 = device_gemm(p2, layout, rng);
  const int64_t tokens = gather ? used / 2 + 3 : total;
  std::vector<uint16_t> x(static_cast<size_t>(tokens * hidden));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (auto& v : x) v = f32_to_bf16_bits(ux(rng));
  std::vector<int32_t> row_index(static_cast<size_t>(total));
  for (auto& r : row_index) r = static_cast<int32_t>(rng() % tokens);
  DeviceBuffer d_x(x.size() * 2), d_off(offsets.size() * 4), d_idx(row_index.size() * 4),
      d_h(static_cast<size_t>(total * inter * 2)), d_y(static_cast<size_t>(total * hidden * 2)),
      d_ws(std::max(tactic.workspace_bytes(p1), tactic.workspace_bytes(p2)));
  d_x.upload(x.data(), x.size() * 2);
  d_off.upload(offsets.data(), offsets.size() * 4);
  d_idx.upload(row_index.data(), row_index.size() * 4);
  SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));
  const auto [a1, a2] = chain_args(p1, p2, d_off, d_x, gather ? static_cast<const int32_t*>(d_idx.get()) : nullptr,
                                   g1, g2, d_h, d_y, d_ws);
  auto poison = [&] {
    SM90_CUDA_OK(cudaMemset(d_h.get(), 0xD5, d_h.size()));
    SM90_CUDA_OK(cudaMemset(d_y.get(), 0xD5, d_y.size()));
  };
  poison();
  ASSERT_TRUE(tactic.run(a1, nullptr).is_ok());
  ASSERT_TRUE(tactic.run(a2, nullptr).is_ok());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> h_two = download_bf16(d_h), y_two = download_bf16(d_y);
  const size_t reset_bytes = tactic.chained_reset_bytes(p1);
  ASSERT_GT(reset_bytes, 0u);
  ASSERT_EQ(reset_bytes % 16, 0u);
  ASSERT_LE(reset_bytes, d_ws.size());
  for (int launch = 0; launch < 3; ++launch) {
    poison();
    GroupedGemmArgs b1 = a1;
    b1.caller_resets = launch == 1;
    const Status st = tactic.run_chained(b1, a2, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    SM90_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_TRUE(download_bf16(d_h) == h_two) << "launch " << launch << ": chained FC1 rows differ from FC1 alone";
    ASSERT_TRUE(download_bf16(d_y) == y_two) << "launch " << launch << ": chained FC2 rows differ from FC2 alone";
    std::vector<int32_t> ws(d_ws.size() / 4);
    d_ws.download(ws.data(), ws.size() * 4);
    const auto from = ws.begin() + (b1.caller_resets ? static_cast<std::ptrdiff_t>(reset_bytes / 4) : 0);
    ASSERT_TRUE(std::all_of(from, ws.end(), [](int32_t v) { return v == 0; }))
        << "launch " << launch << ": counters not reset" << (b1.caller_resets ? " past chained_reset_bytes" : "");
    if (b1.caller_resets) {
      ASSERT_TRUE(std::any_of(ws.begin(), from, [](int32_t v) { return v != 0; }))
          << "the launch reset what it leaves to the caller";
      SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, reset_bytes));
    }
  }
  expect_chain_reference(
      offsets, total, inter, hidden, x, h_two, y_two, [&](int64_t r) { return gather ? row_index[r] : r; },
      [&](int64_t e, bool fc2) { return CpuExpert{fc2 ? p2 : p1, fc2 ? &g2.w : &g1.w, e}; });
}

// The last expert folded in (GroupedGemmArgs::last_expert_weights, the engine's shared expert): a chained
// launch over E experts whose buffers hold only the first E - 1 (so a read of expert E - 1 from them
// would fail memcheck and the reference), the last one's weights and tensor scales in their own, against
// the CPU reference; rows past offsets[E] stay poisoned, three launches give the same bytes and leave
// the workspace zero. rows: the first E - 1 experts' rows; empty: one row each for as many experts as
// fill the machine's CTA slots once with FC1 tiles, so that the last expert's tiles spill past them and
// are split (ItemSpace::xsplit, fold_split_parts: at H = 1536 3 parts, of 2 stages on the k256 tiles and of
// 4 on the k128 ones; at H = 1792, where FC2's stages do not divide FC1's, 7 parts of one or two).
void run_folded_case(GroupedGemmTactic& tactic, int64_t inter, int64_t hidden, std::vector<int> rows, int last_rows,
                     uint32_t seed) {
  int sms = 0;
  SM90_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const TacticDesc& d = tactic.desc();
  const bool fill = rows.empty();
  if (fill) rows.assign(static_cast<size_t>(sms * d.ctas_per_sm / ((2 * inter + d.tile_m - 1) / d.tile_m)), 1);
  SCOPED_TRACE(fmt::format("{} folded I={} H={} experts={} last rows={}", d.name, inter, hidden, rows.size() + 1,
                           last_rows));
  const int64_t Er = static_cast<int64_t>(rows.size());
  std::vector<int> all_rows = rows;
  all_rows.push_back(last_rows);
  ChainShape cs;
  ASSERT_NO_FATAL_FAILURE(chain_shape(tactic, all_rows, inter, hidden, &cs));
  const std::vector<int32_t>& offsets = cs.offsets;
  const int64_t total = cs.total;
  const GemmProblem &p1 = cs.p1, &p2 = cs.p2;
  std::mt19937 rng(seed);
  auto experts = [](GemmProblem p, int64_t n) {
    p.num_experts = n;
    return p;
  };
  const DeviceGemm g1 = device_gemm(experts(p1, Er), d.layout, rng), g2 = device_gemm(experts(p2, Er), d.layout, rng);
  const DeviceGemm l1 = device_gemm(experts(p1, 1), d.layout, rng), l2 = device_gemm(experts(p2, 1), d.layout, rng);
  std::vector<uint16_t> x(static_cast<size_t>(total * hidden));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (auto& v : x) v = f32_to_bf16_bits(ux(rng));
  DeviceBuffer d_x(x.size() * 2), d_off(offsets.size() * 4), d_h(static_cast<size_t>(total * inter * 2)),
      d_y(static_cast<size_t>(total * hidden * 2)), d_ws(std::max(tactic.workspace_bytes(p1), tactic.workspace_bytes(p2)));
  d_x.upload(x.data(), x.size() * 2);
  d_off.upload(offsets.data(), offsets.size() * 4);
  SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));
  auto [a1, a2] = chain_args(p1, p2, d_off, d_x, nullptr, g1, g2, d_h, d_y, d_ws);
  a1.last_expert_weights = l1.packed->get();
  a1.last_expert_scales = static_cast<const float*>(l1.ts->get());
  a2.last_expert_weights = l2.packed->get();
  a2.last_expert_scales = static_cast<const float*>(l2.ts->get());
  // The first launch runs on split partials poisoned with 0xFF: the bytes it leaves otherwise are the
  // split reduction's (which zeroes what it used).
  const size_t partial_bytes = split_partials(d);
  const size_t partial_off = tactic.workspace_bytes(p1) - partial_bytes;
  int64_t touched = 0;
  std::vector<uint16_t> h, y;
  for (int launch = 0; launch < 3; ++launch) {
    SM90_CUDA_OK(cudaMemset(d_h.get(), 0xD5, d_h.size()));
    SM90_CUDA_OK(cudaMemset(d_y.get(), 0xD5, d_y.size()));
    if (launch == 0 && partial_bytes > 0)
      SM90_CUDA_OK(cudaMemset(static_cast<uint8_t*>(d_ws.get()) + partial_off, 0xFF, partial_bytes));
    const Status st = tactic.run_chained(a1, a2, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    SM90_CUDA_OK(cudaDeviceSynchronize());
    if (launch == 0) {
      h = download_bf16(d_h);
      y = download_bf16(d_y);
    } else {
      ASSERT_TRUE(download_bf16(d_h) == h && download_bf16(d_y) == y) << "launch " << launch << " differs from launch 0";
    }
    std::vector<uint8_t> ws(d_ws.size());
    d_ws.download(ws.data(), ws.size());
    if (launch == 0 && partial_bytes > 0) {
      const auto p0 = ws.begin() + static_cast<std::ptrdiff_t>(partial_off);
      touched = std::count_if(p0, p0 + static_cast<std::ptrdiff_t>(partial_bytes), [](uint8_t b) { return b != 0xFF; });
      std::fill(p0, p0 + static_cast<std::ptrdiff_t>(partial_bytes), uint8_t{0});
      SM90_CUDA_OK(cudaMemset(d_ws.get(), 0, d_ws.size()));
    }
    ASSERT_TRUE(std::all_of(ws.begin(), ws.end(), [](uint8_t v) { return v == 0; }))
        << "launch " << launch << ": workspace not zero";
  }
  if (fill && sm90::split_capable(d.tile_n)) {
    EXPECT_GT(touched, 0) << "the last expert's FC1 tiles were not split";
  }
  expect_chain_reference(offsets, total, inter, hidden, x, h, y, [](int64_t r) { return r; },
                         [&](int64_t e, bool fc2) {
                           const bool last = e == Er;
                           const DeviceGemm& g = last ? (fc2 ? l2 : l1) : (fc2 ? g2 : g1);
                           return CpuExpert{experts(fc2 ? p2 : p1, last ? 1 : Er), &g.w, last ? 0 : e};
                         });
}

class Sm90Tactics : public ::testing::Test {
 protected:
  static std::vector<std::unique_ptr<GroupedGemmTactic>>& tactics() {
    // SM90_TACTICS_ONLY=TEXT keeps the tactics whose name contains TEXT (to check one tile quickly).
    static std::vector<std::unique_ptr<GroupedGemmTactic>> t = [] {
      std::vector<std::unique_ptr<GroupedGemmTactic>> v;
      append_sm90_tactics(v);
      if (const char* only = std::getenv("SM90_TACTICS_ONLY"))
        v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& x) { return x->desc().name.find(only) == std::string::npos; }),
                v.end());
      return v;
    }();
    return t;
  }
  void SetUp() override { start_ = std::chrono::steady_clock::now(); }
  // One line per tactic (and setting) of the long cases, with the seconds since the case began, so that a
  // run cut off by a timeout names what it was on and a slow case shows where its time went
  // (scripts/gpu_check.sh prints the last such line of a test that timed out).
  void progress(const std::string& what) const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    fmt::print("[ progress ] {:.1f} s: {}\n", s, what);
    std::fflush(stdout);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

TEST_F(Sm90Tactics, EveryTacticMatchesReference) {
  ASSERT_FALSE(tactics().empty());
  for (auto& t : tactics()) {
    progress(t->desc().name);
    for (const Case& c : cases()) run_case(*t, c);
  }
}

TEST_F(Sm90Tactics, ChainedLaunchMatchesTwoLaunchesAndReference) {
  for (auto& t : tactics()) {
    progress(t->desc().name);
    run_chained_case(*t, 80, 208, {0, 1, 37, 8, 130, 3, 0, 300}, true, 21);
    run_chained_case(*t, 256, 1024, {5, 64, 0, 17, 1}, false, 22);
    run_chained_case(*t, 96, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, false, 23);
  }
}

TEST_F(Sm90Tactics, FoldedLastExpertMatchesReference) {
  for (auto& t : tactics()) {
    progress(t->desc().name);
    run_folded_case(*t, 512, 1536, {}, 1, 41);                    // the last expert's FC1 tiles split
    run_folded_case(*t, 512, 1792, {}, 1, 43);                    // split, FC2's stages not dividing FC1's
    run_folded_case(*t, 96, 512, {3, 0, 1, 17, 0, 2}, 9, 42);     // two token tiles, no split
  }
}

TEST_F(Sm90Tactics, RefusesHalfAFoldedLastExpert) {
  for (auto& t : tactics()) {
    const GemmProblem p1{GemmOp::kFc1SwiGlu, 4, 128, 256, 16, 16};
    ASSERT_TRUE(t->init(p1).is_ok());
    DeviceBuffer buf(4096);
    GroupedGemmArgs a;
    a.problem = p1;
    a.a = static_cast<const uint16_t*>(buf.get());
    a.a_ld = 256;
    a.weights = buf.get();
    a.last_expert_weights = buf.get();  // without its tensor scales
    const Status st = t->run(a, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("last expert"), std::string::npos) << st.to_string();
  }
}

// FC2's fp32 rows left to the caller (GroupedGemmArgs::fp32_rows_to_caller) are the resident tactic's: the
// wgmma tactics declare no place for them (fp32_rows_offset() < 0) and refuse the flag, alone and chained,
// naming it, rather than leave bf16 rows where the caller would read fp32 sums.
TEST_F(Sm90Tactics, RefusesFp32RowsToCaller) {
  for (auto& t : tactics()) {
    SCOPED_TRACE(t->desc().name);
    const GemmProblem p1{GemmOp::kFc1SwiGlu, 4, 128, 256, 16, 16};
    const GemmProblem p2{GemmOp::kFc2, 4, 256, 128, 16, 16};
    EXPECT_LT(t->fp32_rows_offset(p1), 0);
    ASSERT_TRUE(t->init(p1).is_ok());
    DeviceBuffer buf(1 << 16), ws(t->workspace_bytes(p1));
    GroupedGemmArgs a1, a2;
    a1.problem = p1;
    a1.expert_offsets = static_cast<const int32_t*>(buf.get());
    a1.a = static_cast<const uint16_t*>(buf.get());
    a1.a_ld = 256;
    a1.weights = buf.get();
    a1.tensor_scales = static_cast<const float*>(buf.get());
    a1.out = static_cast<uint16_t*>(buf.get());
    a1.workspace = ws.get();
    a1.fp32_rows_to_caller = true;
    a2 = a1;
    a2.problem = p2;
    a2.a = a1.out;
    a2.a_ld = 128;
    a2.fp32_rows_to_caller = false;
    std::vector<Status> refusals = {t->run(a1, nullptr)};
    if (t->can_chain()) refusals.push_back(t->run_chained(a1, a2, nullptr));
    for (const Status& st : refusals) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find("fp32_rows_to_caller"), std::string::npos) << st.to_string();
    }
  }
}

TEST_F(Sm90Tactics, RefusesRoutingOutsideItsShapes) {
  // Routing inside the launch (GroupedGemmArgs::routing): only FC1 of a chained launch, for the shapes
  // the prologue carries, with FC1 reading the token rows directly; each refusal names what is wrong.
  // The n8 tiles and the e4m3 tile carry the routing prologue (TileConfig::kRoutes); the others refuse
  // every batch.
  MoeConfig cfg = glm5_config();
  MoeConfig wide = cfg;
  wide.num_experts = 512;
  for (auto& t : tactics()) {
    SCOPED_TRACE(t->desc().name);
    const bool routes = t->desc().tile_n <= 8;
    EXPECT_EQ(t->can_route_in_chain(cfg, 8), routes);
    EXPECT_FALSE(t->can_route_in_chain(cfg, 9)) << "72 pairs";
    EXPECT_FALSE(t->can_route_in_chain(wide, 1)) << "E = 512";
    const GemmProblem p1{GemmOp::kFc1SwiGlu, cfg.num_experts, 128, 256, 16, 16};
    const GemmProblem p2{GemmOp::kFc2, cfg.num_experts, 256, 128, 16, 16};
    ASSERT_TRUE(t->init(p1).is_ok());
    DeviceBuffer buf(1 << 20), ws(t->workspace_bytes(p1));
    int32_t* i32 = static_cast<int32_t*>(buf.get());
    DecodeRouting r;
    r.config = &cfg;
    r.logits = static_cast<const float*>(buf.get());
    r.tokens = 2;
    r.ids = r.offsets = r.gather = r.pair_pos = i32;
    r.weights = static_cast<float*>(buf.get());
    GroupedGemmArgs a1, a2;
    a1.problem = p1;
    a1.a = static_cast<const uint16_t*>(buf.get());
    a1.a_ld = 256;
    a1.weights = buf.get();
    a1.expert_offsets = i32;
    a1.out = static_cast<uint16_t*>(buf.get());
    a1.workspace = ws.get();
    a1.routing = &r;
    a2 = a1;
    a2.problem = p2;
    a2.a = a1.out;
    a2.a_ld = 128;
    a2.routing = nullptr;
    auto expect_refused = [&](const char* what, const char* words) {
      const Status st = t->run_chained(a1, a2, nullptr);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
      EXPECT_NE(st.message().find(words), std::string::npos) << what << ": " << st.to_string();
    };
    Status st = t->run(a1, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("run_chained"), std::string::npos) << st.to_string();
    r.tokens = 9;
    expect_refused("72 pairs", "outside its shapes");
    r.tokens = 2;
    if (!routes) {
      expect_refused("not an n8 tile", "outside its shapes");
      continue;
    }
    a1.a_row_index = i32;
    expect_refused("a row index", "a_row_index null");
    a1.a_row_index = nullptr;
    a1.problem.num_experts = a2.problem.num_experts = cfg.num_experts + 1;  // appended rows not asked for
    expect_refused("one expert too many", "does not hold");
    a1.problem.num_experts = a2.problem.num_experts = cfg.num_experts;
    r.pair_pos = nullptr;
    expect_refused("no pair_pos", "are all required");
  }
}

// An environment setting (FP4MOE_SM90_SPLIT_K, ...) for the scope of a test (restored to unset afterwards).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* v) : name_(name) { setenv(name, v, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};
class ScopedSplitK : public ScopedEnv {
 public:
  explicit ScopedSplitK(const char* v) : ScopedEnv("FP4MOE_SM90_SPLIT_K", v) {}
};

// FP4MOE_SM90_STAGE_WAIT=0, the control of docs/perf.md's sm90 step 45: each FC2 item of a chained launch
// waits for all of its token rows before its first copy instead of for each stage's before that stage's.
// The same bytes as the two launches and the reference, with the rows gathered or not, and with a folded
// last expert split or not.
TEST_F(Sm90Tactics, ChainedLaunchWaitingPerItemMatches) {
  ScopedEnv env("FP4MOE_SM90_STAGE_WAIT", "0");
  for (auto& t : tactics()) {
    progress(t->desc().name);
    run_chained_case(*t, 256, 1024, {5, 64, 0, 17, 1}, false, 41);
    run_chained_case(*t, 80, 208, {0, 1, 37, 8, 130, 3, 0, 300}, true, 42);
    run_folded_case(*t, 512, 1536, {}, 1, 44);
    run_folded_case(*t, 96, 512, {3, 0, 1, 17, 0, 2}, 9, 45);
  }
}

// The split reduction (split-K) forced to 2, 4 and 8 parts: every case against the reference, the
// decode tiles (BN <= 16) must have split (their partials were written), the others never; then the
// chained launch split the same way gives the bytes of the two split launches and leaves the whole
// workspace zero.
TEST_F(Sm90Tactics, SplitReductionMatchesReference) {
  for (const char* mode : {"2", "4", "8"}) {
    ScopedSplitK env(mode);
    for (auto& t : tactics()) {
      const std::string what = fmt::format("FP4MOE_SM90_SPLIT_K={} {}", mode, t->desc().name);
      SCOPED_TRACE(what);
      progress(what);
      int64_t touched = 0;
      for (const Case& c : cases()) run_case(*t, c, &touched);
      if (sm90::split_capable(t->desc().tile_n))
        EXPECT_GT(touched, 0) << "no item was split";
      else
        EXPECT_EQ(touched, 0);
      run_chained_case(*t, 256, 1024, {5, 64, 0, 17, 1}, false, 31);
      run_chained_case(*t, 96, 512, {1, 0, 0, 2, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 3}, true, 32);
    }
  }
  ScopedSplitK off("off");
  progress("FP4MOE_SM90_SPLIT_K=off, every tactic");
  for (auto& t : tactics()) {
    int64_t touched = 0;
    run_case(*t, cases()[2], &touched);
    EXPECT_EQ(touched, 0) << t->desc().name << " split with FP4MOE_SM90_SPLIT_K=off";
  }
}

TEST_F(Sm90Tactics, RefusesAMalformedSplitSetting) {
  for (const char* bad : {"3", "16", "x", "-2"}) {
    ScopedSplitK env(bad);
    for (auto& t : tactics()) {
      const Status st = t->init(GemmProblem{GemmOp::kFc2, 4, 128, 128, 16, 16});
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.to_string();
      EXPECT_NE(st.message().find("FP4MOE_SM90_SPLIT_K"), std::string::npos) << st.to_string();
    }
  }
}

// The FC2 throttle (LaunchParams::fc2_throttle, the e4m3 tile's chained FC2 weight copies waiting for FC1's
// rows D stages behind): the other cases run its default depth; here off and at its tightest (one stage),
// the same checks on the chained and folded cases.
TEST_F(Sm90Tactics, ChainedLaunchThrottleDepthsMatch) {
  int ran = 0;
  for (const char* depth : {"0", "1"}) {
    ScopedEnv env("FP4MOE_SM90_FC2_THROTTLE", depth);
    for (auto& t : tactics()) {
      if (t->desc().name.find("e4m3") == std::string::npos) continue;
      const std::string what = fmt::format("FP4MOE_SM90_FC2_THROTTLE={} {}", depth, t->desc().name);
      SCOPED_TRACE(what);
      progress(what);
      // FC2's K = I: 4, 3 and 2 k256 stages, so depth 1 waits at every stage after the first.
      run_chained_case(*t, 1024, 512, {5, 3, 0, 2, 1}, false, 51);
      run_chained_case(*t, 768, 256, {0, 1, 7, 3}, true, 52);
      run_folded_case(*t, 512, 1536, {}, 1, 53);
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no e4m3 tactic selected";
}

TEST_F(Sm90Tactics, RefusesAMalformedThrottleSetting) {
  for (const char* bad : {"x", "-1", "17", "3x"}) {
    ScopedEnv env("FP4MOE_SM90_FC2_THROTTLE", bad);
    for (auto& t : tactics()) {
      const Status st = t->init(GemmProblem{GemmOp::kFc2, 4, 128, 128, 16, 16});
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.to_string();
      EXPECT_NE(st.message().find("FP4MOE_SM90_FC2_THROTTLE"), std::string::npos) << st.to_string();
    }
  }
}

TEST_F(Sm90Tactics, ChainedLaunchRefusesMismatchedGemms) {
  for (auto& t : tactics()) {
    const GemmProblem p1{GemmOp::kFc1SwiGlu, 4, 128, 256, 16, 16};
    ASSERT_TRUE(t->init(p1).is_ok());
    GroupedGemmArgs a1, a2;
    a1.problem = p1;
    a2.problem = GemmProblem{GemmOp::kFc2, 4, 256, 64, 16, 16};  // K 64 is not FC1's N 128
    const Status st = t->run_chained(a1, a2, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("chained"), std::string::npos) << st.to_string();
  }
}

TEST_F(Sm90Tactics, DescriptorsMatchRegistrationAndCompiler) {
  std::vector<TacticDesc> descs;
  append_sm90_tactic_descs(descs);
  if (std::getenv("SM90_TACTICS_ONLY")) GTEST_SKIP() << "SM90_TACTICS_ONLY: not every tactic is here";
  ASSERT_EQ(descs.size(), tactics().size());
  for (size_t i = 0; i < descs.size(); ++i) {
    EXPECT_EQ(descs[i].name, tactics()[i]->desc().name);
    const bool e4m3 = descs[i].name.rfind("sm90.w4e4m3.", 0) == 0;
    EXPECT_EQ(descs[i].layout, e4m3 ? WeightLayout::kSm90E4m3 : WeightLayout::kSm90Interleaved) << descs[i].name;
    EXPECT_EQ(descs[i].tile_n, e4m3 ? 1 : descs[i].tile_n) << descs[i].name << ": one token per e4m3 item";
    const cudaFuncAttributes attr = sm90test::kernel_attributes(*tactics()[i]);
    EXPECT_GE(descs[i].req.regs_per_thread, attr.numRegs) << descs[i].name;
    EXPECT_EQ(attr.localSizeBytes, 0u) << descs[i].name << " uses local memory";
  }
}

TEST_F(Sm90Tactics, RefusesWhatItCannotDo) {
  const DeviceCaps caps = query_device_caps(0);
  for (auto& t : tactics()) {
    GemmProblem p;
    p.op = GemmOp::kFc2;
    p.num_experts = 600;
    p.n = 128;
    p.k = 128;
    p.total_rows = 16;
    TacticCheck c = t->check(p, caps);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.reason.find("experts"), std::string::npos) << c.reason;
    p.num_experts = 4;
    p.k = 24;
    c = t->check(p, caps);
    EXPECT_FALSE(c.ok);
    EXPECT_NE(c.reason.find("multiple of 16"), std::string::npos) << c.reason;
    // A device without sm_90a is refused before anything runs.
    EXPECT_FALSE(t->check(GemmProblem{GemmOp::kFc2, 4, 128, 128, 16, 16}, device_profile("a100")).ok);
  }
}

}  // namespace
}  // namespace fp4moe
