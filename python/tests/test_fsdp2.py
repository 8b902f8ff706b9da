#!/usr/bin/env python3
"""FSDP2 training on cachet (issue 38, Done-when 1): `torch.distributed.fsdp.fully_shard` per
transformer block and on the root of a transformers model built from a config (no downloads),
AdamW on fixed seeded data, bf16 MixedPrecisionPolicy (params bf16, reductions fp32), started by
`torchrun --nproc_per_node N`, run natively twice and under cachet's c10 backend with policy:pytorch
and policy:cachet. Every rank writes its losses, a checksum of its parameter shards after the last
step and torch.cuda.memory_stats()' peaks and counters as JSON; this driver compares them.

Checks (each names the bug it catches):
  losses      every rank's losses bitwise equal native's, both policies (a block handed out while
              FSDP2's all-gather or reduce-scatter stream still uses it: a use-after-free in the
              side-stream frees shows up as wrong numbers); if the two native runs differ with each
              other the check falls back to "within twice their spread" and says so.
  params      every rank's parameter shards after the last step bitwise equal native's (same bugs,
              in the optimizer step that no later loss shows).
  stats       policy:pytorch only: each rank's reserved_bytes.all.peak, num_alloc_retries and the
              other keys of STAT_KEYS, and the per-step peak reserved, equal native's wherever the
              two native runs agree with each other (a caching decision that differs from
              PyTorch's: a stream's free reused too early or too late, a block split or rounded
              differently); keys where native disagrees with itself are listed, not compared.
  backend     the cachet runs really ran on cachet (cachet_torch.backend() == "c10" on every rank).
  cap         (--cap on) under set_per_process_memory_fraction between native's peak allocated and
              peak reserved, where the allocator must free its cache and retry: native twice and
              policy:pytorch; the same checks, num_alloc_retries > 0 is the premise (said when not met).

usage: test_fsdp2.py [--nproc N] [--steps S] [--model gpt2|llama] [--layers L] [--embd E]
                     [--batch B] [--seq T] [--mp bf16|off] [--policies pytorch,cachet] [--cap on|off]
                     [--expandable off|on] [--install explicit|auto] [--hook off|on] [--timeout SECONDS]
                     [--json FILE] [--logs DIR]
  --hook on: every run (native's too) with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1
  (ProcessGroupNCCL registers the allocator's segments with NCCL through its trace tracker).
  --install explicit: each rank calls cachet_torch.install(backend="c10") before importing torch
  (test_ddp.py's way); auto: the ranks are unmodified and cachet comes in through
  CACHET_TORCH_AUTOINSTALL=1, CACHET_TORCH_AUTOINSTALL_BACKEND=c10 and python/cachet_torch/_startup
  first on PYTHONPATH (configure_subprocess()'s start hook; the torchrun launcher installs it too,
  harmlessly: it never touches CUDA).
Exit 0 ok, 1 a check failed, 77 skipped (no torch/CUDA/transformers/libcachet_c10.so, fewer GPUs
than --nproc). Environment: as test_ddp.py (CACHET_C10_LIB or CACHET_TORCH_LIB);
CACHET_DIST_NCCL_TIMEOUT (seconds, the ranks' NCCL timeout, default 180).
"""
import argparse
import json
import os
import sys
import tempfile

import dist_harness as H
import preamble

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
STAT_KEYS = ("reserved_bytes.all.peak", "num_alloc_retries", "allocated_bytes.all.peak",
             "active_bytes.all.peak", "requested_bytes.all.peak", "segment.all.peak",
             "num_device_alloc", "num_device_free", "num_ooms", "num_sync_all_streams")
check = preamble.Checks()
notes = []


def note(text):
    notes.append(text)
    print("note  " + text, flush=True)


# ------------------------------------------------------------------------------------- the rank

