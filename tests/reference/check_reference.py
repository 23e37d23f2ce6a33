#!/usr/bin/env python3
"""The CPU reference (routing and the whole MoE forward) against an independent NumPy implementation.

usage: check_reference.py REFERENCE_TOOL WORKDIR

For each case of a matrix (tokens, experts, top-k, both routing families, group limits, correction bias,
shared expert in NVFP4 or bf16, experts that get no token and are not materialised, H and I multiples of
16 but not of 64) this script writes random inputs as raw little-endian files plus case.json, runs
`reference_tool forward DIR` (which quantises the fp32 weights to NVFP4 with the library's quantiser, runs
moe_forward_reference and writes the packed weights it used), and recomputes everything here:
  - NVFP4 weights are decoded from the dumped codes / block scales / tensor scales with ml_dtypes
    (float4_e2m1fn, float8_e4m3fn), independently of the C++ decoder;
  - router logits, routing and the forward are computed in float64, rounding to bf16 (ml_dtypes.bfloat16)
    only where the specification rounds: R1 (x), R3 (SwiGLU output), R4 (expert output), R5 (layer output).
Checks: routing ids exactly (inputs are drawn so that no selection boundary has a near-tie, except in the
"ties" cases where ties are exact and must go to the lower index), weights to 1e-5 relative, computed
logits to 1e-5, layer output relative L2 <= 1e-2 and, since both sides round at the same points, <= 1e-3;
on the larger cases the script also shows that leaving out R3 in NumPy would break the 1e-3 bound.

It also checks the synthetic generator (`reference_tool synthetic DIR`) byte for byte against a
re-implementation of the formulas in include/fp4moe/synthetic_hash.h and synthetic_values.h.
"""
import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
TIE_MARGIN = 1e-5       # minimum gap at every selection boundary in the float64 scores
WEIGHT_RTOL = 1e-5
LOGIT_RTOL = 1e-5
OUT_L2 = 1e-2           # the project's per-layer bound
OUT_L2_STRICT = 1e-3    # both sides round at the same points, so they agree far better than OUT_L2;
                        # dropping one rounding point (e.g. R3) costs ~3e-3, which this bound catches


def bf16(a):
    """Round to bf16 (via float32, as ml_dtypes converts) and return float64 values."""
    return np.asarray(a, dtype=np.float64).astype(BF16).astype(np.float64)


def rel_l2(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / den)


# ----------------------------------------------------------------------------------------------------
# Routing in float64. Returns ids [T, K], weights [T, K] and the per-token minimum gap at the selection
# boundaries (rank order inside the top-k included, since ids are compared position by position).

def min_gap(sorted_desc, upto):
    v = sorted_desc[:, :upto]
    if v.shape[1] < 2:
        return np.full(v.shape[0], np.inf)
    return np.min(v[:, :-1] - v[:, 1:], axis=1)


