// The sm90 resident tactic (src/kernels/sm90_wgmma/sm90_cc.cu: one CTA per grouped row and 16 SwiGLU
// columns, math on the CUDA cores, the kSm90Cc layout) against the CPU reference, on the GPU:
//   - the device pack equals the CPU pack (pack_cc_cpu) byte for byte, for FC1 and FC2;
//   - FC1 and FC2 alone (run), FC1 gathering token rows (a_row_index), FC2 reading rows contiguously with
//     a padded row stride, experts with 0, 1 and more rows (the kernel computes any row count; one row per
//     expert is only check()'s speed rule, so these launches call run() directly);
//   - the chained launch (run_chained) on the TP8 decode shape (H = 6144, I = 256, 8 rows), on empty and
//     2-row experts, and on 45, 256 and 1024 experts with rows past the first 32 and on the last one (every
//     round of the warp's expert lookup); then the folded last expert (last_expert_weights), whose main
//     buffers hold only E - 1 experts; three launches back to back on one stream (no host sync between them),
//     adjacent and as the engine runs them (FC1's rows copied into the buffer FC2 writes), outlier tokens;
//     the spread form (one token's 8 routed rows and the folded expert's row, whose column pairs the routed
//     rows' CTAs compute) on small shapes and the TP8 one, and the launches the kernel must not spread (rows
//     of different tokens, the folded expert without its row);
//   - check() on this device: the decode shape passes; a hidden size off 1024, a SwiGLU width off 16, two
//     rows per expert, too many experts, too much shared memory and an sm_80 profile are refused with a
//     reason; the kernels use no local memory and no more registers than the descriptor declares;
//   - the chained launch leaving FC2's fp32 rows to the caller (fp32_rows_to_caller), beside each chained case;
//   - bad arguments (run before init, mismatched chained GEMMs, no workspace, ...) are refused with
//     kInvalidArgument before anything is launched.
// Every launch runs three times on outputs poisoned with 0xD5: rows past offsets[E] must stay poisoned and
// the workspace (row counters and fp32 rows, zeroed by each row's last CTA) must be all zero after each.
// FC1's output is deterministic: the same bytes from every launch, chained or not. FC2 adds its fp32 partial
// rows with atomics in a varying order, so its output is compared with the reference (on the device's FC1
// rows) within 5e-3 relative L2, as tests/sm90/tactics_test.cpp does, never byte for byte.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fp4moe/device_caps.h"
#include "fp4moe/dtype.h"
#include "fp4moe/reference.h"
#include "fp4moe/tactic.h"
#include "kernels/families.h"
#include "kernels/sm90_wgmma/sm90_cc.h"
#include "kernels/sm90_wgmma/sm90_cc_layout.h"
#include "kernels/sm90_wgmma/sm90_pack.h"
#include "sm90_test_util.h"

namespace fp4moe {
namespace {

using sm90test::DeviceBuffer;

// A fresh resident tactic, not initialised (the registration hook gives exactly one).
std::unique_ptr<GroupedGemmTactic> make_cc_tactic() {
  std::vector<std::unique_ptr<GroupedGemmTactic>> v;
  append_sm90_cc_tactics(v);
  if (v.size() != 1) throw std::runtime_error(fmt::format("append_sm90_cc_tactics gave {} tactics, not 1", v.size()));
  return std::move(v.front());
}
// The tactic the tests share; each case initialises it before running it.
GroupedGemmTactic& cc_tactic() {
  static const std::unique_ptr<GroupedGemmTactic> t = make_cc_tactic();
  return *t;
}

// FC1 (K = hidden, N = inter, SwiGLU) or FC2 (K = inter, N = hidden) of an MLP.
GemmProblem mlp_problem(GemmOp op, int64_t experts, int64_t hidden, int64_t inter, int64_t rows, int64_t max_rows) {
  const bool fc1 = op == GemmOp::kFc1SwiGlu;
  return GemmProblem{op, experts, fc1 ? inter : hidden, fc1 ? hidden : inter, rows, max_rows};
}
GemmProblem with_experts(GemmProblem p, int64_t experts) {
  p.num_experts = experts;
  return p;
}

// Grouped rows: expert e owns rows [offsets[e], offsets[e + 1]), and 3 rows of capacity lie past offsets[E].
struct Rows {
  std::vector<int32_t> offsets;
  int64_t used = 0, total = 0, max_per_expert = 0;
};
Rows grouped_rows(const std::vector<int>& per_expert) {
  Rows g;
  g.offsets.assign(per_expert.size() + 1, 0);
  for (size_t e = 0; e < per_expert.size(); ++e) {
    g.offsets[e + 1] = g.offsets[e] + per_expert[e];
    g.max_per_expert = std::max<int64_t>(g.max_per_expert, per_expert[e]);
  }
  g.used = g.offsets.back();
  g.total = g.used + 3;
  return g;
}
// "E=6 rows=[1,0,2,1,0,3]"; past 16 experts only those with rows, as expert:rows.
std::string rows_name(const std::vector<int>& rows) {
  const bool sparse = rows.size() > 16;
  std::string s;
  for (size_t e = 0; e < rows.size(); ++e) {
    if (sparse && rows[e] == 0) continue;
    if (!s.empty()) s += ",";
    s += sparse ? fmt::format("{}:{}", e, rows[e]) : std::to_string(rows[e]);
  }
  return fmt::format("E={} rows=[{}]", rows.size(), s);
}

// One GEMM's weights over p.num_experts experts: random canonical NVFP4 (sm90test::random_weights), packed on
// the device by the kSm90Cc layout's own pack, and their tensor scales; the CPU copy feeds the reference.
struct CcGemm {
  GemmProblem p;
  sm90test::RandomWeights w;
  DeviceBuffer packed, ts;
};
CcGemm cc_gemm(const GemmProblem& p, std::mt19937& rng) {
  const WeightLayoutOps* ops = sm90_cc_weight_layout_ops();
  CcGemm g{p, sm90test::random_weights(p, rng), DeviceBuffer(ops->bytes(p)), DeviceBuffer(0)};
  g.ts = DeviceBuffer(g.w.tensor_scales.size() * 4);
  g.ts.upload(g.w.tensor_scales.data(), g.ts.size());
  DeviceBuffer canonical(g.w.canonical.size());
  canonical.upload(g.w.canonical.data(), canonical.size());
  const Status st = ops->pack(p, canonical.get(), g.packed.get(), nullptr);
  if (!st.is_ok()) throw std::runtime_error(st.to_string());
  SM90_CUDA_OK(cudaDeviceSynchronize());
  return g;
}

// A GEMM's weights as a launch reads them: all E experts in `main`, or (folded) the first E - 1 there and the
// last from its own buffers, so that reading expert E - 1 from the main buffers would fall past their end.
struct CcWeights {
  CcGemm main;
  std::optional<CcGemm> last;