def build_model(torch, cfg):
    torch.manual_seed(0)
    if cfg["model"] == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        conf = GPT2Config(n_layer=cfg["layers"], n_embd=cfg["embd"], n_head=max(1, cfg["embd"] // 64),
                          n_positions=cfg["seq"], vocab_size=cfg["vocab"], resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, attn_implementation="eager")
        model = GPT2LMHeadModel(conf)
        blocks = list(model.transformer.h)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        conf = LlamaConfig(hidden_size=cfg["embd"], intermediate_size=cfg["embd"] * 8 // 3 // 64 * 64,
                           num_hidden_layers=cfg["layers"], num_attention_heads=max(1, cfg["embd"] // 64),
                           num_key_value_heads=max(1, cfg["embd"] // 128), vocab_size=cfg["vocab"],
                           max_position_embeddings=cfg["seq"], attn_implementation="eager")
        model = LlamaForCausalLM(conf)
        blocks = list(model.model.layers)
    return model.cuda(), blocks


def rank_main(cfg_path):
    H.require_multicast_off()
    with open(cfg_path) as f:
        cfg = json.load(f)
    backend = None
    if cfg["mode"] == "cachet" and cfg["install"] == "explicit":
        sys.path.insert(0, preamble.PYDIR)
        import cachet_torch
        cachet_torch.install(backend="c10")
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    if cfg["mode"] == "cachet":
        import cachet_torch  # the module the start hook or the call above installed
        backend = cachet_torch.backend()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    preamble.deterministic(torch)
    res = {"rank": rank, "world": world, "label": cfg["label"], "mode": cfg["mode"], "backend": backend,
           "alloc_conf": os.environ.get("CACHET_ALLOC_CONF"), "torch": torch.__version__,
           "nccl": str(torch.cuda.nccl.version()),
           "hook": os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK")}
    cap = (cfg.get("caps") or {}).get(str(rank))
    if cap:
        total = torch.cuda.get_device_properties(local).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total, local)
        res["cap"] = cap
    dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=H.nccl_timeout())
    model, blocks = build_model(torch, cfg)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg["mp"] == "bf16" \
        else MixedPrecisionPolicy()
    for b in blocks:
        fully_shard(b, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    losses, step_peaks = [], []
    try:
        for _ in range(cfg["steps"]):
            ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g).cuda()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step_peaks.append(torch.cuda.memory_stats()["reserved_bytes.all.peak"])
    except torch.OutOfMemoryError as e:
        res["oom"] = str(e)[:600]
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    res.update(losses=[float.hex(x) for x in losses], loss_values=losses, step_peaks=step_peaks,
               stats={k: st.get(k) for k in STAT_KEYS}, allocator=torch.cuda.memory.get_allocator_backend())
    if "oom" not in res:
        with torch.no_grad():  # the local shards, in a fixed order, as float64 bits
            sums = [p.to_local().double().sum().item() if hasattr(p, "to_local") else p.double().sum().item()
                    for _, p in sorted(model.named_parameters())]
        res["params"] = [float.hex(x) for x in sums]
    H.write_rank(cfg["out"], cfg["label"], rank, res)
    if "oom" in res:
        print(f"rank {rank}: out of memory: {res['oom'][:200]}", flush=True)
        os._exit(5)  # torchrun then stops the other ranks (they would wait in a collective)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------- the driver

def run(args, label, mode, policy, tmp, caps=None):
    cfg = {"label": label, "mode": mode, "out": tmp, "install": args.install, "caps": caps, **{
        k: getattr(args, k) for k in ("model", "layers", "embd", "batch", "seq", "vocab", "steps", "mp")}}
    cfg_path = os.path.join(tmp, f"{label}.cfg.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    extra = {"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1" if args.hook == "on" else None}
    if mode == "native":
        if args.expandable == "on":
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        conf = [f"policy:{policy}"] + (["expandable_segments:True"] if args.expandable == "on" else [])
        extra["CACHET_ALLOC_CONF"] = ",".join(conf)
        if args.expandable == "on":  # what PyTorch itself reads (ProcessGroupNCCL turns the hook off)
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        if args.install == "auto":
            startup = os.path.join(preamble.PYDIR, "cachet_torch", "_startup")
            extra.update(CACHET_TORCH_AUTOINSTALL="1", CACHET_TORCH_AUTOINSTALL_BACKEND="c10",
                         PYTHONPATH=os.pathsep.join([startup, preamble.PYDIR, os.environ.get("PYTHONPATH", "")]))
    log = os.path.join(args.logs, f"fsdp2-{label}.log")
    rc, secs = H.torchrun(os.path.abspath(__file__), args.nproc, ["--worker", cfg_path], H.child_env(extra),
                          args.timeout, log)
    ranks = H.read_ranks(tmp, label, args.nproc)
    print(f"run   {label}: torchrun rc {rc} ({secs:.0f} s), log {log}", flush=True)
    if any(r is None or "oom" in r for r in ranks):
        return None, rc, ranks
    # Every rank wrote its results: compared even so, a failing exit after that (a crash at
    # teardown, a hung destroy_process_group) fails on its own.
    check(rc == 0, f"{label}: torchrun exited {rc} after every rank wrote its results" + (
        "" if rc == 0 else f" (teardown)\n{H.log_tail(log, 15)}"))
    return ranks, rc, ranks


def bitwise_or_spread(what, rank, n1, n2, got):
    """n1, n2: the natives' lists of float.hex; got: cachet's."""
    if got is None or n1 is None:
        return check(False, f"{what} rank {rank}: missing")
    if n1 == n2:
        return check(got == n1, f"{what} rank {rank}: {len(got)} values bitwise equal native's "
                     f"(first difference at {next((i for i, (a, b) in enumerate(zip(got, n1)) if a != b), '-')})")
    f = lambda xs: [float.fromhex(x) for x in xs]  # noqa: E731
    spread = max(abs(a - b) for a, b in zip(f(n1), f(n2)))
    dev = max(abs(a - b) for a, b in zip(f(got), f(n1)))
    note(f"{what} rank {rank}: the two native runs differ with each other (largest difference {spread:.3g}): "
         f"compared within twice that instead of bitwise")
    return check(len(got) == len(n1) and dev <= 2 * spread,
                 f"{what} rank {rank}: within 2x native's own spread ({dev:.3g} <= {2 * spread:.3g})")


def compare(label, natives, got, stats_too):
    n1, n2 = natives
    for r in range(len(got)):
        check(got[r].get("backend") == "c10", f"{label} rank {r}: cachet_torch.backend() is 'c10' "
              f"({got[r].get('backend')!r}, allocator {got[r].get('allocator')!r}, conf {got[r].get('alloc_conf')!r})")
        bitwise_or_spread(f"{label} losses", r, n1[r]["losses"], n2[r]["losses"], got[r]["losses"])
        bitwise_or_spread(f"{label} params", r, n1[r].get("params"), n2[r].get("params"), got[r].get("params"))
        if not stats_too:
            continue
        agree = [k for k in STAT_KEYS if n1[r]["stats"][k] == n2[r]["stats"][k]]
        differ = [k for k in STAT_KEYS if k not in agree]
        for k in agree:
            check(got[r]["stats"][k] == n1[r]["stats"][k],
                  f"{label} rank {r}: {k} {got[r]['stats'][k]} equals native's {n1[r]['stats'][k]}")
        if differ:
            note(f"{label} rank {r}: native disagrees with itself on " + ", ".join(
                f"{k} ({n1[r]['stats'][k]} vs {n2[r]['stats'][k]})" for k in differ) + ": not compared")
        if n1[r]["step_peaks"] == n2[r]["step_peaks"]:
            check(got[r]["step_peaks"] == n1[r]["step_peaks"], f"{label} rank {r}: the peak reserved after each "
                  f"of {len(n1[r]['step_peaks'])} steps equals native's")
        else:
            note(f"{label} rank {r}: native's per-step peaks differ with each other: not compared")


def rows_of(label, ranks):
    rows = []
    for r, x in enumerate(ranks):
        if x is None:
            rows.append([label, r, "missing"] + [""] * 6)
            continue
        s = x["stats"]
        rows.append([label, r, x.get("backend") or "native", f"{x['loss_values'][-1]:.6f}" if x["loss_values"] else "-",
                     H.mib(s["reserved_bytes.all.peak"]), H.mib(s["allocated_bytes.all.peak"]),
                     s["num_alloc_retries"], s["num_device_alloc"], "OOM" if x.get("oom") else ""])
    return rows


def phase(args, tmp, suffix, policies, got, caps=None):
    """Runs native twice and cachet under each policy, each run's ranks put in `got` (by label) as
    it ends; compares; returns whether the natives ran. Under a cap (caps given) a native run that
    fails ends the phase: the cap was too tight."""
    natives = []
    for i in (1, 2):
        label = f"native{suffix}-{i}"
        ranks, rc, raw = run(args, label, "native", None, tmp, caps)
        got[label] = raw
        natives.append(ranks)
        if ranks is None:
            print(f"{'note ' if caps else 'FAIL '} {label}: torchrun exited {rc}\n"
                  f"{H.log_tail(os.path.join(args.logs, f'fsdp2-{label}.log'))}", flush=True)
            if caps:
                return False
    natives_ok = all(x is not None for x in natives)
    for policy in policies:
        label = f"{policy}{suffix}"
        ranks, rc, raw = run(args, label, "cachet", policy, tmp, caps)
        got[label] = raw
        if ranks is None:
            check(False, f"{label}: torchrun exited {rc} or a rank wrote nothing\n"
                  f"{H.log_tail(os.path.join(args.logs, f'fsdp2-{label}.log'))}")
            continue
        if natives_ok:
            compare(label, natives, ranks, stats_too=(policy == "pytorch"))
    return natives_ok


def cap_phase(args, tmp, n1, report):
    """Caps between native's peak allocated and peak reserved (halfway, then 3/4, then 9/10 of the
    way where native ran out of memory under the tighter one), native twice and policy:pytorch."""
    slack = [(x["stats"]["allocated_bytes.all.peak"], x["stats"]["reserved_bytes.all.peak"]) for x in n1]
    if any(res - a < 4 * MiB for a, res in slack):
        note(f"cap: native keeps less than 4 MiB cached at its peak on some rank ((allocated, reserved) {slack}): "
             f"no cap between them, cap phase not run")
        return
    for frac in (0.5, 0.75, 0.9):
        caps = {str(r): a + int((res - a) * frac) for r, (a, res) in enumerate(slack)}
        suffix = f"-cap{int(frac * 100)}"
        note(f"cap{suffix}: per-rank caps (MiB) {[H.mib(caps[str(r)]) for r in range(len(slack))]}: {frac} of the "
             f"way from native's peak allocated to its peak reserved")
        report.setdefault("caps", {})[suffix] = caps
        cgot = report.setdefault("cap_runs", {})
        if phase(args, tmp, suffix, ["pytorch"], cgot, caps):
            retries = [x["stats"]["num_alloc_retries"] for x in cgot[f"native{suffix}-1"]]
            if not all(retries):
                note(f"cap{suffix}: premise not met, native's num_alloc_retries per rank {retries}: compared "
                     f"without retries on some rank")
            return
        note(f"cap{suffix}: native ran out of memory (or failed) under this cap: trying a looser one")
    note("cap: native failed under every cap tried: the cap comparison was not made (see the logs)")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return rank_main(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=None, help="ranks (default: every CUDA device)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--mp", choices=("bf16", "off"), default="bf16")
    ap.add_argument("--policies", default="pytorch,cachet")
    ap.add_argument("--cap", choices=("on", "off"), default="on")
    ap.add_argument("--expandable", choices=("off", "on"), default="off")
    ap.add_argument("--install", choices=("explicit", "auto"), default="explicit")
    ap.add_argument("--hook", choices=("off", "on"), default="off")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per torchrun (default 600)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None)
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if any(p not in ("pytorch", "cachet") for p in policies):
        ap.error(f"--policies: pytorch and/or cachet, got {args.policies!r}")
    try:
        import torch
        ndev = torch.cuda.device_count()
    except ImportError:
        ndev = 0
    if args.nproc is None:
        args.nproc = max(ndev, 1)
    why = H.skip_reason(args.nproc, need_transformers=True)
    if why:
        print(f"skipped: {why}")
        return H.SKIP
    tmp = tempfile.mkdtemp(prefix="cachet-fsdp2-")
    args.logs = args.logs or tmp
    os.makedirs(args.logs, exist_ok=True)
    print(f"fsdp2: {args.nproc} rank(s) of {ndev} GPU(s); {args.model} {args.layers} layers x {args.embd}, vocab "
          f"{args.vocab}, batch {args.batch}x{args.seq}, {args.steps} AdamW steps, mixed precision {args.mp}, "
          f"expandable segments {args.expandable}, cachet put in each rank by {'install()' if args.install == 'explicit' else 'the start hook'}, NCCL register hook {args.hook}; assumed: every rank "
          f"deterministic (deterministic algorithms, no TF32, eager attention, no dropout), NCCL "
          f"reductions reproducible run to run for a fixed world size; multicast off: {H.MULTICAST_OFF}", flush=True)
    report = {"nproc": args.nproc, "devices": ndev, "args": vars(args), "runs": {}}
    try:
        natives_ok = phase(args, tmp, "", policies, report["runs"])
        if not natives_ok:
            check(False, "the native runs failed: nothing to compare against")
        elif args.cap == "on" and "pytorch" in policies:
            cap_phase(args, tmp, report["runs"]["native-1"], report)
    except SystemExit:  # SIGTERM (dist_harness): the table and JSON of what ran, then out
        check(False, "the driver was stopped (SIGTERM) before every run ended")
        raise
    finally:
        finish(args, report)
    return 1 if check.failures else 0


def finish(args, report):
    rows = [row for key in ("runs", "cap_runs") for label, ranks in report.get(key, {}).items()
            for row in rows_of(label, ranks)]
    print()
    print(H.table(rows, ["run", "rank", "backend", "last loss", "peak res MiB", "peak alloc MiB", "retries",
                         "device allocs", ""]))
    report.update(failures=check.failures, notes=notes)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"fsdp2 nproc {args.nproc}: {'FAIL' if check.failures else 'ok'} ({len(check.failures)} failures, "
          f"{len(notes)} notes)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