def route_softmax(logits, cfg):
    l = logits.astype(np.float64)
    e = np.exp(l - l.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    k = cfg["topk"]
    order = np.argsort(-p, axis=1, kind="stable")          # ties: lower index first
    ids = order[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    if cfg["norm_topk_prob"]:
        w = w / w.sum(axis=1, keepdims=True)
    w = w * cfg["routed_scaling_factor"]
    gap = min_gap(np.take_along_axis(p, order, axis=1), k + 1)
    return ids, w, gap


def route_sigmoid(logits, bias, cfg):
    l = logits.astype(np.float64)
    T, E = l.shape
    k, ng, kg = cfg["topk"], cfg["n_group"], cfg["topk_group"]
    G = E // ng
    s = 1.0 / (1.0 + np.exp(-l))
    c = s + (bias.astype(np.float64)[None, :] if bias is not None else 0.0)
    grouped = -np.sort(-c.reshape(T, ng, G), axis=2)         # each group descending
    gscore = grouped[:, :, 0] + (grouped[:, :, 1] if G > 1 else 0.0)
    gorder = np.argsort(-gscore, axis=1, kind="stable")
    kept = gorder[:, :kg]
    mask = np.zeros((T, ng), dtype=bool)
    np.put_along_axis(mask, kept, True, axis=1)
    emask = np.repeat(mask, G, axis=1)
    cm = np.where(emask, c, -np.inf)
    order = np.argsort(-cm, axis=1, kind="stable")
    ids = order[:, :k]
    w = np.take_along_axis(s, ids, axis=1)
    if cfg["norm_topk_prob"]:
        w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
    w = w * cfg["routed_scaling_factor"]
    sorted_c = np.take_along_axis(cm, order, axis=1)[:, :min(k + 1, kg * G)]
    gap = np.minimum(min_gap(np.take_along_axis(gscore, gorder, axis=1), kg + 1), min_gap(sorted_c, k + 1))
    return ids, w, gap


def route(logits, bias, cfg):
    if cfg["routing"] == "softmax":
        return route_softmax(logits, cfg)
    return route_sigmoid(logits, bias, cfg)


# ----------------------------------------------------------------------------------------------------
# NVFP4 decoding (independent of the C++ code): unscaled [n, k] = e2m1 * e4m3, plus the tensor scale.

def decode_nvfp4(codes, scales, n, k):
    packed = codes.reshape(n, k // 2)
    nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, k)   # element 2i in the low nibble
    vals = nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    sc = scales.reshape(n, k // 16).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return vals * np.repeat(sc, 16, axis=1)


def load_quant(d, prefix, count, n, k):
    codes = np.fromfile(os.path.join(d, prefix + "_codes.u8"), np.uint8).reshape(count, n * k // 2)
    scales = np.fromfile(os.path.join(d, prefix + "_scales.u8"), np.uint8).reshape(count, n * k // 16)
    ts = np.fromfile(os.path.join(d, prefix + "_ts.f32"), np.float32).astype(np.float64)
    assert ts.shape == (count,), (prefix, ts.shape)
    return [(decode_nvfp4(codes[i], scales[i], n, k), ts[i]) for i in range(count)]


def expert_forward(x, gate, up, down, round_r3=True):
    """x [m, H] (bf16 values); each projection is (unscaled [n, k], tensor scale). R3 and R4.
    round_r3=False leaves out R3, to show that the comparison can see a missing rounding point."""
    g = (x @ gate[0].T) * gate[1]
    u = (x @ up[0].T) * up[1]
    a = g / (1.0 + np.exp(-g)) * u
    a = bf16(a) if round_r3 else a                       # R3
    return bf16((a @ down[0].T) * down[1])               # R4


# ----------------------------------------------------------------------------------------------------
# One forward case.

def draw_inputs(rng, case):
    """Logits (or x with a router weight) such that no token has a near-tie at a selection boundary."""
    T, E, H = case["tokens"], case["num_experts"], case["hidden"]
    bias = rng.uniform(-0.1, 0.1, E).astype(np.float32) if case.get("has_correction_bias") else None
    router = None
    if not case["logits_given"]:
        router = (rng.standard_normal((E, H)) * (2.0 / np.sqrt(H))).astype(np.float32)

    def draw_x(m):
        return bf16(rng.standard_normal((m, H)))          # R1: bf16 input

    def draw_logits(m):
        if case.get("ties"):                               # exact ties, values far from any near-tie
            return rng.choice(np.array([-2.0, 0.3, 1.7], np.float32), size=(m, E))
        return (rng.standard_normal((m, E)) * 1.5).astype(np.float32)

    x = draw_x(T)
    logits = draw_logits(T) if case["logits_given"] else x @ router.T.astype(np.float64)
    if not case.get("ties"):
        for _ in range(10000):
            _, _, gap = route(logits, bias, case)
            bad = np.nonzero(gap < TIE_MARGIN)[0]
            if bad.size == 0:
                break
            if case["logits_given"]:
                logits[bad] = draw_logits(bad.size)
            else:
                x[bad] = draw_x(bad.size)
                logits = x @ router.T.astype(np.float64)
        else:
            raise RuntimeError("could not draw inputs without near-ties")
    return x, logits, router, bias


def run_forward_case(tool, work, idx, case, rng):
    d = os.path.join(work, f"case{idx:02d}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    T, E, H, I, K = case["tokens"], case["num_experts"], case["hidden"], case["inter"], case["topk"]
    case = dict(case)
    case.setdefault("n_group", 1)
    case.setdefault("topk_group", 1)
    case.setdefault("n_shared_experts", 0)
    case.setdefault("shared_inter", 0)
    case.setdefault("shared_format", "nvfp4")
    case.setdefault("has_correction_bias", False)
    case.setdefault("threads", 0)

    x, logits, router, bias = draw_inputs(rng, case)
    ids, weights, _ = route(logits, bias, case)
    present = [True] * E
    if case.get("only_routed"):
        used = set(ids.ravel().tolist())
        present = [e in used for e in range(E)]
    case["present"] = present

    gate = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    up = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    down = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    gate.tofile(os.path.join(d, "gate.f32"))
    up.tofile(os.path.join(d, "up.f32"))
    down.tofile(os.path.join(d, "down.f32"))
    x.astype(BF16).view(np.uint16).tofile(os.path.join(d, "x.bf16"))
    if case["logits_given"]:
        logits.astype(np.float32).tofile(os.path.join(d, "logits.f32"))
    else:
        router.tofile(os.path.join(d, "router.f32"))
    if bias is not None:
        bias.tofile(os.path.join(d, "bias.f32"))
    shared = None
    IS = case["shared_inter"]
    if case["n_shared_experts"] > 0:
        sg = rng.standard_normal((IS, H)) / np.sqrt(H)
        su = rng.standard_normal((IS, H)) / np.sqrt(H)
        sd = rng.standard_normal((H, IS)) / np.sqrt(IS)
        if case["shared_format"] == "bf16":
            for name, m in (("gate", sg), ("up", su), ("down", sd)):
                m.astype(BF16).view(np.uint16).tofile(os.path.join(d, f"shared_{name}.bf16"))
            shared = [(bf16(sg), 1.0), (bf16(su), 1.0), (bf16(sd), 1.0)]
        else:
            for name, m in (("gate", sg), ("up", su), ("down", sd)):
                m.astype(np.float32).tofile(os.path.join(d, f"shared_{name}.f32"))
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)

    proc = subprocess.run([tool, "forward", d], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"reference_tool failed ({proc.returncode}): {proc.stderr.strip()}")

    # The weights the reference used, decoded here.
    qg = load_quant(d, "q_gate", E, I, H)
    qu = load_quant(d, "q_up", E, I, H)
    qd = load_quant(d, "q_down", E, H, I)
    qerr = max(rel_l2(qg[e][0] * qg[e][1], gate[e]) for e in range(E) if present[e])
    assert qerr < 0.2, f"dumped NVFP4 weights do not match the fp32 weights (rel L2 {qerr:.3f})"
    if case["n_shared_experts"] > 0 and case["shared_format"] == "nvfp4":
        shared = [load_quant(d, "qs_gate", 1, IS, H)[0], load_quant(d, "qs_up", 1, IS, H)[0],
                  load_quant(d, "qs_down", 1, H, IS)[0]]

    # Routing: ids exactly, weights to 1e-5 relative, computed logits to 1e-5.
    got_logits = np.fromfile(os.path.join(d, "logits_used.f32"), np.float32).reshape(T, E)
    lerr = rel_l2(got_logits, logits)
    assert lerr <= LOGIT_RTOL, f"logits differ: rel L2 {lerr:.2e}"
    got_ids = np.fromfile(os.path.join(d, "ids.i32"), np.int32).reshape(T, K)
    got_w = np.fromfile(os.path.join(d, "weights.f32"), np.float32).reshape(T, K).astype(np.float64)
    if not np.array_equal(got_ids, ids):
        t = int(np.nonzero((got_ids != ids).any(axis=1))[0][0])
        raise AssertionError(f"routing ids differ at token {t}: reference {got_ids[t].tolist()}, "
                             f"numpy {ids[t].tolist()}")
    werr = float(np.max(np.abs(got_w - weights) / np.maximum(np.abs(weights), 1e-30))) if T else 0.0
    assert werr <= WEIGHT_RTOL, f"routing weights differ: max relative {werr:.2e}"

    # The forward in float64 with the reference's rounding points.
    acc = np.zeros((T, H))
    acc_no_r3 = np.zeros((T, H))
    for e in range(E):
        rows, ranks = np.nonzero(ids == e)
        if rows.size == 0:
            continue
        assert present[e], f"expert {e} is routed to but not materialised"
        y = expert_forward(x[rows], qg[e], qu[e], qd[e])
        acc[rows] += weights[rows, ranks][:, None] * y      # rows are distinct for one expert
        acc_no_r3[rows] += weights[rows, ranks][:, None] * expert_forward(x[rows], qg[e], qu[e], qd[e], False)
    if shared is not None:
        acc += expert_forward(x, *shared)
        acc_no_r3 += expert_forward(x, *shared, round_r3=False)
    want = bf16(acc)                                      # R5
    got = np.fromfile(os.path.join(d, "out.bf16"), np.uint16).reshape(T, H).view(BF16).astype(np.float64)
    assert np.all(np.isfinite(got)), "non-finite reference output"
    oerr = rel_l2(got, want)
    assert oerr <= OUT_L2, f"layer output rel L2 {oerr:.2e} > {OUT_L2}"
    assert oerr <= OUT_L2_STRICT, f"layer output rel L2 {oerr:.2e} > {OUT_L2_STRICT} (same rounding points)"
    power = rel_l2(got, bf16(acc_no_r3)) if T * H >= 2000 else None
    if power is not None:
        assert power > OUT_L2_STRICT, f"without R3 the NumPy output is still within {power:.2e}: check too weak"
    return werr, lerr, oerr, power, sum(present)


def describe(c):
    r = c["routing"]
    if r == "sigmoid":
        r += f"({c.get('n_group', 1)}/{c.get('topk_group', 1)}{'+bias' if c.get('has_correction_bias') else ''})"
    s = f"T={c['tokens']} E={c['num_experts']} top-{c['topk']} H={c['hidden']} I={c['inter']} {r}"
    s += f" norm={int(c.get('norm_topk_prob', False))} scale={c.get('routed_scaling_factor', 1.0)}"
    if c.get("n_shared_experts", 0):
        s += f" shared={c.get('shared_format', 'nvfp4')}[{c['shared_inter']}]"
    if not c["logits_given"]:
        s += " router"
    if c.get("ties"):
        s += " ties"
    if c.get("only_routed"):
        s += " only-routed"
    return s


def forward_cases():
    def case(T, E, K, routing="softmax", H=48, I=80, **kw):
        c = dict(tokens=T, num_experts=E, topk=K, routing=routing, hidden=H, inter=I, logits_given=True,
                 norm_topk_prob=False, routed_scaling_factor=1.0)
        c.update(kw)
        return c
    sig = dict(routing="sigmoid")
    return [
        case(0, 2, 1),
        case(0, 16, 4, n_shared_experts=1, shared_inter=32, **sig, n_group=4, topk_group=2),
        case(1, 1, 1, norm_topk_prob=True),
        case(1, 2, 2, H=16, I=16),
        case(3, 2, 2, routed_scaling_factor=2.0, n_shared_experts=1, shared_inter=48, shared_format="bf16"),
        case(3, 7, 1, norm_topk_prob=True, routed_scaling_factor=2.5, logits_given=False),
        case(17, 7, 4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1, shared_inter=32,
             logits_given=False, threads=3),
        case(64, 16, 8, n_shared_experts=2, shared_inter=96, shared_format="bf16"),
        case(64, 64, 2, H=64, I=32, norm_topk_prob=True, threads=5, only_routed=True),
        case(17, 64, 8, norm_topk_prob=True, only_routed=True, n_shared_experts=1, shared_inter=80),
        case(17, 16, 4, ties=True, norm_topk_prob=True),
        case(1, 2, 2, **sig, n_group=1, topk_group=1, has_correction_bias=True),
        case(3, 7, 2, **sig, n_group=1, topk_group=1, has_correction_bias=True, routed_scaling_factor=1.5),
        case(17, 16, 4, **sig, n_group=4, topk_group=2, has_correction_bias=True, norm_topk_prob=True,
             only_routed=True),
        case(17, 16, 1, **sig, n_group=8, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5),
        case(64, 64, 8, **sig, n_group=8, topk_group=4, has_correction_bias=True, norm_topk_prob=True,
             routed_scaling_factor=2.5, n_shared_experts=1, shared_inter=80, logits_given=False),
        case(64, 64, 4, **sig, n_group=1, topk_group=1, has_correction_bias=True, norm_topk_prob=True,
             n_shared_experts=1, shared_inter=48, shared_format="bf16", threads=2),
        case(1, 64, 8, **sig, n_group=8, topk_group=4, has_correction_bias=True, norm_topk_prob=True,
             routed_scaling_factor=2.5, n_shared_experts=1, shared_inter=80, only_routed=True,
             logits_given=False),
        case(64, 16, 8, **sig, n_group=2, topk_group=1, norm_topk_prob=False, H=64, I=32),
        case(17, 16, 4, **sig, n_group=4, topk_group=2, ties=True, norm_topk_prob=True),
        case(3, 64, 4, **sig, n_group=16, topk_group=3, has_correction_bias=True, only_routed=True),
    ]


# ----------------------------------------------------------------------------------------------------
# Synthetic generator: independent re-implementation of synthetic_hash.h / synthetic_values.h.

M64 = (1 << 64) - 1
SYN = dict(gate_codes=0, gate_scales=1, up_codes=2, up_scales=3, down_codes=4, down_scales=5, router=6, bias=7,
           tensor_scale=8)


def mix64(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def syn_bits(seed, expert, tensor, index):
    key = np.array([seed ^ (((expert + 2) * 0x632BE59BD9B4E019) & M64)], dtype=np.uint64)
    k = mix64(key)[0]
    idx = np.asarray(index, dtype=np.uint64)
    return mix64(np.uint64(k) ^ np.uint64(tensor << 56) ^ idx)


def syn_code_bytes(seed, expert, tensor, count):
    i = np.arange(count, dtype=np.uint64)
    bits = syn_bits(seed, expert, tensor, i >> np.uint64(3))
    return ((bits >> ((i & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)).astype(np.uint8)


def syn_scale_bytes(seed, expert, tensor, count):
    r = syn_code_bytes(seed, expert, tensor, count).astype(np.uint32)
    return (((4 + (r & 3)) << 3) | ((r >> 2) & 7)).astype(np.uint8)


def syn_uniform_pm1(bits):
    m = (np.asarray(bits, np.uint64) >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return m.astype(np.float32) * np.float32(1.0 / 8388608.0)


def check_synthetic(tool, work):
    d = os.path.join(work, "synthetic")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    H, I, E, IS, seed = 48, 80, 9, 96, 0xDEADBEEF12345678
    experts = [0, 4, E - 1]
    case = dict(hidden=H, inter=I, num_experts=E, topk=2, routing="sigmoid", n_group=3, topk_group=2,
                has_correction_bias=True, n_shared_experts=1, shared_inter=IS, seed=seed, experts=experts)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f)
    proc = subprocess.run([tool, "synthetic", d], capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"reference_tool synthetic failed: {proc.stderr.strip()}")
    checked = 0
    for name, e, inter in [(f"expert{e}", e, I) for e in experts] + [("shared", -1, IS)]:
        for proj, n, k in (("gate", inter, H), ("up", inter, H), ("down", H, inter)):
            p = os.path.join(d, f"{name}_{proj}")
            codes = np.fromfile(p + "_codes.u8", np.uint8)
            scales = np.fromfile(p + "_scales.u8", np.uint8)
            ts = np.fromfile(p + "_ts.f32", np.float32)
            want_codes = syn_code_bytes(seed, e, SYN[proj + "_codes"], n * k // 2)
            want_scales = syn_scale_bytes(seed, e, SYN[proj + "_scales"], n * k // 16)
            u = np.float32((int(syn_bits(seed, e, SYN["tensor_scale"], SYN[proj + "_codes"])) >> 40)) * \
                np.float32(1.0 / 16777216.0)
            want_ts = (np.float32(0.30) + np.float32(0.10) * u) / np.sqrt(np.float32(k))
            assert np.array_equal(codes, want_codes), f"{name} {proj} codes differ"
            assert np.array_equal(scales, want_scales), f"{name} {proj} block scales differ"
            assert ts.shape == (1,) and ts[0] == want_ts, f"{name} {proj} tensor scale {ts} != {want_ts}"
            checked += codes.size + scales.size + 1
    scale = np.float32(4.0) / np.sqrt(np.float32(H))
    got_scale = np.fromfile(os.path.join(d, "router_scale.f32"), np.float32)
    assert got_scale[0] == scale, f"router scale {got_scale[0]} != {scale}"
    router = np.fromfile(os.path.join(d, "router.f32"), np.float32)
    u = syn_uniform_pm1(syn_bits(seed, 0, SYN["router"], np.arange(E * H, dtype=np.uint64)))
    want_router = (u * scale).astype(np.float32).astype(BF16).astype(np.float32)
    assert np.array_equal(router, want_router), "router weight differs"
    bias = np.fromfile(os.path.join(d, "bias.f32"), np.float32)
    want_bias = syn_uniform_pm1(syn_bits(seed, 0, SYN["bias"], np.arange(E, dtype=np.uint64))) * np.float32(0.05)
    assert np.array_equal(bias, want_bias), f"correction bias differs: {bias} vs {want_bias}"
    print(f"  synthetic: {checked} expert bytes/scales, {router.size} router values, {bias.size} biases "
          f"match the formulas exactly")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(20240607)
    failures = 0
    worst = 0.0
    for i, c in enumerate(forward_cases()):
        try:
            werr, lerr, oerr, power, materialised = run_forward_case(tool, work, i, c, rng)
            worst = max(worst, oerr)
            extra = f", {power:.1e} if R3 were dropped" if power is not None else ""
            print(f"  ok   {i:2d} {describe(c)}: ids exact, weights max rel {werr:.1e}, logits rel {lerr:.1e}, "
                  f"out rel L2 {oerr:.2e}{extra} ({materialised} experts materialised)")
        except Exception as e:  # report every case, then fail
            failures += 1
            print(f"  FAIL {i:2d} {describe(c)}: {e}")
    try:
        check_synthetic(tool, work)
    except Exception as e:
        failures += 1
        print(f"  FAIL synthetic: {e}")
    print(f"check_reference: {len(forward_cases())} forward cases + synthetic, worst out rel L2 {worst:.2e}, "
          f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