  void bind(GroupedGemmArgs* a) const {
    a->weights = main.packed.get();
    a->tensor_scales = static_cast<const float*>(main.ts.get());
    a->last_expert_weights = last ? last->packed.get() : nullptr;
    a->last_expert_scales = last ? static_cast<const float*>(last->ts.get()) : nullptr;
  }
  // Expert e's reference row: x [K] -> out [N].
  void reference_row(int64_t e, const float* x, float* out) const {
    const bool own = last && e == main.p.num_experts;
    const CcGemm& g = own ? *last : main;
    sm90test::reference_row(g.p, g.w, own ? 0 : e, x, out);
  }
};
CcWeights cc_weights(const GemmProblem& p, bool fold, std::mt19937& rng) {
  CcWeights w{cc_gemm(with_experts(p, p.num_experts - (fold ? 1 : 0)), rng), std::nullopt};
  if (fold) w.last = cc_gemm(with_experts(p, 1), rng);
  return w;
}

std::vector<uint16_t> random_bf16(int64_t n, std::mt19937& rng) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : v) x = f32_to_bf16_bits(u(rng));
  return v;
}
// Indices of grouped rows into `tokens` token rows (the gather of FC1's rows).
std::vector<int32_t> random_rows(int64_t rows, int64_t tokens, std::mt19937& rng) {
  std::vector<int32_t> v(static_cast<size_t>(rows));
  for (auto& r : v) r = static_cast<int32_t>(rng() % static_cast<uint32_t>(tokens));
  return v;
}
template <class T>
DeviceBuffer device_copy(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(16, v.size() * sizeof(T)));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
std::vector<uint16_t> download_bf16(const DeviceBuffer& b) {
  std::vector<uint16_t> v(b.size() / 2);
  b.download(v.data(), v.size() * 2);
  return v;
}

// The CPU reference of rows [0, used): problem row r of expert e reads row row_index[r] of a (row r when
// row_index is empty), a_ld elements apart.
std::vector<float> reference(const CcWeights& w, const Rows& g, const std::vector<uint16_t>& a, int64_t a_ld,
                             const std::vector<int32_t>& row_index) {
  const int64_t n = w.main.p.n, k = w.main.p.k, E = static_cast<int64_t>(g.offsets.size()) - 1;
  std::vector<float> ref(static_cast<size_t>(g.used * n)), x(static_cast<size_t>(k));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = g.offsets[e]; r < g.offsets[e + 1]; ++r) {
      const int64_t src = row_index.empty() ? r : row_index[r];
      for (int64_t i = 0; i < k; ++i) x[i] = bf16_bits_to_f32(a[src * a_ld + i]);
      w.reference_row(e, x.data(), ref.data() + r * n);
    }
  return ref;
}

