#!/usr/bin/env python3
"""CLI checks of `fp4moe doctor` and `fp4moe tune` that need no GPU.

  doctor --device-profile rtx-pro-6000: the sm90 family rejected (architecture, and shared memory for the
      tiles above 99 KB), the portable family accepted; --device-profile h200 accepts the sm90 family
  doctor without a device and without a profile: exit 4, the message suggests --device-profile
  logs: a new file per run, every line with a UTC timestamp and the run id; an existing --log-file refused
  tune --simulate (worker processes, modelled timings): writes the cache, a second run loads it; a corrupt,
      truncated, other-device, other-version cache each gives exactly one warning, a retune and exit 0
  tune without a device: exit 4

Usage: cli_tuner.py FP4MOE_BINARY
"""
import json
import os
import re
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILURES.append(what)


def run(binary, args, env):
    p = subprocess.run([binary] + args, capture_output=True, text=True, env=env, timeout=240)
    return p.returncode, p.stdout, p.stderr


LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z run=(\S+) (rank=\d+ )?[DIWE] \w+: ")


def log_lines_ok(path):
    with open(path) as f:
        lines = f.read().splitlines()
    ids = set()
    for l in lines:
        m = LINE.match(l)
        if not m:
            return False, "bad line: " + l
        ids.add(m.group(1))
    return len(lines) > 0 and len(ids) == 1, f"{len(lines)} lines, run ids {ids}"


