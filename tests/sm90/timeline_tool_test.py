#!/usr/bin/env python3
"""tools/sm90_timeline.py on a hand-written bench_sm90 --trace file: the per-launch summary (CTAs, entry and
exit spans, routing and set-up, items per CTA, first and later items' percentiles, items in flight per window) must match
what the records say, and a missing argument prints the usage. No GPU needed."""
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "sm90_timeline.py")
HEADER = "T,run,mode,cta,sm,entry_ns,setup_ns,exit_ns,j,item,weights_ns,tokens_ns,start_ns,end_ns,mainloop_ns,routed_ns\n"


def row(cta, sm, j, item, start_us, end_us, exit_us=10.0):
    ns = lambda us: int(us * 1000)
    return "1,chain,2,%d,%d,0,1200,%d,%d,%d,%d,%d,%d,%d,%d,800\n" % (
        cta, sm, ns(exit_us), j, item, ns(start_us - 0.3), ns(start_us - 0.2), ns(start_us), ns(end_us),
        ns(end_us - 0.3))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.csv")
        with open(path, "w") as f:
            f.write(HEADER)
            # CTA 0: two items (0-4 us, 4-8 us); CTA 1: one item (1-9 us).
            f.write(row(0, 5, 0, 0, 0.5, 4.0, 8.5))
            f.write(row(0, 5, 1, 2, 4.2, 8.0, 8.5))
            f.write(row(1, 5, 0, 1, 1.0, 9.0, 9.5))
        p = subprocess.run([sys.executable, TOOL, path, "--windows"], capture_output=True, text=True)
        out = p.stdout
        expect = [
            "== T=1 chain",
            "chain: 2 CTAs, entry 0.0..0.0 us",
            "exit 8.5..9.5 us, 3 items",
            "routed p10/50/90 0.8/0.8/0.8 us",
            "set-up done p10/50/90 1.2/1.2/1.2 us",
            "items per CTA: 1:1, 2:1",
            "first item (2):",
            "later items (1):",
            "end 8.0/8.0/8.0/max 8.0",
            "in flight (us:items) 0:2 2:2 4:2 6:2 8:1 10:0",
        ]
        if p.returncode != 0:
            failures.append("exit code %d: %s" % (p.returncode, p.stderr))
        for e in expect:
            if e not in out:
                failures.append("missing %r in:\n%s" % (e, out))
    p = subprocess.run([sys.executable, TOOL], capture_output=True, text=True)
    if p.returncode != 2 or "sm90_timeline.py TRACE.csv" not in p.stdout:
        failures.append("no usage without arguments (exit %d)" % p.returncode)
    for f in failures:
        print("FAIL:", f)
    print("timeline tool: %d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
