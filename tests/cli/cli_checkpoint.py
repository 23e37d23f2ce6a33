"""End-to-end check of `fp4moe quantize`, `fp4moe inspect` and `fp4moe run --checkpoint` on a small
random model, against an independent NumPy computation.

1. Writes a bf16 checkpoint (2 layers: a dense MLP layer 0 and a MoE layer 1 with E=8, H=64, I=32, top-2,
   sigmoid routing with 4 groups / top-2 groups, correction bias, one shared expert, routed scale 2.5, plus
   tensors that must be copied as they are) with the official safetensors package, and a config.json.
2. `fp4moe quantize`: checks every output name, dtype and shape; that copied tensors are byte-identical;
   that the input file's bytes are unchanged; and that the NVFP4 tensors decode (ml_dtypes) to the
   original weights within NVFP4's error, with tensor scale amax / (6 * 448).
3. `fp4moe run --checkpoint` on two inputs (bf16 hidden states with given router logits; f32 hidden
   states without logits) compared with a float64 NumPy forward on the quantised weights decoded with
   ml_dtypes: top-k ids exactly, top-k weights to 1e-5, out to relative L2 <= 1e-2 (plus >= 99% of
   elements within one bf16 ulp).
4. Error cases: each exits non-zero with one line on stderr naming the problem.

Usage: python3 cli_checkpoint.py --fp4moe BUILD/tools/fp4moe/fp4moe --workdir DIR
"""
import argparse
import hashlib
import json
import os
import shutil

import ml_dtypes
import numpy as np

import cli_common
from cli_common import (EXIT_BAD_INPUT, EXIT_UNSUPPORTED, EXIT_USAGE, check, expect_error, fnv1a64,
                        parse_fields, read_safetensors, run, run_ok, write_safetensors)

BF16 = ml_dtypes.bfloat16
E, H, I, TOPK, N_GROUP, TOPK_GROUP, SCALE = 8, 64, 32, 2, 4, 2, 2.5
DENSE_I, VOCAB = 48, 40
PROJS = ("gate_proj", "up_proj", "down_proj")


def config_json():
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": H, "intermediate_size": DENSE_I, "moe_intermediate_size": I,
        "n_routed_experts": E, "num_experts_per_tok": TOPK, "n_group": N_GROUP, "topk_group": TOPK_GROUP,
        "norm_topk_prob": True, "routed_scaling_factor": SCALE, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "n_shared_experts": 1, "first_k_dense_replace": 1,
        "num_hidden_layers": 2, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
    }


def make_model(rng):
    """The bf16 model as {name: array}, and the names `quantize` must turn into NVFP4."""
    def lin(n, k, dtype=BF16):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32).astype(dtype)
    t = {
        "model.embed_tokens.weight": lin(VOCAB, H),
        "model.norm.weight": np.ones(H, dtype=BF16),
        "lm_head.weight": lin(VOCAB, H, np.float16),                       # F16 input
        "model.layers.0.input_layernorm.weight": np.ones(H, dtype=BF16),
        "model.layers.0.mlp.gate_proj.weight": lin(DENSE_I, H),
        "model.layers.0.mlp.up_proj.weight": lin(DENSE_I, H),
        "model.layers.0.mlp.down_proj.weight": lin(H, DENSE_I, np.float32),  # F32 input
        "model.layers.0.self_attn.odd_proj.weight": lin(16, 24),            # K % 16 != 0: copied
        "model.layers.0.self_attn.stacked.weight": rng.standard_normal((2, 4, 16)).astype(BF16),  # 3-D: copied
        "model.layers.1.mlp.gate.weight": lin(E, H),                        # router: copied
        "model.layers.1.mlp.gate.e_score_correction_bias": (0.1 * rng.standard_normal(E)).astype(np.float32),
        "model.layers.1.mlp.token_count": np.arange(4, dtype=np.int32),     # not float: copied
        "model.layers.1.mlp.int8_table.weight": np.arange(32, dtype=np.int8).reshape(2, 16),  # I8: copied
    }
    for e in range(E):
        for p in PROJS:
            n, k = (H, I) if p == "down_proj" else (I, H)
            t[f"model.layers.1.mlp.experts.{e}.{p}.weight"] = lin(n, k)
    for p in PROJS:
        n, k = (H, I) if p == "down_proj" else (I, H)
        t[f"model.layers.1.mlp.shared_experts.{p}.weight"] = lin(n, k)
    quantized = {n for n, a in t.items()
                 if n.endswith(".weight") and not n.endswith(".mlp.gate.weight") and a.ndim == 2
                 and a.dtype in (BF16, np.float16, np.float32) and a.shape[1] % 16 == 0}
    return t, quantized


