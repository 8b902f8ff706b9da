#!/usr/bin/env python3
"""An RL-shaped sleep/wake loop across ranks on cachet's c10 backend (issue 38, Done-when 3),
started by `torchrun --nproc_per_node N`. On every rank:

  engine   a tensor-parallel MLP over all ranks (L layers; column-parallel W1, row-parallel W2,
           all_reduce after each layer; weights and its input buffer tagged "weights" and backed up
           across sleep, a KV-cache buffer tagged "kv_cache", not backed up, which the decode
           writes before it reads); its decode step captured once as a CUDA graph (all_reduce
           inside; capture_error_mode "thread_local" unless --capture-mode says otherwise), the
           graph's pool tagged "graph", not backed up.
  trainer  a data-parallel MLP (DDP over the same ranks, AdamW, tag "default") stepping while the
           engine sleeps.
  cycle    decode (graph replay) -> sleep(tags=(weights, kv_cache, graph), backup=(weights,)) ->
           trainer step -> empty_cache -> wake -> collectives -> free memory read.

Runs: native without sleeps (the reference), and per policy the c10 backend without sleeps and
with them; each with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK unset and =1 (--hook).
Checks per rank (each names the bug it would catch):
  outputs     every cycle's decode output, and one after the loop, bitwise equal to the run without
              sleeps and to native's (weights not restored, a graph pool remapped elsewhere, NCCL
              writing into memory that a wake replaced); equal across ranks within a run (an
              all_reduce that went wrong on one rank).
  trainer     the trainer's losses bitwise equal the run without sleeps (trainer memory touched by
              the engine's sleep or wake).
  collectives after each wake, an in-place all_reduce on a woken "weights" buffer equals its exact
              value (integers in fp32), and an all_gather of a fresh tensor too; both equal the run
              without sleeps (a stale NCCL registration of memory that was unmapped and mapped again).
  graph       captured once, replayed from that capture every cycle (an engine that had to recapture
              after a wake: a failed replay recaptures, counted).
  free        torch.cuda.mem_get_info()[0] after every cycle within 2 MiB of its value after the first,
              and memory_reserved() too (device memory leaked per cycle: a sleep that drops a segment
              without giving it back, a registration that keeps a handle alive).
  give back   each sleep returned > 0 bytes and the device free memory rose by >= 99% of them (a
              sleep that unmaps but whose physical memory something still holds, e.g. a handle
              retained for an NCCL registration).
  host        resident host memory after the last cycle within 32 MiB of after the first (a backup
              buffer pinned anew each cycle and never given back).

usage: test_rl_tp.py [--nproc N] [--cycles 20] [--policies pytorch,cachet] [--hook off,on]
                     [--graph on|off] [--capture-mode thread_local|global|relaxed] [--expandable off|on]
                     [--layers 2] [--hidden 4096] [--ffn 16384]
                     [--batch 8] [--kv-mib 1024] [--timeout SECONDS] [--json FILE] [--logs DIR]
Exit 0 ok, 1 a check failed, 77 skipped. World size 1 runs everything (its NCCL collectives are
single-rank: they prove the graph, sleep/wake and free-memory checks, not NCCL's cross-GPU paths).
"""
import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile

import dist_harness as H
import preamble

MiB = 1 << 20
TAGS = ("weights", "kv_cache", "graph")
check = preamble.Checks()
notes = []


def note(text):
    notes.append(text)
    print("note  " + text, flush=True)


rss_bytes = preamble.rss_bytes


# ------------------------------------------------------------------------------------- the rank

