#!/usr/bin/env python3
"""The checks of test_fsdp2.py and test_rl_tp.py can fail (issue 38), without a GPU or torch
(ctest cachet_dist_checks, label unit): per-rank results made up here, clean and with one planted
fault each, go through the drivers' own comparisons; each clean set passes and each planted fault
is caught by the check meant for it. Also the harness: a torchrun that hangs (a stand-in
torch.distributed.run that starts a grandchild and sleeps) is killed with its whole process
group after the timeout (rc 124, the grandchild gone), and a rank started without the multicast
variables exits 3 before it imports torch.
"""
import copy
import os
import subprocess
import sys
import tempfile
import time

import dist_harness as H
import preamble
import test_fsdp2 as F
import test_rl_tp as R

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
check = preamble.Checks()


def caught(module, fn, want, expect_fail=True):
    """Runs fn with the module's checks cleared; True when it failed (or passed) as expected and,
    when it should fail, some failure names `want`."""
    module.check.failures.clear()
    out = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        fn()
    finally:
        sys.stdout.close()
        sys.stdout = out
    fails = list(module.check.failures)
    if not expect_fail:
        return not fails, fails
    return any(want in f for f in fails), fails


def fsdp_rank(r, loss=1.5):
    stats = {k: 0 for k in F.STAT_KEYS}
    stats.update({"reserved_bytes.all.peak": 300 * MiB, "allocated_bytes.all.peak": 200 * MiB, "num_alloc_retries": 2})
    return {"rank": r, "backend": "c10", "allocator": "native", "alloc_conf": "policy:pytorch",
            "losses": [float.hex(loss), float.hex(loss / 2)], "loss_values": [loss, loss / 2],
            "params": [float.hex(3.0), float.hex(-1.25)], "step_peaks": [250 * MiB, 300 * MiB], "stats": stats}


def fsdp_cases():
    n = [fsdp_rank(0), fsdp_rank(1)]
    nat = (n, copy.deepcopy(n))

    def with_fault(edit, stats_too=True, natives=nat):
        got = copy.deepcopy(n)
        edit(got)
        return lambda: F.compare("pytorch", natives, got, stats_too)

    def loss_bit(g):
        g[1]["losses"][1] = float.hex(float.fromhex(g[1]["losses"][1]) * (1 + 2 ** -52))

    def param(g):
        g[0]["params"][1] = float.hex(-1.0)

    def peak(g):
        g[1]["stats"]["reserved_bytes.all.peak"] += 2 * MiB

    def retries(g):
        g[0]["stats"]["num_alloc_retries"] = 0

    def step(g):
        g[0]["step_peaks"][0] += 512

    def backend(g):
        g[0]["backend"] = None

    ok, fails = caught(F, with_fault(lambda g: None), "", expect_fail=False)
    check(ok, f"fsdp2: clean per-rank results pass ({fails[:2]})")
    for name, edit, want in (("a loss one ulp off", loss_bit, "losses rank 1"),
                             ("a parameter shard off", param, "params rank 0"),
                             ("peak reserved 2 MiB higher", peak, "reserved_bytes.all.peak"),
                             ("no retries where native had 2", retries, "num_alloc_retries"),
                             ("a step's peak 512 B higher", step, "after each of"),
                             ("a rank not on the c10 backend", backend, "backend()")):
        ok, fails = caught(F, with_fault(edit), want)
        check(ok, f"fsdp2: {name} is caught ({fails[:1]})")
    ok, fails = caught(F, with_fault(peak, stats_too=False), "", expect_fail=False)
    check(ok, "fsdp2: under policy:cachet the peaks are not compared (only the losses and parameters)")
    n2 = copy.deepcopy(n)
    n2[1]["stats"]["reserved_bytes.all.peak"] += 4 * MiB
    ok, fails = caught(F, with_fault(peak, natives=(n, n2)), "", expect_fail=False)
    check(ok and any("native disagrees with itself" in x for x in F.notes),
          "fsdp2: a key where the two native runs disagree is noted, not compared")
    n3 = copy.deepcopy(n)
    n3[0]["losses"][0] = float.hex(1.5 + 1e-6)
    ok, fails = caught(F, with_fault(lambda g: g[0].update(losses=[float.hex(1.5 + 1e-3), g[0]["losses"][1]]),
                                     natives=(n, n3)), "within 2x")
    check(ok, "fsdp2: where native is not reproducible, a loss far outside its spread is caught")


def rl_rank(r, mode):
    cyc = 4
    return {"rank": r, "mode": mode, "backend": None if mode == "native" else "c10", "graph_on": True,
            "outputs": [f"out{c}" for c in range(cyc)], "final": "final", "losses": [f"l{c}" for c in range(cyc)],
            "collectives": [{"all_reduce_exact": True, "all_gather_exact": True, "digest": f"d{c}"} for c in range(cyc)],
            "free": [80 << 30] * cyc, "reserved": [3 << 30] * cyc, "rss": [2 << 30] * cyc,
            "slept": [2 << 30] * cyc if mode == "sleep" else [], "rise": [2 << 30] * cyc if mode == "sleep" else [],
            "captures": 1, "replay_errors": [], "sleeping_at_end": [] if mode != "native" else None}


