#!/usr/bin/env python3
"""Checks the SASS of the sm90 kernels (cuobjdump -sass BINARY | check_sass.py): every kernel has HGMMA (QGMMA,
its e4m3 form, on the e4m3 tile; both are counted as HGMMA below),
no local memory (LDL/STL; also in the resident tactic's CUDA-core kernels, which have no HGMMA by design), and
no instruction writes an in-flight HGMMA's A or accumulator registers
(or reads its accumulators) before the WARPGROUP.DEPBAR that retires it, and ptxas has not serialised the
wgmmas (every HGMMA waited for on its own). RS wgmma reads its A registers asynchronously, so reusing them
early is a race that only shows under unlucky timing.

HGMMAs are grouped as the hardware does: a group ends at the HGMMA carrying gsb0 (wgmma.commit_group),
and WARPGROUP.DEPBAR.LE gsb0, N retires all but the N most recent groups (wgmma.wait_group N), so the
consumer's pipelined main loop, which rewrites an A buffer after a DEPBAR.LE 1 (or 3) has retired the
group reading it, is checked group by group. The scan is linear in address order (it does not follow
branches); the main loop is entered from a peeled first body with the same groups in flight as its back
edge carries, so the linear order sees the loop-top state. Exit status 1 on a finding."""
import re
import sys

def regs(first, count):
    return {first + i for i in range(count)}

def dest_width(op):
    if ".128" in op:
        return 4
    if ".64" in op or op.startswith("IMAD.WIDE") or op.startswith("LEA.HI.X.SX32"):
        return 2
    return 1

NO_DEST = ("ST", "RED", "BRA", "BAR", "SYNCS", "WARPGROUP", "EXIT", "RET", "CALL", "BSSY", "BSYNC", "NOP",
           "WARPSYNC", "MEMBAR", "FENCE", "DEPBAR", "UTMA", "LDGSTS", "ARRIVES", "YIELD", "ERRBAR", "CCTL")

GMMA = ("HGMMA", "QGMMA")  # bf16 wgmma; e4m3 wgmma (the e4m3 tile)


def is_gmma(ins):
    return any(g in ins for g in GMMA)


def main():
    funcs = {}
    name = None
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and name:
            funcs[name].append(m.group(1).strip())
    bad = 0
    kernels = {n: ins for n, ins in funcs.items() if "grouped_kernel" in n}
    for n, ins in kernels.items():
        hgmma = sum(1 for i in ins if is_gmma(i))
        local = sum(1 for i in ins if re.match(r"(@!?U?P\w+\s+)?(LDL|STL)", i))
        groups = []            # committed groups in flight, oldest first: (A registers, accumulators)
        open_a, open_d = set(), set()
        for i in ins:
            body = re.sub(r"^@!?U?P\w+\s+", "", i)
            op = body.split()[0]
            operands = body[len(op):].split(",")
            if op.startswith(GMMA):
                m = re.match(r"[HQ]GMMA\.64x(\d+)x(?:16|32)\S*\s+R(\d+),\s*R(\d+)", body)
                if m:
                    n_cols, d0, a0 = int(m.group(1)), int(m.group(2)), int(m.group(3))
                    open_d |= regs(d0, n_cols // 2)
                    open_a |= regs(a0, 4)
                if "gsb0" in body:
                    groups.append((open_a, open_d))
                    open_a, open_d = set(), set()
                continue
            m = re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)", body)
            if m:
                keep = int(m.group(1), 16)
                groups = groups[len(groups) - keep:] if keep else []
                continue
            inflight_a = set().union(open_a, *(g[0] for g in groups))
            inflight_d = set().union(open_d, *(g[1] for g in groups))
            srcs = {int(x) for x in re.findall(r"\bR(\d+)\b", ",".join(operands[1:]))}
            if srcs & inflight_d:
                print(f"{n}: '{i}' reads in-flight accumulators {sorted(srcs & inflight_d)}")
                bad += 1
            if op.startswith(NO_DEST) or not operands or not operands[0].strip().startswith("R"):
                continue
            m = re.match(r"\s*R(\d+)", operands[0])
            if not m:
                continue
            dst = regs(int(m.group(1)), dest_width(op))
            if dst & (inflight_a | inflight_d):
                print(f"{n}: '{i}' writes in-flight wgmma registers {sorted(dst & (inflight_a | inflight_d))}")
                bad += 1
        # ptxas serialises every wgmma of a kernel when it finds a non-wgmma instruction defining or reading
        # a wgmma's registers inside a pipeline stage (C7513, C7514: an info line, not an error): each HGMMA
        # is then a group of its own followed at once by DEPBAR.LE gsb0, 0x0.
        wg = [re.sub(r"^@!?U?P\w+\s+", "", i) for i in ins if is_gmma(i) or i.startswith("WARPGROUP")]
        waits_alone = sum(1 for a, b in zip(wg, wg[1:]) if a.startswith(GMMA) and "gsb0" in a and
                          re.match(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b", b))
        serial = hgmma >= 2 and waits_alone == hgmma
        print(f"{n[:110]}: HGMMA {hgmma}, LDL/STL {local}" + (", every HGMMA waited for alone (serialised)" if serial else ""))
        if hgmma == 0 or local != 0 or serial:
            bad += 1
    # The resident tactic's kernels (sm90_cc.cu) run their math on the CUDA cores: no HGMMA by design, but
    # no local memory either.
    for n, ins in funcs.items():
        if "cc_resident_kernel" not in n:
            continue
        local = sum(1 for i in ins if re.match(r"(@!?U?P\w+\s+)?(LDL|STL)", i))
        print(f"{n[:110]}: resident (no HGMMA by design), LDL/STL {local}")
        if local != 0:
            bad += 1
    if not kernels:
        print("no sm90 grouped kernels found")
        return 1
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
