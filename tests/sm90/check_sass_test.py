#!/usr/bin/env python3
"""check_sass.py (src/kernels/sm90_wgmma) on hand-written SASS: it must accept an A buffer rewritten after
the WARPGROUP.DEPBAR that retires the group reading it, and flag a write to the A registers or the
accumulators of a group still in flight, a missing HGMMA, local memory and wgmmas that ptxas serialised;
the same for the e4m3 tile's QGMMA; the resident tactic's kernel passes without HGMMA but not with local memory.
No GPU needed."""
import os
import subprocess
import sys

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "kernels", "sm90_wgmma",
                       "check_sass.py")


def sass(name, body):
    lines = ["        Function : " + name]
    for i, ins in enumerate(body):
        lines.append("        /*%04x*/                   %s ;   /* 0x0 */" % (i * 16, ins))
    return "\n".join(lines) + "\n"


def run(text):
    p = subprocess.run([sys.executable, CHECKER], input=text, capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    k = "_Z30sm90_nvfp4w4a16_grouped_kernelv"
    # Two groups in flight (A in R40..R43 and R44..R47); DEPBAR.LE 1 retires the first, so rewriting
    # R40 is fine, and after DEPBAR.LE 0 the accumulators may be read.
    body = [
        "WARPGROUP.ARRIVE",
        "HGMMA.64x8x16.F32.BF16 R24, R40, gdesc[UR4], R24, gsb0",
        "WARPGROUP.ARRIVE",
        "HGMMA.64x8x16.F32.BF16 R24, R44, gdesc[UR8], R24, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "LOP3.LUT R40, R8, 0x81c081c0, RZ, 0xc0, !PT",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "FADD R2, R24, R25",
    ]

    def variant(i, ins):
        b = list(body)
        b[i] = ins
        return sass(k, b)

    ok = sass(k, body)
    early_a = variant(5, "LOP3.LUT R44, R8, 0x81c081c0, RZ, 0xc0, !PT")  # the second group still reads R44
    early_d = variant(5, "FADD R3, R24, R25")                            # its accumulators are in flight
    open_group = variant(3, "HGMMA.64x8x16.F32.BF16 R24, R44, gdesc[UR8], R24")  # no gsb0: group not closed
    open_group = open_group.replace("LOP3.LUT R40", "LOP3.LUT R44")
    no_hgmma = sass(k, ["WARPGROUP.ARRIVE", "FADD R2, R24, R25"])
    local = variant(7, "LDL R2, [R1]")
    serialised = sass(k, ["WARPGROUP.ARRIVE", "HGMMA.64x8x16.F32.BF16 R24, R40, gdesc[UR4], R24, gsb0",
                          "WARPGROUP.DEPBAR.LE gsb0, 0x0", "WARPGROUP.ARRIVE",
                          "HGMMA.64x8x16.F32.BF16 R24, R44, gdesc[UR8], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                          "FADD R2, R24, R25"])
    # The e4m3 tile's QGMMA (m64n8k32 e4m3): counted as a wgmma, its A registers and accumulators tracked.
    q = [x.replace("HGMMA.64x8x16.F32.BF16", "QGMMA.64x8x32.F32.E4M3.E4M3") for x in body]
    ok_q = sass(k, q)
    early_a_q = sass(k, q[:5] + ["LOP3.LUT R44, R8, 0x9c9c9c9c, RZ, 0xc0, !PT"] + q[6:])
    early_d_q = sass(k, q[:5] + ["FADD R3, R24, R25"] + q[6:])
    # The resident tactic's CUDA-core kernel beside a grouped kernel: no HGMMA is fine, local memory is not.
    cc = "_ZN6fp4moe4sm9023sm90_cc_resident_kernelILi3EEEvNS0_8CcParamsE"
    resident_ok = ok + sass(cc, ["HFMA2 R4, R5, R6, R4", "RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R4"])
    resident_local = ok + sass(cc, ["HFMA2 R4, R5, R6, R4", "STL [R1], R4"])
    cases = [("retired buffer rewritten", ok, 0), ("in-flight A rewritten", early_a, 1),
             ("resident kernel, no HGMMA", resident_ok, 0), ("resident kernel, local memory", resident_local, 1),
             ("QGMMA: retired buffer rewritten", ok_q, 0), ("QGMMA: in-flight A rewritten", early_a_q, 1),
             ("QGMMA: in-flight accumulators read", early_d_q, 1),
             ("in-flight accumulators read", early_d, 1), ("open group's A rewritten", open_group, 1),
             ("no HGMMA", no_hgmma, 1), ("local memory", local, 1), ("every HGMMA waited for alone", serialised, 1)]
    bad = 0
    for what, text, want in cases:
        rc, out = run(text)
        status = "ok" if rc == want else "WRONG"
        bad += rc != want
        print("%-30s rc=%d (want %d) %s" % (what, rc, want, status))
        if rc != want:
            print(out)
    print("check_sass_test: %d of %d cases as expected" % (len(cases) - bad, len(cases)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