class Engine:
    def __init__(self, torch, dist, tag, cfg, rank, world):
        self.torch, self.dist, self.cfg = torch, dist, cfg
        hid, cols = cfg["hidden"], cfg["ffn"] // world
        self.w1, self.w2 = [], []
        with tag("weights"):
            for layer in range(cfg["layers"]):  # this rank's shards, seeded by (layer, rank)
                g = torch.Generator(device="cpu").manual_seed(1000 * layer + rank)
                self.w1.append((torch.randn(hid, cols, generator=g) / hid ** 0.5).cuda())
                self.w2.append((torch.randn(cols, hid, generator=g) / cfg["ffn"] ** 0.5).cuda())
            self.x = torch.zeros(cfg["batch"], hid, device="cuda")
            self.comm = torch.zeros(1 << 20, device="cuda")  # a woken buffer for the collective checks
        with tag("kv_cache"):
            self.kv = torch.empty(cfg["kv_mib"] * MiB // 4, device="cuda")
        self.captures, self.replay_errors, self.graph = 0, [], None
        if cfg["graph"] == "on":
            self.capture(tag)

    def step(self):
        F = self.torch.nn.functional
        h = self.x
        for w1, w2 in zip(self.w1, self.w2):
            b = F.gelu(h @ w1) @ w2
            self.dist.all_reduce(b)
            h = h + b
        n = h.numel()
        self.kv[:n].copy_(h.reshape(-1))
        return self.kv[:n].view_as(h) * 0.5

    def capture(self, tag):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):  # warm up on a side stream, as torch.cuda.graphs asks
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with tag("graph"), torch.cuda.graph(self.graph, capture_error_mode=self.cfg["capture_mode"]):
            self.out = self.step()
        self.captures += 1

    def decode(self, cycle, tag):
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(100 + cycle)  # the same input on every rank
        self.x.copy_(torch.randn(self.cfg["batch"], self.cfg["hidden"], generator=g))
        if self.graph is None:
            self.out = self.step()
        else:
            try:
                self.graph.replay()
            except Exception as e:  # noqa: BLE001: counted as a recapture, which fails the check
                self.replay_errors.append(f"cycle {cycle}: {e!r}"[:300])
                self.capture(tag)
                self.graph.replay()
        torch.cuda.synchronize()
        return hashlib.sha256(self.out.cpu().numpy().tobytes()).hexdigest()[:32]


def collectives(torch, dist, eng, cycle, rank, world):
    n = eng.comm.numel()
    base = (torch.arange(n, device="cuda") % 65536).float()  # sums exact in fp32 up to 256 ranks
    eng.comm.copy_(base * (rank + 1) + cycle)
    dist.all_reduce(eng.comm)  # exact: integers below 2**24
    exact_ar = torch.equal(eng.comm, base * (world * (world + 1) // 2) + cycle * world)
    mine = torch.full((4096,), float(rank * 1000 + cycle), device="cuda")
    gathered = torch.empty(4096 * world, device="cuda")
    dist.all_gather_into_tensor(gathered, mine)
    want = torch.cat([torch.full((4096,), float(r * 1000 + cycle), device="cuda") for r in range(world)])
    exact_ag = torch.equal(gathered, want)
    digest = hashlib.sha256(eng.comm.cpu().numpy().tobytes() + gathered.cpu().numpy().tobytes()).hexdigest()[:32]
    return {"all_reduce_exact": exact_ar, "all_gather_exact": exact_ag, "digest": digest}


def rank_main(cfg_path):
    H.require_multicast_off()
    with open(cfg_path) as f:
        cfg = json.load(f)
    ct = None
    if cfg["mode"] != "native":
        sys.path.insert(0, preamble.PYDIR)
        import cachet_torch as ct
        ct.install(backend="c10")
    import torch
    import torch.distributed as dist
    tag = ct.tag if ct is not None else (lambda name: contextlib.nullcontext())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    preamble.deterministic(torch)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=H.nccl_timeout())
    res = {"rank": rank, "world": world, "label": cfg["label"], "mode": cfg["mode"],
           "backend": ct.backend() if ct else None, "alloc_conf": os.environ.get("CACHET_ALLOC_CONF"),
           "hook": os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"),
           "nccl_graph_register": os.environ.get("NCCL_GRAPH_REGISTER"), "nccl": str(torch.cuda.nccl.version())}
    warm = torch.ones(1024, device="cuda")
    dist.all_reduce(warm)  # the communicator exists before the capture
    dist.all_gather_into_tensor(torch.empty(1024 * world, device="cuda"), warm)
    torch.cuda.synchronize()
    eng = Engine(torch, dist, tag, cfg, rank, world)
    torch.manual_seed(5)
    hid = 2048
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(hid, hid), torch.nn.GELU()]
    trainer = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers).cuda(), device_ids=[local])
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-3)
    outputs, losses, colls, free, reserved, rss, slept, rise = [], [], [], [], [], [], [], []
    for c in range(cfg["cycles"]):
        outputs.append(eng.decode(c, tag))
        if cfg["mode"] == "sleep":
            torch.cuda.synchronize()
            f0 = torch.cuda.mem_get_info()[0]
            slept.append(int(ct.sleep(tags=TAGS, backup=("weights",))))
            rise.append(torch.cuda.mem_get_info()[0] - f0)
        g = torch.Generator(device="cpu").manual_seed(2000 + c * world + rank)
        xb = torch.randn(64, hid, generator=g).cuda()
        loss = (trainer(xb) - xb).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float.hex(loss.item()))
        del xb, loss
        if cfg["mode"] == "sleep":
            torch.cuda.empty_cache()  # the trainer's cached activations go back before the wake
            ct.wake(tags=TAGS)
        colls.append(collectives(torch, dist, eng, c, rank, world))
        torch.cuda.synchronize()
        free.append(torch.cuda.mem_get_info()[0])
        reserved.append(torch.cuda.memory_reserved())
        rss.append(rss_bytes())
    res.update(outputs=outputs, final=eng.decode(cfg["cycles"], tag), losses=losses, collectives=colls,
               free=free, reserved=reserved, rss=rss, slept=slept, rise=rise, captures=eng.captures,
               replay_errors=eng.replay_errors, sleeping_at_end=ct.sleeping() if ct else None)
    H.write_rank(cfg["out"], cfg["label"], rank, res)
    eng.graph = None  # the graph (its captured NCCL kernels) goes before the communicator
    del eng, trainer, opt
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------- the driver