// A launch's output (rows of n bf16) against the reference: rows [0, used) within 5e-3 relative L2 (the first
// few far-off values named), the rows past them still poisoned.
void expect_output(const std::vector<uint16_t>& out, const std::vector<float>& ref, int64_t used, int64_t n,
                   const char* what) {
  std::vector<float> got(ref.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_bits_to_f32(out[i]);
  const double err = relative_l2_error(got.data(), ref.data(), used * n);
  EXPECT_LE(err, 5e-3) << what << ": relative L2 error " << err;
  for (int64_t i = 0, shown = 0; !(err <= 5e-3) && i < used * n && shown < 8; ++i)
    if (!(std::fabs(got[i] - ref[i]) <= 1e-2f * (std::fabs(ref[i]) + 1e-2f))) {
      ADD_FAILURE() << what << " row " << i / n << " col " << i % n << ": got " << got[i] << " want " << ref[i];
      ++shown;
    }
  const auto written = std::find_if(out.begin() + used * n, out.end(), [](uint16_t v) { return v != 0xD5D5; });
  EXPECT_TRUE(written == out.end()) << what << ": row " << (written - out.begin()) / n << " past offsets[E] written";
}

// Every row's last CTA zeroes its counter and fp32 row: the whole workspace is zero after each launch.
void expect_workspace_zero(const DeviceBuffer& ws) {
  std::vector<uint8_t> v(ws.size());
  ws.download(v.data(), v.size());
  const auto nonzero = std::find_if(v.begin(), v.end(), [](uint8_t b) { return b != 0; });
  EXPECT_TRUE(nonzero == v.end()) << "workspace byte " << (nonzero - v.begin()) << " of " << v.size()
                                  << " not zero after the launch";
}

// The shape is one check() accepts on this device at one row per expert (its speed rule): the launches
// below run their real row counts through run() and run_chained(), which do not check.
void expect_shape_accepted(const GemmProblem& p) {
  GemmProblem one = p;
  one.max_rows_per_expert = 1;
  const TacticCheck c = cc_tactic().check(one, query_device_caps(0));
  ASSERT_TRUE(c.ok) << one.to_string() << ": " << c.reason;
}

// One GEMM's arguments on a test's buffers: rows grouped by `offsets`, read from `a` (through `row_index`
// when not null) a_ld elements apart, written to `out`; the workspace and the weights (CcWeights::bind).
GroupedGemmArgs gemm_args(const GemmProblem& p, const DeviceBuffer& offsets, const uint16_t* a,
                          const int32_t* row_index, int64_t a_ld, uint16_t* out, const DeviceBuffer& ws,
                          const CcWeights& w) {
  GroupedGemmArgs args;
  args.problem = p;
  args.expert_offsets = offsets.as<const int32_t>();
  args.a = a;
  args.a_row_index = row_index;
  args.a_ld = a_ld;
  args.out = out;
  args.workspace = ws.get();
  w.bind(&args);
  return args;
}
// A chained launch's two: FC1 reads x (hidden apart, through row_index when not null) into h, FC2 reads h into y.
std::pair<GroupedGemmArgs, GroupedGemmArgs> chain_args(const GemmProblem& p1, const GemmProblem& p2,
                                                       const DeviceBuffer& offsets, const uint16_t* x,
                                                       const int32_t* row_index, uint16_t* h, uint16_t* y,
                                                       const DeviceBuffer& ws, const CcWeights& w1,
                                                       const CcWeights& w2) {
  const GroupedGemmArgs a1 = gemm_args(p1, offsets, x, row_index, p1.k, h, ws, w1);
  return {a1, gemm_args(p2, offsets, a1.out, nullptr, p2.k, y, ws, w2)};
}

// One GEMM (run) over experts with rows[e] rows: row r reads row_index[r] of fewer token rows (gather) or
// row r, a_ld = K + a_pad apart. Three launches, each within 5e-3 of the reference; FC1 the same bytes
// each time.
void run_single_case(GemmOp op, const std::vector<int>& rows, int64_t hidden, int64_t inter, bool gather,
                     int64_t a_pad, uint32_t seed) {
  GroupedGemmTactic& t = cc_tactic();
  const Rows g = grouped_rows(rows);
  const GemmProblem p =
      mlp_problem(op, static_cast<int64_t>(rows.size()), hidden, inter, g.total, g.max_per_expert);
  SCOPED_TRACE(fmt::format("{} H={} I={} {} gather={} a_ld=K+{}", gemm_op_name(op), hidden, inter, rows_name(rows),
                           gather, a_pad));
  ASSERT_NO_FATAL_FAILURE(expect_shape_accepted(p));
  const Status init = t.init(p);
  ASSERT_TRUE(init.is_ok()) << init.to_string();
  std::mt19937 rng(seed);
  const CcWeights w = cc_weights(p, false, rng);
  const int64_t a_ld = p.k + a_pad, tokens = gather ? g.used / 2 + 2 : g.total;
  const std::vector<uint16_t> a = random_bf16(tokens * a_ld, rng);
  const std::vector<int32_t> row_index = gather ? random_rows(g.total, tokens, rng) : std::vector<int32_t>();
  const DeviceBuffer d_a = device_copy(a), d_off = device_copy(g.offsets), d_idx = device_copy(row_index);
  DeviceBuffer d_out(static_cast<size_t>(g.total * p.n * 2)), d_ws(t.workspace_bytes(p));
  d_ws.fill(0);
  const int32_t* index = gather ? d_idx.as<const int32_t>() : nullptr;
  const GroupedGemmArgs args =
      gemm_args(p, d_off, d_a.as<const uint16_t>(), index, a_ld, d_out.as<uint16_t>(), d_ws, w);
  const std::vector<float> ref = reference(w, g, a, a_ld, row_index);
  std::vector<uint16_t> first;
  for (int launch = 0; launch < 3; ++launch) {
    SCOPED_TRACE(fmt::format("launch {}", launch));
    d_out.fill(0xD5);
    const Status st = t.run(args, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    SM90_CUDA_OK(cudaDeviceSynchronize());
    expect_workspace_zero(d_ws);
    const std::vector<uint16_t> out = download_bf16(d_out);
    expect_output(out, ref, g.used, p.n, gemm_op_name(op));
    if (launch == 0) first = out;
    if (op == GemmOp::kFc1SwiGlu) {
      EXPECT_TRUE(out == first) << "FC1's output differs from launch 0's";
    }
  }
}

// FC1 then FC2 over experts with rows[e] rows, the last expert's weights in their own buffers when `fold`:
// three times the two launches (run, run), then three times the chained launch (run_chained). Every h (FC1's
// output) the same bytes as the first, within 5e-3 of the reference on the token rows (gathered or not);
// every y within 5e-3 of the reference on that h. one_token (with gather): every row reads token row 0, as
// the engine's rows at T = 1 do.
void run_chain_case(const std::vector<int>& rows, int64_t hidden, int64_t inter, bool gather, bool fold,
                    uint32_t seed, bool one_token = false) {
  GroupedGemmTactic& t = cc_tactic();
  ASSERT_TRUE(t.can_chain());
  const Rows g = grouped_rows(rows);
  const int64_t E = static_cast<int64_t>(rows.size());
  const GemmProblem p1 = mlp_problem(GemmOp::kFc1SwiGlu, E, hidden, inter, g.total, g.max_per_expert),
                    p2 = mlp_problem(GemmOp::kFc2, E, hidden, inter, g.total, g.max_per_expert);
  SCOPED_TRACE(fmt::format("chain H={} I={} {} gather={} fold={} one_token={}", hidden, inter, rows_name(rows), gather,
                           fold, one_token));
  for (const GemmProblem& p : {p1, p2}) {
    ASSERT_NO_FATAL_FAILURE(expect_shape_accepted(p));
    const Status init = t.init(p);
    ASSERT_TRUE(init.is_ok()) << init.to_string();
  }
  std::mt19937 rng(seed);
  const CcWeights w1 = cc_weights(p1, fold, rng), w2 = cc_weights(p2, fold, rng);
  const int64_t tokens = one_token ? 1 : (gather ? g.used / 2 + 2 : g.total);
  const std::vector<uint16_t> x = random_bf16(tokens * hidden, rng);
  const std::vector<int32_t> row_index = gather ? random_rows(g.total, tokens, rng) : std::vector<int32_t>();
  const DeviceBuffer d_x = device_copy(x), d_off = device_copy(g.offsets), d_idx = device_copy(row_index);
  DeviceBuffer d_h(static_cast<size_t>(g.total * inter * 2)), d_y(static_cast<size_t>(g.total * hidden * 2)),
      d_ws(std::max(t.workspace_bytes(p1), t.workspace_bytes(p2)));
  d_ws.fill(0);
  const int32_t* index = gather ? d_idx.as<const int32_t>() : nullptr;
  const auto [a1, a2] = chain_args(p1, p2, d_off, d_x.as<const uint16_t>(), index, d_h.as<uint16_t>(),
                                   d_y.as<uint16_t>(), d_ws, w1, w2);
  const std::vector<float> ref1 = reference(w1, g, x, hidden, row_index);
  std::vector<uint16_t> h_first;
  std::vector<float> ref2;
  // Mode 2: the chained launch leaving FC2's fp32 rows in the workspace (fp32_rows_to_caller); the test then
  // does the caller's part: the rows rounded to bf16 are FC2's output, then zeroed. y stays poisoned.
  GroupedGemmArgs a1_rows = a1;
  a1_rows.fp32_rows_to_caller = true;
  const int64_t rows_at = t.fp32_rows_offset(p1);
  ASSERT_GE(rows_at, 0);
  for (const int mode : {0, 1, 2})
    for (int launch = 0; launch < 3; ++launch) {
      const bool chained = mode > 0;
      SCOPED_TRACE(fmt::format("{} launch {}", mode == 0 ? "two-launch" : (mode == 1 ? "chained" : "chained, fp32 rows"),
                               launch));
      d_h.fill(0xD5);
      d_y.fill(0xD5);
      Status st = chained ? t.run_chained(mode == 2 ? a1_rows : a1, a2, nullptr) : t.run(a1, nullptr);
      if (st.is_ok() && !chained) st = t.run(a2, nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      SM90_CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint16_t> y32;  // mode 2: the fp32 rows rounded to bf16
      if (mode == 2) {
        std::vector<uint8_t> ws(d_ws.size());
        d_ws.download(ws.data(), ws.size());
        ASSERT_TRUE(std::all_of(ws.begin(), ws.begin() + rows_at, [](uint8_t b) { return b == 0; }))
            << "row counters touched";
        y32.assign(static_cast<size_t>(g.total * hidden), 0xD5D5);
        for (int64_t i = 0; i < g.used * hidden; ++i) {
          float v;
          std::memcpy(&v, ws.data() + rows_at + 4 * i, 4);
          y32[i] = f32_to_bf16_bits(v);
        }
        // Nothing but the used rows' fp32 sums in the workspace.
        const size_t used_end = static_cast<size_t>(rows_at + 4 * g.used * hidden);
        EXPECT_TRUE(std::all_of(ws.begin() + static_cast<std::ptrdiff_t>(used_end), ws.end(),
                                [](uint8_t b) { return b == 0; }))
            << "workspace written past the used rows";
        const std::vector<uint16_t> untouched = download_bf16(d_y);
        EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == 0xD5D5; }))
            << "FC2's bf16 output written with fp32_rows_to_caller";
        d_ws.fill(0);  // the caller zeroes the rows
      }
      expect_workspace_zero(d_ws);
      const std::vector<uint16_t> h = download_bf16(d_h), y = mode == 2 ? y32 : download_bf16(d_y);
      if (h_first.empty()) {
        expect_output(h, ref1, g.used, inter, "FC1");
        h_first = h;
        ref2 = reference(w2, g, h_first, inter, {});
      }
      // The spread form (one token, the folded expert's row R last) sums row R's FC1 in another order than
      // its own CTAs do: that row against the reference only.
      const size_t exact = static_cast<size_t>((one_token && fold && chained ? g.used - 1 : g.used) * inter);
      ASSERT_TRUE(std::equal(h.begin(), h.begin() + exact, h_first.begin()))
          << "FC1's output differs from the first two-launch run's";
      if (exact < static_cast<size_t>(g.used * inter)) expect_output(h, ref1, g.used, inter, "FC1");
      expect_output(y, ref2, g.used, hidden, "FC2");
    }
}