def main():
    binary = sys.argv[1]
    work = tempfile.mkdtemp(prefix="fp4moe-cli-tuner-")
    env = dict(os.environ)
    env["FP4MOE_LOG_DIR"] = os.path.join(work, "logs")
    env.pop("FP4MOE_RUN_ID", None)
    env.pop("FP4MOE_CACHE", None)
    env["XDG_CACHE_HOME"] = os.path.join(work, "xdg")

    # doctor on sm_120 (99 KB per block)
    rc, out, err = run(binary, ["doctor", "--device-profile", "rtx-pro-6000", "--json"], env)
    check(rc == 0, f"doctor --device-profile rtx-pro-6000 --json exits 0 (rc={rc}) {err[-300:]}")
    doc = json.loads(out)
    check(doc["device"]["cc"] == "12.0" and doc["device"]["smem_per_block_optin"] == 101376,
          "rtx-pro-6000 profile: sm_120, 99 KB per block")
    rows = doc["tactics"]
    sm90 = [t for t in rows if t["tactic"].startswith("sm90.")]
    portable = [t for t in rows if t["tactic"].startswith("portable.")]
    check(len(portable) > 0 and all(t["verdict"] == "ok" for t in portable), "rtx-pro-6000: every portable tactic runs")
    check(any(t["fallback"] for t in portable), "the fallback is a portable tactic")
    if sm90:
        check(all(t["verdict"] == "rejected" and "sm_90a" in t["reason"] for t in sm90),
              "rtx-pro-6000: every sm90 tactic rejected, naming sm_90a")
        big = [t for t in sm90 if "shared memory per block, device allows 99.0 KB" in t["reason"]]
        check(len(big) > 0, f"rtx-pro-6000: {len(big)} sm90 rows rejected for shared memory above 99 KB")
        for t in big[:2]:
            print("      e.g.", t["tactic"], t["op"], "-", t["reason"])
    else:
        print("note  this build has no sm90 family descriptors")
    rc, out, _ = run(binary, ["doctor", "--device-profile", "rtx-pro-6000"], env)
    check(rc == 0 and "rejected" in out and "needs" in out and "device allows 99.0 KB" in out or not sm90,
          "doctor --device-profile rtx-pro-6000 (text) shows rejections with reasons")
    rc, out, _ = run(binary, ["doctor", "--device-profile", "h200", "--json"], env)
    doc = json.loads(out)
    check(rc == 0 and all(t["verdict"] == "ok" for t in doc["tactics"]), "doctor --device-profile h200 accepts every tactic")
    rc, out, _ = run(binary, ["doctor", "--device-profile", "l40s", "--json"], env)
    doc = json.loads(out)
    check(all(t["verdict"] == "rejected" for t in doc["tactics"] if t["tactic"].startswith("sm90.")),
          "doctor --device-profile l40s rejects the sm90 family")
    rc, _, err = run(binary, ["doctor", "--device-profile", "h300"], env)
    check(rc != 0 and "known profiles" in err, f"unknown profile is an error listing the known ones (rc={rc})")

    # doctor without a device
    rc, out, err = run(binary, ["doctor"], env)
    if rc == 4:
        check("--device-profile" in err and "no CUDA device" in err, "doctor without a device suggests --device-profile")
    else:
        print(f"note  doctor found a device (rc={rc}); the no-device message is not checked")

    # logs: one new file per run
    logs = os.path.join(work, "logs")
    before = set(os.listdir(logs)) if os.path.isdir(logs) else set()
    run(binary, ["doctor", "--device-profile", "a100"], env)
    run(binary, ["doctor", "--device-profile", "a100"], env)
    new = sorted(set(os.listdir(logs)) - before)
    check(len(new) == 2, f"two runs wrote two new log files: {new}")
    for name in new:
        ok, why = log_lines_ok(os.path.join(logs, name))
        check(ok, f"{name}: every line has a timestamp and the one run id ({why})")
    fixed = os.path.join(work, "fixed.log")
    rc, _, _ = run(binary, ["doctor", "--device-profile", "a100", "--log-file", fixed], env)
    check(rc == 0 and os.path.exists(fixed), "--log-file creates the named file")
    size = os.path.getsize(fixed)
    rc, _, err = run(binary, ["doctor", "--device-profile", "a100", "--log-file", fixed], env)
    check(rc != 0 and "already exists" in err and os.path.getsize(fixed) == size,
          f"an existing --log-file is refused and left alone (rc={rc})")

    # tune without a device
    if subprocess.run([binary, "doctor"], capture_output=True, env=env).returncode == 4:
        rc, _, err = run(binary, ["tune", "--max-bucket", "8"], env)
        check(rc == 4 and "--device-profile" in err, f"tune without a device exits 4 and points to doctor (rc={rc})")

    # tune --simulate: cache written, hit, and every kind of bad cache
    cache = os.path.join(work, "cache", "tuning.json")
    base = ["tune", "--simulate", "h200", "--max-bucket", "64", "--cache", cache]
    rc, out, err = run(binary, base + ["--json"], env)
    check(rc == 0, f"tune --simulate h200 (worker processes) exits 0 (rc={rc}) {err[-400:]}")
    if rc == 0:
        doc = json.loads(out)
        check(len(doc["choices"]) == 2 * 7 and doc["from_cache"] is False, "14 choices for buckets 1..64, tuned")
        check(os.path.exists(cache), "cache written")
    rc, out, err = run(binary, base, env)
    check(rc == 0 and "loaded from cache" in out and " W " not in err, "second run loads the cache silently")

    def one_warning_and_retune(what, words):
        rc, out, err = run(binary, base, env)
        warnings = [l for l in err.splitlines() if " W tuner: tuning cache" in l]
        check(rc == 0 and len(warnings) == 1 and words in warnings[0] and "tuned 7 buckets" in out,
              f"{what}: one warning, retune, exit 0 (rc={rc}, warnings={warnings})")
        rc, out, err = run(binary, base, env)
        check(rc == 0 and "loaded from cache" in out, f"{what}: the rewritten cache is used next time")

    if not os.path.exists(cache):
        check(False, "no cache was written, so the bad-cache cases cannot run (does main() forward the tuner "
                     "worker flag with fp4moe::tuner_worker_main_if_requested?)")
        print(f"{len(FAILURES)} failure(s)")
        return 1
    good = open(cache).read()
    with open(cache, "w") as f:
        f.write("{\x00garbage")
    one_warning_and_retune("corrupt cache", "corrupt")
    with open(cache, "w") as f:
        f.write(good[: len(good) // 3])
    one_warning_and_retune("truncated cache", "corrupt or truncated")
    os.remove(cache)
    rc, _, _ = run(binary, ["tune", "--simulate", "b200", "--max-bucket", "64", "--cache", cache], env)
    check(rc == 0, "cache written for a b200 profile")
    one_warning_and_retune("cache from another device profile", "another device")
    doc = json.loads(open(cache).read())
    for e in doc["entries"]:
        e["key"]["library"] = "0.0.0-old"
    with open(cache, "w") as f:
        f.write(json.dumps(doc))
    one_warning_and_retune("cache from another version", "written by fp4moe 0.0.0-old")
    # FP4MOE_CACHE selects the file when there is no --cache
    env2 = dict(env)
    env2["FP4MOE_CACHE"] = os.path.join(work, "env-cache.json")
    rc, _, _ = run(binary, ["tune", "--simulate", "a100", "--max-bucket", "4", "--no-isolate"], env2)
    check(rc == 0 and os.path.exists(env2["FP4MOE_CACHE"]), "FP4MOE_CACHE names the cache file")

    print(f"{len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