def run(args, label, mode, policy, hook, tmp):
    cfg = {"label": label, "mode": mode, "out": tmp, **{k: getattr(args, k) for k in (
        "cycles", "graph", "capture_mode", "layers", "hidden", "ffn", "batch", "kv_mib")}}
    cfg_path = os.path.join(tmp, f"{label}.cfg.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    extra = {"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1" if hook == "on" else None}
    if mode == "native":
        if args.expandable == "on":
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        extra["CACHET_ALLOC_CONF"] = ",".join([f"policy:{policy}", "cachet_sleep:True"] + (
            ["expandable_segments:True"] if args.expandable == "on" else []))
        if args.expandable == "on":  # what PyTorch itself reads (ProcessGroupNCCL turns the hook off)
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    log = os.path.join(args.logs, f"rltp-{label}.log")
    rc, secs = H.torchrun(os.path.abspath(__file__), args.nproc, ["--worker", cfg_path], H.child_env(extra),
                          args.timeout, log)
    ranks = H.read_ranks(tmp, label, args.nproc)
    print(f"run   {label}: torchrun rc {rc} ({secs:.0f} s), log {log}", flush=True)
    if any(r is None for r in ranks):
        check(False, f"{label}: torchrun exited {rc} and a rank wrote nothing\n{H.log_tail(log)}")
        return None
    # Every rank wrote its results: compared even so, a failing exit after that (a crash at
    # teardown, a hung destroy_process_group) fails on its own.
    check(rc == 0, f"{label}: torchrun exited {rc} after every rank wrote its results" + (
        "" if rc == 0 else f" (teardown)\n{H.log_tail(log, 15)}"))
    return ranks


def within(xs, tol):
    return max(abs(x - xs[0]) for x in xs) <= tol, max(abs(x - xs[0]) for x in xs)


def compare_run(label, got, ref_cachet, ref_native, sleeps):
    world = len(got)
    for r in range(world):
        x = got[r]
        if x["mode"] != "native":
            check(x["backend"] == "c10", f"{label} rank {r}: cachet_torch.backend() is 'c10' ({x['backend']!r})")
        check(x["outputs"] == got[0]["outputs"] and x["final"] == got[0]["final"],
              f"{label} rank {r}: decode outputs equal rank 0's (TP output replicated)")
        for name, ref in (("the run without sleeps", ref_cachet), ("native's", ref_native)):
            if ref is None or ref is got:
                continue
            diff = [i for i, (a, b) in enumerate(zip(x["outputs"], ref[r]["outputs"])) if a != b]
            check(not diff and len(x["outputs"]) == len(ref[r]["outputs"]) and x["final"] == ref[r]["final"],
                  f"{label} rank {r}: {len(x['outputs'])} decode outputs and the one after the loop bitwise equal "
                  f"{name} (cycles differing: {diff[:8]})")
            check(x["losses"] == ref[r]["losses"], f"{label} rank {r}: trainer losses bitwise equal {name}")
            check([c["digest"] for c in x["collectives"]] == [c["digest"] for c in ref[r]["collectives"]],
                  f"{label} rank {r}: collective results after every cycle equal {name}")
        bad = [i for i, c in enumerate(x["collectives"]) if not (c["all_reduce_exact"] and c["all_gather_exact"])]
        check(not bad, f"{label} rank {r}: all_reduce on the woken buffer and all_gather exact every cycle (bad: {bad[:8]})")
        if x["graph_on"]:
            check(x["captures"] == 1 and not x["replay_errors"],
                  f"{label} rank {r}: the decode graph captured once, replayed {len(x['outputs']) + 1} times "
                  f"({x['captures']} captures; {x['replay_errors'][:2]})")
        if x["mode"] == "native":
            continue
        ok, dev = within(x["free"], 2 * MiB)
        check(ok, f"{label} rank {r}: device free memory after each of {len(x['free'])} cycles within 2 MiB of "
              f"after the first (largest difference {dev / MiB:.2f} MiB)")
        ok, dev = within(x["reserved"], 2 * MiB)
        check(ok, f"{label} rank {r}: memory_reserved() after each cycle within 2 MiB of after the first "
              f"(largest difference {dev / MiB:.2f} MiB)")
        check(x["rss"][-1] - x["rss"][0] <= 32 * MiB, f"{label} rank {r}: host RSS grew "
              f"{(x['rss'][-1] - x['rss'][0]) / MiB:.1f} MiB from cycle 1 to the last (<= 32 MiB)")
        if sleeps:
            check(all(n > 0 for n in x["slept"]), f"{label} rank {r}: every sleep gave memory back "
                  f"(MiB: {sorted(set(round(n / MiB) for n in x['slept']))})")
            short = [i for i, (n, d) in enumerate(zip(x["slept"], x["rise"])) if d < 0.99 * n]
            check(not short, f"{label} rank {r}: device free memory rose by >= 99% of what each sleep reported "
                  f"(cycles short: {short[:8]})")
            check(x["sleeping_at_end"] == [], f"{label} rank {r}: nothing asleep at the end ({x['sleeping_at_end']})")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return rank_main(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=None, help="ranks (default: every CUDA device)")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--policies", default="pytorch,cachet")
    ap.add_argument("--hook", default="off,on", help="TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK: off, on or off,on")
    ap.add_argument("--graph", choices=("on", "off"), default="on")
    ap.add_argument("--capture-mode", dest="capture_mode", choices=("thread_local", "global", "relaxed"),
                    default="thread_local", help="torch.cuda.graph's capture_error_mode (default thread_local)")
    ap.add_argument("--expandable", choices=("off", "on"), default="off")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--kv-mib", dest="kv_mib", type=int, default=1024)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per torchrun (default 600)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None)
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    hooks = [h for h in args.hook.split(",") if h]
    if any(p not in ("pytorch", "cachet") for p in policies) or any(h not in ("off", "on") for h in hooks):
        ap.error("--policies takes pytorch,cachet and --hook off,on (or one of each)")
    try:
        import torch
        ndev = torch.cuda.device_count()
    except ImportError:
        ndev = 0
    if args.nproc is None:
        args.nproc = max(ndev, 1)
    why = H.skip_reason(args.nproc)
    if why:
        print(f"skipped: {why}")
        return H.SKIP
    if args.ffn % args.nproc:
        ap.error(f"--ffn {args.ffn} must divide by the {args.nproc} ranks")
    sys.path.insert(0, preamble.PYDIR)
    import cachet_torch
    if not all(hasattr(cachet_torch, f) for f in ("tag", "sleep", "wake", "sleeping")):
        print("FAIL  cachet_torch has no tag/sleep/wake/sleeping (docs/sleep-wake.md)")
        return 1
    tmp = tempfile.mkdtemp(prefix="cachet-rltp-")
    args.logs = args.logs or tmp
    os.makedirs(args.logs, exist_ok=True)
    shard = 2 * args.layers * args.hidden * (args.ffn // args.nproc) * 4
    print(f"rl_tp: {args.nproc} rank(s) of {ndev} GPU(s), {args.cycles} cycles; engine {args.layers} TP layers "
          f"{args.hidden}x{args.ffn} ({shard / MiB:.0f} MiB of weights per rank), KV {args.kv_mib} MiB per rank, "
          f"graph {args.graph} (capture mode {args.capture_mode}); trainer DDP MLP 4x2048; policies {policies}; register hook {hooks}; expandable "
          f"{args.expandable}; NCCL_GRAPH_REGISTER={os.environ.get('NCCL_GRAPH_REGISTER', '(NCCL default)')}; "
          f"multicast off: {H.MULTICAST_OFF}; assumed: matmuls and NCCL sums reproducible run to run for a "
          f"fixed world size (deterministic settings, no TF32)", flush=True)
    report = {"nproc": args.nproc, "devices": ndev, "args": vars(args), "runs": {}}
    try:
        for hook in hooks:
            loop(args, tmp, hook, policies, report["runs"])
    except SystemExit:  # SIGTERM (dist_harness): the table and JSON of what ran, then out
        check(False, "the driver was stopped (SIGTERM) before every run ended")
        raise
    finally:
        finish(args, report)
    return 1 if check.failures else 0


def loop(args, tmp, hook, policies, runs):
    """One register-hook setting: native without sleeps, then per policy the c10 backend without
    and with sleeps; each compared as it is there."""
    def go(label, mode, policy):
        runs[label] = run(args, label, mode, policy, hook, tmp)
        for x in runs[label] or []:
            x["graph_on"] = args.graph == "on"
        return runs[label]
    ref_native = go(f"hook-{hook}-native", "native", None)
    if ref_native is not None:
        compare_run(f"hook-{hook}-native", ref_native, None, ref_native, False)
    for policy in policies:
        nos = go(f"hook-{hook}-{policy}-nosleep", "nosleep", policy)
        if nos is not None:
            compare_run(f"hook-{hook}-{policy}-nosleep", nos, None, ref_native, False)
        slp = go(f"hook-{hook}-{policy}-sleep", "sleep", policy)
        if slp is not None:
            if nos is None:
                check(False, f"hook-{hook}-{policy}-sleep: no run without sleeps to compare the outputs with")
            compare_run(f"hook-{hook}-{policy}-sleep", slp, nos, ref_native, True)


def finish(args, report):
    rows = []
    for label, got in report["runs"].items():
        for r, x in enumerate(got or [None] * args.nproc):
            if x is None:
                rows.append([label, r, "failed"] + [""] * 7)
                continue
            dev = max(abs(f - x["free"][0]) for f in x["free"]) if x["free"] else 0
            rows.append([label, x["rank"], x["backend"] or "native", x["captures"],
                         H.mib(x["free"][0] if x["free"] else None), f"{dev / MiB:.2f}",
                         H.mib(x["reserved"][0] if x["reserved"] else None),
                         H.mib(min(x["slept"])) if x["slept"] else "-",
                         H.mib(min(x["rise"])) if x["rise"] else "-",
                         f"{(x['rss'][-1] - x['rss'][0]) / MiB:.1f}" if x["rss"] else "-"])
    print()
    print(H.table(rows, ["run", "rank", "backend", "captures", "free MiB (1st)", "free max dev MiB",
                         "reserved MiB", "min slept MiB", "min free rise MiB", "RSS growth MiB"]))
    report.update(failures=check.failures, notes=notes)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"rl_tp nproc {args.nproc}: {'FAIL' if check.failures else 'ok'} ({len(check.failures)} failures)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
