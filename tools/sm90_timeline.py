#!/usr/bin/env python3
"""Summarises bench_sm90 --trace and fp4moe bench --trace records (src/kernels/sm90_wgmma/sm90_trace.cuh): per T and run, each
launch's span, its CTAs' routing and set-up, and for its items the time from the launch's first CTA entry to the first weight copy,
the consumer start and end, and how many items were in flight in 2-us windows.

    tools/sm90_timeline.py TRACE.csv [--windows]
"""
import csv
import statistics
import sys
from collections import defaultdict

MODES = {0: "fc1", 1: "fc2", 2: "chain"}


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else float("nan")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    windows = "--windows" in sys.argv
    groups = defaultdict(list)
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            groups[(int(r["T"]), r["run"])].append(r)
    for (T, run), rows in sorted(groups.items()):
        print(f"== T={T} {run}")
        by_mode = defaultdict(list)
        for r in rows:
            by_mode[int(r["mode"])].append(r)
        for m, rs in sorted(by_mode.items()):
            ctas = {}
            for r in rs:
                ctas[int(r["cta"])] = (int(r["entry_ns"]), int(r["exit_ns"]))
            entries = [e for e, _ in ctas.values()]
            exits = [x for _, x in ctas.values() if x >= 0]
            items = [r for r in rs if int(r["j"]) >= 0]
            print(f"  {MODES[m]}: {len(ctas)} CTAs, entry {min(entries)/1e3:.1f}..{max(entries)/1e3:.1f} us "
                  f"(median {statistics.median(entries)/1e3:.1f}), exit {min(exits)/1e3:.1f}..{max(exits)/1e3:.1f} us, "
                  f"{len(items)} items")
            # Each CTA's prologue: routing done (a launch that routes its batch itself) and set-up done.
            heads = {int(r["cta"]): r for r in rs}.values()
            for col, name in (("route_step0_ns", "routing: picks done"), ("route_step1_ns", "routing: past its barrier"),
                              ("route_step2_ns", "routing: offsets complete"), ("routed_ns", "routed"),
                              ("fetch_ns", "first fetch returned"), ("setup_ns", "set-up done")):
                v = [int(r[col]) / 1e3 for r in heads if int(r.get(col, -1) or -1) >= 0]
                if v:
                    print(f"    {name} p10/50/90 {pct(v,.1):.1f}/{pct(v,.5):.1f}/{pct(v,.9):.1f} us")
            if not items:
                continue
            per_cta = defaultdict(int)
            for r in items:
                per_cta[int(r["cta"])] += 1
            hist = defaultdict(int)
            for c in per_cta.values():
                hist[c] += 1
            print("    items per CTA: " + ", ".join(f"{k}:{v}" for k, v in sorted(hist.items())))
            # Each CTA's first item (handed out with the launch) apart from the items it fetched later.
            first = [r for r in items if int(r["j"]) == 0]
            later = [r for r in items if int(r["j"]) > 0]
            for name, sel in (("first item", first), ("later items", later)):
                if not sel:
                    continue
                w = [int(r["weights_ns"]) / 1e3 for r in sel]
                t = [int(r["tokens_ns"]) / 1e3 for r in sel]
                s = [int(r["start_ns"]) / 1e3 for r in sel]
                e = [int(r["end_ns"]) / 1e3 for r in sel]
                d = [b - a for a, b in zip(s, e)]
                print(f"    {name} ({len(sel)}): weights p10/50/90 {pct(w,.1):.1f}/{pct(w,.5):.1f}/{pct(w,.9):.1f}, "
                      f"tokens {pct(t,.1):.1f}/{pct(t,.5):.1f}/{pct(t,.9):.1f}, start {pct(s,.1):.1f}/{pct(s,.5):.1f}/"
                      f"{pct(s,.9):.1f}, end {pct(e,.1):.1f}/{pct(e,.5):.1f}/{pct(e,.9):.1f}/max {max(e):.1f}, "
                      f"consume {pct(d,.1):.1f}/{pct(d,.5):.1f}/{pct(d,.9):.1f} us")
            if windows:
                end = max(int(r["end_ns"]) for r in items)
                step = 2000
                line = []
                for t0 in range(0, end + step, step):
                    n = sum(1 for r in items if int(r["start_ns"]) < t0 + step and int(r["end_ns"]) > t0)
                    line.append(f"{t0//1000}:{n}")
                print("    in flight (us:items) " + " ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
