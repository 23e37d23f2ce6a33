#!/usr/bin/env python3
"""The PyTorch peer of `fp4moe bench`, timed in the same session on the same GPU.

Reads the directory written by `fp4moe bench --dump-dir DIR` (bench.json plus each T's routing:
routing_T<T>_ids.bin int32 [T, topk] and routing_T<T>_weights.bin float32 [T, topk]) and runs, with the
SAME routing, the bf16 MoE layer a PyTorch user would write:

    permute   argsort of the expert ids (stable), per-expert counts (scatter_add) and offsets, row gather
    FC1       torch._grouped_mm(x_sorted, W1^T, offs)   W1 [E, 2I, H] bf16 (gate rows, then up rows)
    SwiGLU    silu(gate) * up
    FC2       torch._grouped_mm(a, W2^T, offs)          W2 [E, H, I] bf16
    combine   un-permute, weight by the top-k weights in fp32, sum over k (+ the shared expert, a dense
              bf16 MLP, when the model has one), cast to bf16

Expert-parallel shard (`fp4moe bench --ep N`, bench.json "shard": ep_size > 1): the peer runs the same rank's
work: bf16 weights of the rank's local experts only, the local pairs of the dumped routing (ids in
[expert_first, expert_first + local_experts), selected once on the host: the peer's input is the rank's share
of the routing, what an EP layer holds after dispatch), permute / FC1 / SwiGLU / FC2 over them, the weighted
scatter-add of the local pairs into [T, H] fp32, plus the shared expert on the rank that holds it (rank 0), as
fp4moe's partial does.

It also measures the two ceilings of shared/DESIGN.md section 6 with torch in this session: the
device-to-device copy (1 GiB, read + write bytes, best of 5) and the bf16 8192^3 matmul (best of 10).
The floor is max(touched bytes / copy, FLOPs / matmul) with fp4moe's touched NVFP4 bytes; both columns
use the same floor. Each forward is captured in a CUDA graph and timed over replays with CUDA events
(eager timing when capture fails, said in the table), after the card has been left idle --settle-ms, as
`fp4moe bench` does. Prints the combined table, and writes
DIR/peer.json and DIR/table.md.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, iters, warmup=3):
    """Milliseconds per call: CUDA-graph replays when the call can be captured, else eager calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    mode = "graph"
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
        run()
    except Exception as e:  # noqa: BLE001 - report and fall back to eager timing
        print(f"  note: graph capture failed ({type(e).__name__}: {str(e)[:120]}); timing eager calls", file=sys.stderr)
        mode = "eager"
        run = fn
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters, mode


def copy_ceiling_tbs():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    best = 1e30
    for i in range(6):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        if i:
            best = min(best, s.elapsed_time(e))
    del a, b
    return 2.0 * n / (best * 1e-3) / 1e12


def matmul_ceiling_tflops():
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    best = 1e30
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e))
    del a, b
    return 2.0 * n ** 3 / (best * 1e-3) / 1e12