// E experts without rows but `rows` rows on each of `busy`.
std::vector<int> sparse_rows(int experts, std::initializer_list<std::pair<int, int>> busy) {
  std::vector<int> rows(static_cast<size_t>(experts), 0);
  for (const auto& [e, n] : busy) rows[static_cast<size_t>(e)] = n;
  return rows;
}

TEST(Sm90CcTactic, DescriptorAndKernelResources) {
  GroupedGemmTactic& t = cc_tactic();
  const TacticDesc& d = t.desc();
  EXPECT_EQ(d.name, sm90::kCcTacticName);
  EXPECT_EQ(d.layout, WeightLayout::kSm90Cc);
  EXPECT_EQ(d.req.max_rows_per_expert, 1);
  EXPECT_TRUE(t.can_chain());
  std::vector<TacticDesc> descs;
  append_sm90_cc_tactic_descs(descs);
  ASSERT_EQ(descs.size(), 1u);
  EXPECT_EQ(descs[0].name, d.name);
  EXPECT_NE(find_tactic(sm90::kCcTacticName), nullptr) << "the registry does not hold the resident tactic";
  EXPECT_EQ(find_weight_layout_ops(WeightLayout::kSm90Cc), sm90_cc_weight_layout_ops());
  cudaFuncAttributes attr{};
  const Status st = sm90::cc_kernel_resources(&attr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(attr.localSizeBytes, 0u) << "the resident kernels use local memory";
  EXPECT_LE(attr.numRegs, d.req.regs_per_thread);
}

TEST(Sm90CcTactic, DevicePackEqualsCpuPack) {
  const WeightLayoutOps* ops = sm90_cc_weight_layout_ops();
  ASSERT_NE(ops, nullptr);
  EXPECT_EQ(ops->layout, WeightLayout::kSm90Cc);
  std::mt19937 rng(11);
  for (const GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    const GemmProblem p = mlp_problem(op, 3, 2048, 48, 4, 1);
    SCOPED_TRACE(p.to_string());
    const CcGemm g = cc_gemm(p, rng);
    const std::vector<uint8_t> cpu = sm90::pack_cc_cpu(p, g.w.canonical.data());
    ASSERT_EQ(ops->bytes(p), cpu.size());
    std::vector<uint8_t> gpu(cpu.size());
    g.packed.download(gpu.data(), gpu.size());
    const auto diff = std::mismatch(cpu.begin(), cpu.end(), gpu.begin());
    EXPECT_TRUE(diff.first == cpu.end()) << "the device pack differs from the CPU pack at byte "
                                         << (diff.first - cpu.begin()) << " (chunk "
                                         << (diff.first - cpu.begin()) / sm90::kCcChunkBytes << ")";
  }
  // A shape the layout cannot hold is refused by both packs, before the device pack launches anything.
  const GemmProblem bad = mlp_problem(GemmOp::kFc1SwiGlu, 3, 1536, 48, 4, 1);
  DeviceBuffer buf(1 << 12);
  const Status st = ops->pack(bad, buf.get(), buf.get(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  const std::vector<uint8_t> canonical(1 << 12);
  EXPECT_THROW(sm90::pack_cc_cpu(bad, canonical.data()), std::invalid_argument);
}

TEST(Sm90CcTactic, SingleGemmsMatchReference) {
  run_single_case(GemmOp::kFc1SwiGlu, {1, 0, 2, 1, 0, 3}, 2048, 64, true, 0, 21);
  run_single_case(GemmOp::kFc2, {1, 0, 2, 1, 0, 3}, 2048, 64, false, 8, 22);
  // One part (I = 16) and one FC2 chunk (H = 1024): FC1 contiguous and padded, FC2 gathered. (Twelve rows:
  // with a few dozen bf16 outputs, one rounding step on a large value would weigh on the relative L2 alone.)
  run_single_case(GemmOp::kFc1SwiGlu, {5, 3, 0, 4}, 1024, 16, false, 8, 23);
  run_single_case(GemmOp::kFc2, {5, 3, 0, 4}, 1024, 16, true, 0, 24);
}

// The TP8 shard at T = 1: 8 rows of one token each, 16 parts: 128 CTAs with 190,808 bytes of shared memory
// each. A test of its own: scripts/gpu_check.sh leaves it out of racecheck, whose run time grows with each
// CTA's shared-memory traffic (memcheck runs it).
TEST(Sm90CcTactic, ChainedLaunchOnTheTp8DecodeShape) {
  run_chain_case(std::vector<int>(8, 1), 6144, 256, true, false, 31);
}

TEST(Sm90CcTactic, ChainedLaunchMatchesReference) {
  run_chain_case({2, 0, 1, 2, 0, 0, 2}, 1024, 32, false, false, 32);
  run_chain_case({8}, 1024, 16, false, false, 33);  // one part: each CTA is its row's last
  run_chain_case({1, 0, 1, 1}, 3072, 32, true, false, 37);  // hidden 3072: an odd count of FC2 chunks (3)
  // The lookup's lane l reads the bounds of experts 32j + l, j = 0..31, the index clamped to offsets[E], and
  // counts those below E at or under the row. 45 experts: rows in both rounds (j = 0, 1) and on the last.
  run_chain_case(sparse_rows(45, {{1, 2}, {4, 1}, {8, 3}, {16, 1}, {31, 1}, {32, 2}, {33, 1}, {40, 1}, {44, 2}}),
                 1024, 32, true, false, 34);
  // GLM-5's 256 experts (8 rounds) and the most the lookup takes, 1024 (all 32).
  run_chain_case(sparse_rows(256, {{0, 1}, {7, 1}, {8, 2}, {100, 1}, {254, 1}, {255, 1}}), 1024, 32, true, false, 35);
  run_chain_case(sparse_rows(1024, {{0, 1}, {31, 1}, {32, 1}, {511, 2}, {992, 1}, {1023, 1}}), 1024, 32, true, false,
                 36);
}

// Three chained launches back to back on one stream, no host sync between them, so that each starts on the
// workspace its predecessor left, scheduled early by programmatic dependent launch where the launches are
// adjacent. in_place: as the engine runs it at T = 1, the grouped token rows copied into the buffer FC2
// writes (the engine's y) before each launch, FC1 reading them there without an index; else FC1 reads its
// own buffer and the launches follow each other directly. Every used token row has an element 1000 times its
// others (the prescale's range). The last launch against the reference.
void run_back_to_back(bool in_place, uint32_t seed) {
  SCOPED_TRACE(in_place ? "in place, a copy before each launch" : "launches adjacent");
  GroupedGemmTactic& t = cc_tactic();
  const std::vector<int> rows = {1, 0, 1, 1, 0, 1, 1, 1};
  const int64_t hidden = 2048, inter = 128, E = static_cast<int64_t>(rows.size());
  const Rows g = grouped_rows(rows);
  const GemmProblem p1 = mlp_problem(GemmOp::kFc1SwiGlu, E, hidden, inter, g.total, g.max_per_expert),
                    p2 = mlp_problem(GemmOp::kFc2, E, hidden, inter, g.total, g.max_per_expert);
  for (const GemmProblem& p : {p1, p2}) ASSERT_TRUE(t.init(p).is_ok());
  std::mt19937 rng(seed);
  const CcWeights w1 = cc_weights(p1, false, rng), w2 = cc_weights(p2, false, rng);
  std::vector<uint16_t> x = random_bf16(g.total * hidden, rng);
  for (int64_t r = 0; r < g.used; ++r)
    x[r * hidden + (97 * r + 5) % hidden] = f32_to_bf16_bits(r % 2 ? -1000.f : 1000.f);
  std::fill(x.begin() + g.used * hidden, x.end(), uint16_t{0xD5D5});  // the rows past offsets[E]: never read
  const DeviceBuffer d_x = device_copy(x), d_off = device_copy(g.offsets);
  DeviceBuffer d_h(static_cast<size_t>(g.total * inter * 2)), d_y(x.size() * 2),
      d_ws(std::max(t.workspace_bytes(p1), t.workspace_bytes(p2)));
  d_ws.fill(0);
  d_h.fill(0xD5);
  d_y.fill(0xD5);
  const auto [a1, a2] = chain_args(p1, p2, d_off, in_place ? d_y.as<const uint16_t>() : d_x.as<const uint16_t>(),
                                   nullptr, d_h.as<uint16_t>(), d_y.as<uint16_t>(), d_ws, w1, w2);
  for (int launch = 0; launch < 3; ++launch) {
    if (in_place) SM90_CUDA_OK(cudaMemcpyAsync(d_y.get(), d_x.get(), x.size() * 2, cudaMemcpyDeviceToDevice, nullptr));
    const Status st = t.run_chained(a1, a2, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  SM90_CUDA_OK(cudaDeviceSynchronize());
  expect_workspace_zero(d_ws);
  const std::vector<uint16_t> h = download_bf16(d_h), y = download_bf16(d_y);
  expect_output(h, reference(w1, g, x, hidden, {}), g.used, inter, "FC1");
  expect_output(y, reference(w2, g, h, inter, {}), g.used, hidden, "FC2");
}

TEST(Sm90CcTactic, ChainedLaunchesBackToBack) {
  run_back_to_back(false, 52);
  run_back_to_back(true, 51);
}

TEST(Sm90CcTactic, FoldedLastExpertMatchesReference) {
  run_chain_case({1, 0, 1, 1, 1}, 2048, 64, false, true, 41);
  run_chain_case({0, 2, 1, 0, 2}, 1024, 32, true, true, 42);
  // No rows on the folded expert: its own buffers are never read.
  run_chain_case({1, 1, 0, 2, 0}, 1024, 32, false, true, 43);
}

// The chained launch's spread form: 8 routed rows and the folded last expert's one row, every row reading
// the same token through the index, so the 8 x parts CTAs also hold the last expert's inter / 2 column pairs
// and its row's CTAs leave at once. Then the same launches where the kernel must keep each row's own CTAs:
// the rows reading different tokens, and 9 rows of which the last expert holds none.
TEST(Sm90CcTactic, SpreadFoldedExpertMatchesReference) {
  run_chain_case(std::vector<int>(9, 1), 1024, 32, true, true, 44, true);
  run_chain_case(std::vector<int>(9, 1), 3072, 16, true, true, 45, true);  // one part, an odd FC2 chunk count
  run_chain_case(std::vector<int>(9, 1), 2048, 64, true, true, 46, false);
  run_chain_case({2, 1, 1, 1, 1, 1, 1, 1, 0}, 1024, 32, true, true, 47, true);
}
// The TP8 shard at T = 1 with its shared expert folded in, spread: 128 CTAs with 216,920 bytes of shared
// memory each (not under racecheck, as the other TP8 case).
TEST(Sm90CcTactic, SpreadFoldedExpertOnTheTp8DecodeShape) {
  run_chain_case(std::vector<int>(9, 1), 6144, 256, true, true, 48, true);
}

TEST(Sm90CcTactic, CheckAcceptsTheDecodeShapeAndRefusesOthers) {
  const GroupedGemmTactic& t = cc_tactic();
  const DeviceCaps caps = query_device_caps(0);
  for (const GemmOp op : {GemmOp::kFc1SwiGlu, GemmOp::kFc2}) {
    SCOPED_TRACE(gemm_op_name(op));
    // TP8 at T = 1: 256 experts, I = 256, H = 6144, 8 rows, one row per expert.
    const TacticCheck ok = t.check(mlp_problem(op, 256, 6144, 256, 8, 1), caps);
    EXPECT_TRUE(ok.ok) << ok.reason;
    auto expect_refused = [&](const GemmProblem& p, const DeviceCaps& c, const char* words) {
      const TacticCheck r = t.check(p, c);
      EXPECT_FALSE(r.ok) << p.to_string() << " on " << c.name;
      EXPECT_NE(r.reason.find(words), std::string::npos) << p.to_string() << ": " << r.reason;
    };
    expect_refused(mlp_problem(op, 256, 1536, 256, 8, 1), caps, "1024");
    expect_refused(mlp_problem(op, 256, 6144, 24, 8, 1), caps, "16");
    expect_refused(mlp_problem(op, 256, 6144, 256, 8, 2), caps, "rows per expert");
    expect_refused(mlp_problem(op, 2000, 6144, 256, 8, 1), caps, "experts");
    expect_refused(mlp_problem(op, 256, 8192, 256, 8, 1), caps, "shared memory");
    expect_refused(mlp_problem(op, 256, 6144, 256, 8, 1), device_profile("a100"), "sm_90");
  }
}

TEST(Sm90CcTactic, RefusesBadArguments) {
  const GemmProblem p1 = mlp_problem(GemmOp::kFc1SwiGlu, 4, 1024, 32, 4, 1),
                    p2 = mlp_problem(GemmOp::kFc2, 4, 1024, 32, 4, 1);
  DeviceBuffer buf(1 << 16);
  GroupedGemmArgs a1, a2;
  a1.problem = p1;
  a1.expert_offsets = buf.as<const int32_t>();
  a1.a = buf.as<const uint16_t>();
  a1.a_ld = p1.k;
  a1.weights = buf.get();
  a1.tensor_scales = buf.as<const float>();
  a1.out = buf.as<uint16_t>();
  a1.workspace = buf.get();
  a2 = a1;
  a2.problem = p2;
  a2.a_ld = p2.k;
  auto expect_refused = [](const Status& st, const char* what, const char* words) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
    EXPECT_NE(st.message().find(words), std::string::npos) << what << ": " << st.to_string();
  };
  {
    // A tactic of its own: the shared one may already be initialised.
    const std::unique_ptr<GroupedGemmTactic> fresh = make_cc_tactic();
    expect_refused(fresh->run(a1, nullptr), "run before init", "init()");
    expect_refused(fresh->run_chained(a1, a2, nullptr), "run_chained before init", "init()");
  }
  GroupedGemmTactic& t = cc_tactic();
  ASSERT_TRUE(t.init(p1).is_ok());
  GroupedGemmArgs b = a2;
  b.problem.k = 64;  // FC2's K is not FC1's N
  expect_refused(t.run_chained(a1, b, nullptr), "FC2's K off FC1's N", "chained");
  b = a2;
  b.expert_offsets = buf.as<const int32_t>() + 4;
  expect_refused(t.run_chained(a1, b, nullptr), "other offsets", "chained");
  expect_refused(t.run_chained(a2, a1, nullptr), "FC2 first", "chained");
  b = a2;
  b.workspace = nullptr;
  expect_refused(t.run(b, nullptr), "FC2 without a workspace", "workspace");
  b = a1;
  b.workspace = nullptr;
  expect_refused(t.run_chained(b, a2, nullptr), "chain without a workspace", "workspace");
  b = a1;
  b.a = a1.a + 1;  // 2 bytes off
  expect_refused(t.run(b, nullptr), "misaligned activations", "16-byte");
  b = a1;
  b.a_ld = p1.k + 4;
  expect_refused(t.run(b, nullptr), "a_ld not a multiple of 8", "a_ld");
  b = a1;
  b.last_expert_weights = buf.get();  // without its tensor scales
  expect_refused(t.run(b, nullptr), "half a folded expert", "both or neither");
  b.last_expert_scales = buf.as<const float>();
  expect_refused(t.run_chained(b, a2, nullptr), "the folded expert for FC1 only", "for both GEMMs or for neither");
  b = a2;
  b.out = a2.out + 1;  // 2 bytes off: the last CTA's 8-byte stores
  expect_refused(t.run(b, nullptr), "misaligned output", "16-byte");
  b = a1;
  b.problem.k = 1536;
  b.a_ld = 1536;
  expect_refused(t.run(b, nullptr), "hidden 1536", "1024");
  b = a1;
  b.problem.num_experts = 2000;
  expect_refused(t.run(b, nullptr), "2000 experts", "unsupported problem");
  DecodeRouting routing;
  b = a1;
  b.routing = &routing;
  expect_refused(t.run(b, nullptr), "routing", "routing");
  expect_refused(t.run_chained(b, a2, nullptr), "routing in the chain", "routing");
  b = a2;
  b.fp32_rows_to_caller = true;
  expect_refused(t.run(b, nullptr), "fp32 rows outside a chained launch", "run_chained");
  SM90_CUDA_OK(cudaDeviceSynchronize());  // nothing was launched, nothing failed
}

}  // namespace
}  // namespace fp4moe