def decode_nvfp4(codes, scales):
    """Codes U8 [N, K/2] and F8_E4M3 scales [N, K/16] -> e2m1 * e4m3 values [N, K] (float64)."""
    n, half = codes.shape
    nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(n, 2 * half).astype(np.uint8)
    vals = nib.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    sc = np.asarray(scales).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return vals * np.repeat(sc, 16, axis=1)


E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def check_nvfp4_rounding(stem, w, codes, scales, ts):
    """Block scales are the block amax / 6 / tensor scale rounded to E4M3 (within half an E4M3 step), and
    every code is a nearest E2M1 value of w / (block scale * tensor scale) (ties either way)."""
    n, k = w.shape
    bs = np.asarray(scales).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = np.abs(w).reshape(n, k // 16, 16).max(-1) / 6.0 / ts
    close = np.abs(bs - want) <= 0.0625 * want + 2.0 ** -10
    check(close.all(), f"{stem}: block scales are E4M3 roundings of block amax / 6 / tensor scale")
    v = w / (np.repeat(bs, 16, axis=1) * ts)
    nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(n, k).astype(np.uint8)
    got = nib.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    best = np.min(np.abs(np.abs(v)[..., None] - E2M1_GRID), axis=-1)
    ok = (np.abs(v - got) <= best + 1e-6 * np.maximum(1.0, np.abs(v))) & ((got == 0) | (np.sign(got) == np.sign(v)))
    check(ok.all(), f"{stem}: every E2M1 code is a nearest value ({(~ok).sum()} of {ok.size} are not)")


def bf16_round(a):
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(BF16).astype(np.float64)


class Reference:
    """float64 forward of MoE layer 1 on the quantised weights (rounding to bf16 where fp4moe does)."""

    def __init__(self, q):
        def linear(prefix):
            _, _, codes = q[prefix + ".weight"]
            _, _, scales = q[prefix + ".weight_scale"]
            ts = float(q[prefix + ".weight_scale_2"][2])
            return decode_nvfp4(codes, scales), ts
        base = "model.layers.1.mlp."
        self.experts = [{p: linear(f"{base}experts.{e}.{p}") for p in PROJS} for e in range(E)]
        self.shared = {p: linear(f"{base}shared_experts.{p}") for p in PROJS}
        self.router = q[base + "gate.weight"][2].astype(np.float64)
        self.bias = q[base + "gate.e_score_correction_bias"][2].astype(np.float64)

    @staticmethod
    def mlp(ex, x):
        (wg, sg), (wu, su), (wd, sd) = ex["gate_proj"], ex["up_proj"], ex["down_proj"]
        gate, up = (x @ wg.T) * sg, (x @ wu.T) * su
        a = bf16_round(gate / (1.0 + np.exp(-gate)) * up)
        return bf16_round((a @ wd.T) * sd)

    def route(self, logits):
        s = 1.0 / (1.0 + np.exp(-logits))
        choice = s + self.bias
        t = logits.shape[0]
        groups = choice.reshape(t, N_GROUP, E // N_GROUP)
        gscore = np.sort(groups, axis=-1)[..., -2:].sum(-1)
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :TOPK_GROUP]
        mask = np.zeros((t, N_GROUP), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        masked = np.where(np.repeat(mask, E // N_GROUP, axis=1), choice, -np.inf)
        ids = np.argsort(-masked, axis=-1, kind="stable")[:, :TOPK]
        w = np.take_along_axis(s, ids, axis=-1)
        w = w / w.sum(-1, keepdims=True) * SCALE
        return ids, w

    def forward(self, x, logits=None):
        x = bf16_round(x)
        if logits is None:
            logits = x @ self.router.T
        ids, w = self.route(np.asarray(logits, dtype=np.float64))
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            acc = np.zeros(H)
            for j in range(TOPK):
                acc += w[t, j] * self.mlp(self.experts[ids[t, j]], x[t:t + 1])[0]
            acc += self.mlp(self.shared, x[t:t + 1])[0]
            out[t] = acc
        return bf16_round(out), ids, w


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compare_run(label, result_path, ref, x, logits=None):
    got = read_safetensors(result_path)
    t = x.shape[0]
    check(got["out"][0] == "BF16" and got["out"][1] == [t, H], f"{label}: out is BF16 [{t}, {H}]")
    check(got["topk_ids"][0] == "I32" and got["topk_ids"][1] == [t, TOPK], f"{label}: topk_ids is I32 [{t}, {TOPK}]")
    check(got["topk_weights"][0] == "F32" and got["topk_weights"][1] == [t, TOPK],
          f"{label}: topk_weights is F32 [{t}, {TOPK}]")
    want_out, want_ids, want_w = ref.forward(x, logits)
    check(np.array_equal(got["topk_ids"][2], want_ids), f"{label}: top-k ids equal NumPy's")
    werr = np.max(np.abs(got["topk_weights"][2] - want_w) / np.abs(want_w))
    check(werr < 1e-5, f"{label}: top-k weights match NumPy's (max relative difference {werr:.2e})")
    out = got["out"][2].astype(np.float64)
    rel = np.linalg.norm(out - want_out) / np.linalg.norm(want_out)
    check(rel <= 1e-2, f"{label}: out vs NumPy forward on the decoded weights, relative L2 {rel:.3e} <= 1e-2")
    ulp = np.abs(out - want_out) <= np.abs(want_out) * 2.0 ** -7 + 1e-30
    check(ulp.mean() >= 0.99, f"{label}: {100 * ulp.mean():.2f}% of out elements within one bf16 ulp of NumPy's")
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4moe", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    fp = args.fp4moe
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    src_dir, q_dir = os.path.join(work, "bf16"), os.path.join(work, "nvfp4")
    os.makedirs(src_dir)
    os.makedirs(q_dir)
    rng = np.random.default_rng(20261130)

    # 1. The bf16 checkpoint.
    model, quantized = make_model(rng)
    src = os.path.join(src_dir, "model.safetensors")
    write_safetensors(src, model, metadata={"format": "pt"})
    with open(os.path.join(src_dir, "config.json"), "w") as f:
        json.dump(config_json(), f, indent=1)
    src_hash, src_mtime = sha256(src), os.stat(src).st_mtime_ns

    # 2. quantize.
    qfile = os.path.join(q_dir, "model.safetensors")
    out = run_ok(fp, "quantize", "--input", src, "--output", qfile)
    check(f"quantized: {len(quantized)} tensors" in out, f"quantize reports {len(quantized)} quantised tensors")
    check(sha256(src) == src_hash and os.stat(src).st_mtime_ns == src_mtime, "quantize left the input file unchanged")
    q = read_safetensors(qfile)
    expected = set()
    for name, arr in model.items():
        if name in quantized:
            stem = name[: -len(".weight")]
            n, k = arr.shape
            expected |= {name, stem + ".weight_scale", stem + ".weight_scale_2"}
            check(q[name][:2] == ("U8", [n, k // 2]), f"{name}: U8 [{n}, {k // 2}] (found {q[name][:2]})")
            check(q[stem + ".weight_scale"][:2] == ("F8_E4M3", [n, k // 16]),
                  f"{stem}.weight_scale: F8_E4M3 [{n}, {k // 16}]")
            check(q[stem + ".weight_scale_2"][:2] == ("F32", []), f"{stem}.weight_scale_2: F32 []")
            w = arr.astype(np.float64)
            ts = float(q[stem + ".weight_scale_2"][2])
            amax = np.max(np.abs(w))
            check(abs(ts - amax / 2688.0) <= 1e-6 * ts, f"{stem}: tensor scale {ts:.6g} = amax / (6 * 448)")
            deq = decode_nvfp4(q[name][2], q[stem + ".weight_scale"][2]) * ts
            rel = np.linalg.norm(deq - w) / np.linalg.norm(w)
            check(rel < 0.12, f"{stem}: dequantised NVFP4 within quantisation error of the input (rel L2 {rel:.3f})")
            check_nvfp4_rounding(stem, w, q[name][2], q[stem + ".weight_scale"][2], ts)
        else:
            expected.add(name)
            check(name in q and q[name][2].tobytes() == arr.tobytes() and q[name][2].dtype == arr.dtype,
                  f"{name}: copied unchanged ({q[name][0] if name in q else 'missing'} {list(arr.shape)})")
    check(set(q) == expected, f"quantize output holds exactly the expected {len(expected)} tensors")

    # The quantised checkpoint: config.json plus ModelOpt's hf_quant_config.json.
    shutil.copy(os.path.join(src_dir, "config.json"), q_dir)
    with open(os.path.join(q_dir, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}, f)

    # inspect.
    out = run_ok(fp, "inspect", q_dir)
    check("moe layers: 1 (1)" in out, "inspect finds MoE layer 1 only")
    check("layer 1: 8 experts" in out, "inspect counts 8 experts")
    check(f"NVFP4 [{I}, {H}]" in out and f"NVFP4 [{H}, {I}]" in out, "inspect shows NVFP4 gate/up and down shapes")
    check("shared.gate_proj" in out, "inspect shows the shared expert")
    check("model.layers.1.mlp.gate.weight" in out and "F8_E4M3" in out, "inspect lists the tensors")
    out = run_ok(fp, "inspect", src)
    check(f"BF16 [{I}, {H}]" in out, "inspect of the bf16 file shows BF16 experts")

    ref = Reference(q)
    qcheck_files = {p: sha256(os.path.join(q_dir, p)) for p in os.listdir(q_dir)}

    # 3a. bf16 hidden states with given router logits (not the router's own: they must be used).
    t1 = 5
    x1 = rng.standard_normal((t1, H)).astype(BF16)
    logits1 = (2.0 * rng.standard_normal((t1, E))).astype(np.float32)
    in1, out1 = os.path.join(work, "in_logits.safetensors"), os.path.join(work, "out_logits.safetensors")
    write_safetensors(in1, {"hidden_states": x1, "router_logits": logits1})
    out = run_ok(fp, "run", "--checkpoint", q_dir, "--layer", 1, "--input", in1, "--output", out1, "--backend", "cpu")
    fields = parse_fields(out)
    check(fields.get("backend", "").startswith("cpu"), f"--backend cpu uses the cpu backend ({fields.get('backend')})")
    check(fields.get("tokens") == str(t1), f"run reports {t1} tokens")
    got = compare_run("given logits", out1, ref, x1.astype(np.float64), logits1)
    outbytes = got["out"][2].tobytes()
    want_sum = got["out"][2].astype(np.float64).sum()
    csum, chash = fields["checksum"].split()
    check(abs(float(csum) - want_sum) <= 1e-6 * max(1.0, abs(want_sum)) and int(chash, 16) == fnv1a64(outbytes),
          "the checksum line is the sum and FNV-1a-64 of the written out tensor")

    # 3b. f32 hidden states (rounded to bf16 by fp4moe), logits from the router weight, default layer.
    t2 = 7
    x2 = rng.standard_normal((t2, H)).astype(np.float32)
    in2, out2 = os.path.join(work, "in_plain.safetensors"), os.path.join(work, "out_plain.safetensors")
    write_safetensors(in2, {"hidden_states": x2})
    run_ok(fp, "run", "--checkpoint", q_dir, "--input", in2, "--output", out2, "--backend", "cpu", "--threads", 1)
    compare_run("router logits", out2, ref, x2.astype(np.float64))

    # The GPU engine where there is one (auto picks it): same comparison, plus --check.
    rc, out, err = run(fp, "run", "--checkpoint", q_dir, "--input", in2, "--backend", "auto")
    has_gpu = rc == 0 and parse_fields(out).get("backend", "").startswith("cuda")
    if has_gpu:
        out3 = os.path.join(work, "out_cuda.safetensors")
        run_ok(fp, "run", "--checkpoint", q_dir, "--input", in1, "--output", out3, "--backend", "cuda", "--check")
        compare_run("cuda, given logits", out3, ref, x1.astype(np.float64), logits1)
        run_ok(fp, "run", "--checkpoint", q_dir, "--input", in2, "--output", out3, "--backend", "cuda", "--check")
        compare_run("cuda, router logits", out3, ref, x2.astype(np.float64))
    else:
        check(rc == 0, f"run --backend auto without a GPU falls back to cpu (rc {rc}, {err.strip()!r})")

    # Synthetic weights from the same config.json: deterministic, independent of the thread count.
    cfg = os.path.join(q_dir, "config.json")
    syn = os.path.join(work, "out_synthetic.safetensors")
    a = parse_fields(run_ok(fp, "run", "--config", cfg, "--tokens", 3, "--backend", "cpu", "--threads", 1,
                            "--output", syn))
    b = parse_fields(run_ok(fp, "run", "--config", cfg, "--tokens", 3, "--backend", "cpu", "--threads", 2))
    check(a["checksum"] == b["checksum"], f"synthetic run: same checksum with 1 and 2 threads ({a['checksum']})")
    s = read_safetensors(syn)
    check(s["out"][1] == [3, H] and np.all(np.isfinite(s["out"][2].astype(np.float32))), "synthetic out is finite [3, 64]")
    ids = s["topk_ids"][2]
    check(ids.min() >= 0 and ids.max() < E and all(len(set(r)) == TOPK for r in ids), "synthetic top-k ids are distinct experts")

    # 4. Errors: one line on stderr naming the problem, and a meaningful exit code.
    missing = os.path.join(work, "no_such_input.safetensors")
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", missing, "--backend", "cpu"], EXIT_BAD_INPUT, "run",
                 ["no_such_input.safetensors", "does not exist"])
    bad_h = os.path.join(work, "in_bad_hidden.safetensors")
    write_safetensors(bad_h, {"hidden_states": rng.standard_normal((3, 48)).astype(BF16)})
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", bad_h, "--backend", "cpu"], EXIT_BAD_INPUT, "run",
                 ["hidden_states", "[3, 48]", "64"])
    bad_l = os.path.join(work, "in_bad_logits.safetensors")
    write_safetensors(bad_l, {"hidden_states": x1, "router_logits": np.zeros((t1, E + 1), dtype=np.float32)})
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", bad_l, "--backend", "cpu"], EXIT_BAD_INPUT, "run",
                 ["router_logits"])
    in1_hash = sha256(in1)
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", in1, "--output", in1, "--backend", "cpu"],
                 EXIT_BAD_INPUT, "run", ["--output", "input", "overwrite"])
    check(sha256(in1) == in1_hash, "run --output == --input left the input unchanged")
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", in1, "--output", qfile, "--backend", "cpu"],
                 EXIT_BAD_INPUT, "run", ["--output", "model.safetensors", "overwrite"])
    check({p: sha256(os.path.join(q_dir, p)) for p in os.listdir(q_dir)} == qcheck_files,
          "the checkpoint files are unchanged")
    expect_error(fp, ["run", "--checkpoint", q_dir, "--layer", 0, "--input", in1, "--backend", "cpu"],
                 EXIT_BAD_INPUT, "run", ["layer 0", "1"])
    garbage = os.path.join(work, "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    expect_error(fp, ["run", "--checkpoint", q_dir, "--input", garbage, "--backend", "cpu"], EXIT_BAD_INPUT, "run",
                 ["garbage.safetensors"])
    expect_error(fp, ["run", "--checkpoint", os.path.join(work, "no_such_dir")], EXIT_BAD_INPUT, "run",
                 ["no_such_dir", "does not exist"])
    if not has_gpu:
        expect_error(fp, ["run", "--checkpoint", q_dir, "--input", in1, "--backend", "cuda"], EXIT_UNSUPPORTED, "run",
                     ["--backend cuda", "not available"])
    expect_error(fp, ["run", "--backend", "tpu"], EXIT_USAGE, "run", ["--backend"])
    expect_error(fp, ["run", "--tokens", 2, "--input", in1], EXIT_USAGE, "run", ["--tokens", "--input"])
    expect_error(fp, ["quantize", "--input", src, "--output", src], EXIT_BAD_INPUT, "quantize",
                 ["--output", "overwrite"])
    check(sha256(src) == src_hash, "quantize --output == --input left the input unchanged")
    expect_error(fp, ["quantize", "--input", missing, "--output", os.path.join(work, "x.safetensors")],
                 EXIT_BAD_INPUT, "quantize", ["no_such_input.safetensors", "does not exist"])
    expect_error(fp, ["quantize", "--input", qfile, "--output", os.path.join(work, "no_dir", "x.safetensors")],
                 EXIT_BAD_INPUT, "quantize", ["no_dir", "does not exist"])
    expect_error(fp, ["quantize", "--input", src], EXIT_USAGE, "quantize", ["--output"])
    expect_error(fp, ["inspect", missing], EXIT_BAD_INPUT, "inspect", ["no_such_input.safetensors"])

    print(f"cli_checkpoint: all {cli_common.checks} checks passed")


if __name__ == "__main__":
    main()