class PeerLayer:
    """bf16 MoE layer with torch._grouped_mm; weights are random (values do not change the timing).
    E is the number of experts held (all of them, or an expert-parallel rank's local experts)."""

    def __init__(self, H, I, E, topk, shared_inter):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.H, self.I, self.E, self.topk = H, I, E, topk
        self.w1 = (torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
        self.w2 = (torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
        self.ws1 = self.ws2 = None
        if shared_inter:
            self.ws1 = torch.randn(2 * shared_inter, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
            self.ws2 = torch.randn(H, shared_inter, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
            self.Is = shared_inter

    def forward(self, x, ids, w):
        T, k, I = x.shape[0], self.topk, self.I
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        tok = torch.div(order, k, rounding_mode="floor")
        xs = x.index_select(0, tok)
        h = torch._grouped_mm(xs, self.w1.transpose(-2, -1), offs=offs)
        a = F.silu(h[:, :I]) * h[:, I:]
        y = torch._grouped_mm(a, self.w2.transpose(-2, -1), offs=offs)
        yk = torch.empty_like(y)
        yk[order] = y
        out = (yk.view(T, k, self.H).float() * w.view(T, k, 1)).sum(dim=1)
        if self.ws1 is not None:
            hs = x @ self.ws1.t()
            out += (F.silu(hs[:, : self.Is]) * hs[:, self.Is:]) @ self.ws2.t()
        return out.to(torch.bfloat16)

    def forward_local(self, x, lids, ltok, lw):
        """An expert-parallel rank: the local pairs only. lids [P] local expert ids (int64), ltok [P] their
        tokens (int64), lw [P] their fp32 weights; out [T, H] = sum over local pairs (+ shared expert)."""
        I = self.I
        out = torch.zeros(x.shape[0], self.H, dtype=torch.float32, device=x.device)
        if self.ws1 is not None:
            hs = x @ self.ws1.t()
            out += (F.silu(hs[:, : self.Is]) * hs[:, self.Is:]) @ self.ws2.t()
        if lids.numel() == 0:  # no token routed to this rank's experts
            return out.to(torch.bfloat16)
        order = torch.argsort(lids, stable=True)
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, lids, torch.ones_like(lids, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        tok = ltok.index_select(0, order)
        xs = x.index_select(0, tok)
        h = torch._grouped_mm(xs, self.w1.transpose(-2, -1), offs=offs)
        a = F.silu(h[:, :I]) * h[:, I:]
        y = torch._grouped_mm(a, self.w2.transpose(-2, -1), offs=offs)
        out.index_add_(0, tok, y.float() * lw.index_select(0, order).view(-1, 1))
        return out.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench-dir", required=True, action="append",
                    help="directory written by `fp4moe bench --dump-dir` (repeatable: the peer runs once per T "
                         "with the first directory's routing and is compared with each fp4moe run)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--settle-ms", type=float, default=50.0,
                    help="before each T: synchronise, then leave the card idle this long (as `fp4moe bench "
                         "--settle-ms`: the driver's work after large frees slows the next ~10 ms of kernels)")
    args = ap.parse_args()
    benches = []
    for d in args.bench_dir:
        with open(os.path.join(d, "bench.json")) as f:
            benches.append((d, json.load(f)))
    first_dir, first = benches[0]
    cfg = first["config"]
    H, I, E, K = cfg["hidden"], cfg["inter"], cfg["experts"], cfg["topk"]
    shard = first.get("shard", {})
    ep = shard.get("ep_size", 1)
    lo, n_local = shard.get("expert_first", 0), shard.get("local_experts", E)
    shared_inter = cfg["shared_inter"] if shard.get("shared_expert", True) else 0
    for d, b in benches[1:]:
        if b.get("shard", {}) != shard or b["config"] != cfg:
            print(f"error: {d} is another layer or shard than {first_dir}; run the peer once per shard", file=sys.stderr)
            return 2
    dev = torch.cuda.get_device_name()
    print(f"torch {torch.__version__} on {dev}; layer {cfg['name']}: H={H} I={I} E={E} top-{K} "
          f"shared={cfg['shared_inter']}; shard: {shard.get('text', 'whole layer')}")
    copy_tbs = copy_ceiling_tbs()
    mm_tflops = matmul_ceiling_tflops()
    print(f"ceilings measured now with torch: copy {copy_tbs:.2f} TB/s (read+write), bf16 8192^3 matmul "
          f"{mm_tflops:.0f} TFLOP/s; fp4moe's own copy measurement: {first['copy_tbs']:.2f} TB/s")

    layer = PeerLayer(H, I, n_local if ep > 1 else E, K, shared_inter)
    peer = {}
    for r in first["rows"]:
        T = r["tokens"]
        ids = torch.from_file(os.path.join(first_dir, f"routing_T{T}_ids.bin"), dtype=torch.int32,
                              size=T * K).view(T, K).to("cuda").long()
        w = torch.from_file(os.path.join(first_dir, f"routing_T{T}_weights.bin"), dtype=torch.float32,
                            size=T * K).view(T, K).to("cuda")
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        time.sleep(max(0.0, args.settle_ms) / 1e3)
        if ep > 1:
            flat = ids.reshape(-1)
            mine = ((flat >= lo) & (flat < lo + n_local)).nonzero().view(-1)  # the rank's pairs, before timing
            lids, ltok, lw = flat[mine] - lo, torch.div(mine, K, rounding_mode="floor"), w.reshape(-1)[mine]
            if "local_pairs" in r and r["local_pairs"] != mine.numel():
                print(f"error: T={T}: {mine.numel()} local pairs here, fp4moe counted {r['local_pairs']}", file=sys.stderr)
                return 2
            peer[T] = timed(lambda: layer.forward_local(x, lids, ltok, lw), args.iters)
            del lids, ltok, lw, mine, flat
        else:
            peer[T] = timed(lambda: layer.forward(x, ids, w), args.iters)
        print(f"  peer T={T}: {peer[T][0] * 1e3:.1f} us ({peer[T][1]})")
        del x, ids, w
        torch.cuda.empty_cache()

    out_md = [f"Device: {dev}; torch {torch.__version__}; ceilings measured in this run: copy {copy_tbs:.2f} TB/s, "
              f"bf16 matmul {mm_tflops:.0f} TFLOP/s\n"]
    all_rows = {}
    for d, bench in benches:
        rows = []
        for r in bench["rows"]:
            T = r["tokens"]
            if T not in peer:
                continue
            ms, mode = peer[T]
            floor_ms = max(r["bytes"] / (copy_tbs * 1e12), r["flops"] / (mm_tflops * 1e12)) * 1e3
            rows.append(dict(T=T, experts=r["touched_experts"], fp4_ms=r["ms"], peer_ms=ms, peer_mode=mode,
                             tbs=r["bytes"] / (r["ms"] * 1e-3) / 1e12, tflops=r["flops"] / (r["ms"] * 1e-3) / 1e12,
                             floor_ms=floor_ms, pct=100 * floor_ms / r["ms"], peer_pct=100 * floor_ms / ms,
                             speedup=ms / r["ms"], fc1=r["fc1"], fc2=r["fc2"]))
        header = ("| T | experts | fp4moe (us) | TB/s | TFLOP/s | floor (us) | % of floor | torch peer (us) | "
                  "peer % of floor | peer / fp4moe |")
        lines = [header, "|" + "---|" * 10]
        for r in rows:
            lines.append(f"| {r['T']} | {r['experts']} | {r['fp4_ms'] * 1e3:.1f} | {r['tbs']:.2f} | {r['tflops']:.1f} | "
                         f"{r['floor_ms'] * 1e3:.1f} | {r['pct']:.1f}% | {r['peer_ms'] * 1e3:.1f}"
                         f"{'' if r['peer_mode'] == 'graph' else ' (eager)'} | {r['peer_pct']:.1f}% | "
                         f"{r['speedup']:.2f}x |")
        title = (f"fp4moe tactic family: {bench.get('family', 'any')}; "
                 f"{bench.get('shard', {}).get('text', 'whole layer')} ({d})")
        tactics = "tactics (fc1 / fc2): " + "; ".join(f"T={r['T']}: {r['fc1']} / {r['fc2']}" for r in rows)
        print(f"\n{title}\n" + "\n".join(lines) + "\n" + tactics)
        out_md += [f"\n{title}\n", "\n".join(lines), "\n" + tactics + "\n"]
        all_rows[d] = rows
    for d, _ in benches:
        with open(os.path.join(d, "peer.json"), "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__, copy_tbs=copy_tbs, matmul_tflops=mm_tflops,
                           rows=all_rows[d]), f, indent=2)
    with open(os.path.join(first_dir, "table.md"), "w") as f:
        f.write("\n".join(out_md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