def rl_cases():
    nat = [rl_rank(0, "native"), rl_rank(1, "native")]
    nos = [rl_rank(0, "nosleep"), rl_rank(1, "nosleep")]
    slp = [rl_rank(0, "sleep"), rl_rank(1, "sleep")]

    def with_fault(edit):
        got = copy.deepcopy(slp)
        edit(got)
        return lambda: R.compare_run("sleep", got, nos, nat, True)

    ok, fails = caught(R, with_fault(lambda g: None), "", expect_fail=False)
    check(ok, f"rl_tp: clean per-rank results pass ({fails[:2]})")
    faults = (
        ("one cycle's decode output differs on rank 1", lambda g: g[1]["outputs"].__setitem__(2, "bad"), "cycles differing: [2]"),
        ("the output after the loop differs", lambda g: [x.update(final="bad") for x in g], "one after the loop"),
        ("ranks disagree within the run", lambda g: g[1]["outputs"].__setitem__(0, "x"), "equal rank 0's"),
        ("a trainer loss differs", lambda g: g[0]["losses"].__setitem__(3, "l9"), "trainer losses"),
        ("a collective's result differs", lambda g: g[0]["collectives"][1].update(digest="z"), "collective results"),
        ("an all_reduce not exact", lambda g: g[1]["collectives"][3].update(all_reduce_exact=False), "exact every cycle"),
        ("the graph captured twice", lambda g: g[0].update(captures=2), "captured once"),
        ("free memory 3 MiB lower by the last cycle", lambda g: g[0]["free"].__setitem__(3, (80 << 30) - 3 * MiB), "device free memory"),
        ("reserved 4 MiB higher", lambda g: g[1]["reserved"].__setitem__(2, (3 << 30) + 4 * MiB), "memory_reserved()"),
        ("a sleep that gave nothing back", lambda g: g[0]["slept"].__setitem__(1, 0), "every sleep gave"),
        ("free memory rising by 90% of what sleep reported", lambda g: g[1]["rise"].__setitem__(0, int(0.9 * (2 << 30))), "rose by >= 99%"),
        ("a tag still asleep at the end", lambda g: g[0].update(sleeping_at_end=["weights"]), "nothing asleep"),
        ("host RSS 64 MiB higher", lambda g: g[0]["rss"].__setitem__(3, (2 << 30) + 64 * MiB), "host RSS"),
    )
    for name, edit, want in faults:
        ok, fails = caught(R, with_fault(edit), want)
        check(ok, f"rl_tp: {name} is caught ({fails[:1]})")
    ok, fails = caught(R, lambda: R.compare_run("native", nat, None, nat, False), "", expect_fail=False)
    check(ok, f"rl_tp: the native reference passes its own checks ({fails[:2]})")


def harness_cases():
    tmp = tempfile.mkdtemp(prefix="cachet-dist-checks-")
    pkg = os.path.join(tmp, "torch", "distributed")
    os.makedirs(pkg)
    open(os.path.join(tmp, "torch", "__init__.py"), "w").close()
    open(os.path.join(pkg, "__init__.py"), "w").close()
    pidfile = os.path.join(tmp, "grandchild.pid")
    with open(os.path.join(pkg, "run.py"), "w") as f:
        f.write("import subprocess, time\n"
                f"p = subprocess.Popen(['sleep', '300'])\nopen({pidfile!r}, 'w').write(str(p.pid))\n"
                "time.sleep(300)\n")
    env = H.child_env({"PYTHONPATH": tmp})
    t0 = time.time()
    rc, secs = H.torchrun(os.path.join(HERE, "test_rl_tp.py"), 2, ["--worker", "none"], env, 3,
                          os.path.join(tmp, "hang.log"))
    gone = False
    try:
        pid = int(open(pidfile).read())
        for _ in range(50):
            try:
                os.kill(pid, 0)
                if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                    gone = True  # a zombie: killed, waiting for init
                    break
            except (ProcessLookupError, FileNotFoundError):
                gone = True
                break
            time.sleep(0.1)
    except (OSError, ValueError):
        pass
    check(rc == 124 and time.time() - t0 < 60, f"harness: a hanging torchrun is stopped after its timeout (rc {rc}, {secs:.1f} s)")
    check(gone, "harness: its grandchild (a rank) is killed with it (the process group)")
    bare = {k: v for k, v in os.environ.items() if k not in H.MULTICAST_OFF}
    r = subprocess.run([sys.executable, os.path.join(HERE, "test_rl_tp.py"), "--worker", "none"], env=bare,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 3 and "NCCL_NVLS_ENABLE" in r.stderr,
          f"harness: a rank without the multicast variables exits 3 naming them (rc {r.returncode})")
    env = H.child_env()
    check(all(env.get(k) == v for k, v in H.MULTICAST_OFF.items()), "harness: child_env() sets the multicast variables")


def main():
    fsdp_cases()
    rl_cases()
    harness_cases()
    print(f"dist_checks: {'FAIL' if check.failures else 'ok'} ({len(check.failures)} failures)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
