#!/usr/bin/env python3
"""The hottest SASS lines of an Nsight Compute source page (`ncu -i R --page source --csv --print-source sass`):
the column names once, the stall-sampling totals by column, then the lines with the most samples."""
import csv
import sys


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=60):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The header is the first row that names a sampling column.
    hi = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
    if hi is None:
        print("no sampling column; first rows:", rows[:3])
        return
    head, body = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
    print("columns:", " | ".join(head)[:1500])
    samp = [i for i, c in enumerate(head) if "Sampling" in c and "Not" not in c]
    key = samp[0] if samp else 0
    src = next((i for i, c in enumerate(head) if c.strip() in ("Source", "Sass", "SASS")), 1)
    addr = next((i for i, c in enumerate(head) if "Address" in c), 0)
    numeric = [i for i, c in enumerate(head) if i not in (src, addr) and any(num(r[i]) for r in body)]
    execd = next((i for i, c in enumerate(head) if c == "Instructions Executed"), None)
    tot = {head[i]: sum(num(r[i]) for r in body) for i in numeric}
    print("totals:", "; ".join(f"{k}={v:.0f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v)[:2500])
    body.sort(key=lambda r: -num(r[key]))
    for r in body[:top]:
        extra = ", ".join(f"{head[i].replace('stall_', '')[:14]}={r[i]}" for i in numeric
                          if i != key and head[i].startswith("stall") and num(r[i]) >= 0.1 * max(num(r[key]), 1))
        extra = f"n={r[execd]} " + extra if execd is not None else extra
        print(f"{r[addr]:>8} {num(r[key]):7.0f} {r[src][:60]:<60} {extra[:200]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_hot.py SOURCE_PAGE.csv  (from ncu -i REPORT --page source --csv --print-source sass)")
    main(sys.argv[1])
