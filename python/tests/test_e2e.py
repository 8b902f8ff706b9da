#!/usr/bin/env python3
"""End to end: PyTorch trains with its native allocator and with cachet (ctest cachet_torch_e2e,
labels gpu and torch; exit 77 = skipped: no PyTorch, no CUDA device, or neither transformers nor
torchvision).

GPT-2 small (transformers, random initialisation, eager attention, batch 8 x 512) and ResNet-50
(torchvision, random initialisation, batch 32 x 3 x 224 x 224) train 20 steps each, once with the
native allocator and once with cachet, each run in its own process (the allocator must be chosen
before the first CUDA allocation). Deterministic settings: torch.use_deterministic_algorithms
(warn_only, warnings reported), cuDNN deterministic, no benchmark, no TF32,
CUBLAS_WORKSPACE_CONFIG=:4096:8, fixed seeds, the same data. Both runs get the same
configuration string in PYTORCH_CUDA_ALLOC_CONF ($CACHET_E2E_CONF, default: none).

A third run, for GPT-2 (CACHET_E2E_POLICY_MODELS, default gpt2), uses the plug-in with
CACHET_ALLOC_CONF=policy:cachet (cachet's low-waste policy on the CUDA VMM backend; the
variable wins over PYTORCH_CUDA_ALLOC_CONF, so $CACHET_E2E_CONF does not apply to it), again in
its own process. It must report the policy in the plug-in's settings ("canonical" contains
policy:cachet), give the native run's losses bit for bit, and waste = peak reserved / peak
requested (the plug-in's reserved_bytes.all.peak / requested_bytes.all.peak) <= 1.05.

Checks, per model:
  losses     identical step by step (bit for bit)
  peak       cachet's reserved_bytes.all.peak <= native max_memory_reserved()
  time       |median(cachet) - median(native)| of steps 5..20 <= the larger of the two runs'
             spreads (spread = max - min of steps 5..20)
  viz        python -m torch.cuda._memory_viz stats|trace reads cachet's dumped snapshot
  replay     `cachet replay SNAPSHOT --json` reaches the reserved peak cachet reported
  policy     (third run) losses identical to native, waste <= 1.05, the policy really selected

Environment: CACHET_TORCH_LIB (the plug-in), CACHET_BIN (the cachet command), CACHET_E2E_CONF,
CACHET_E2E_MODELS (comma list, default gpt2,resnet50), CACHET_E2E_POLICY_MODELS (the models
that also get the policy:cachet run, default gpt2; "" = none), CACHET_E2E_OUT (write the results
as JSON there: per model, and "cachet_policy": {"model", "peak_reserved", "peak_requested",
"waste", "losses_identical", ...} for the first model with the policy:cachet run),
CACHET_E2E_KEEP (a folder to keep the snapshots in).
"""
import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import preamble
from preamble import PYDIR

STEPS = 20
TIMED = slice(4, 20)  # steps 5..20
POLICY_CONF = "policy:cachet"  # CACHET_ALLOC_CONF of the third run
MAX_POLICY_WASTE = 1.05        # peak reserved / peak requested, policy:cachet run


# ---------------------------------------------------------------- worker (one training run)

def build(model_name, torch, dev):
    g = torch.Generator().manual_seed(1234)
    info = {}
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        try:
            cfg = GPT2Config(attn_implementation="eager")
        except TypeError:
            cfg = GPT2Config()
        model = GPT2LMHeadModel(cfg)
        info["attn_implementation"] = str(getattr(model.config, "_attn_implementation", "?"))
        ids = torch.randint(0, cfg.vocab_size, (STEPS, 8, 512), generator=g)

        def step_loss(i):
            x = ids[i].to(dev)
            return lambda: model(input_ids=x, labels=x).loss
    elif model_name == "resnet50":
        import torchvision
        try:
            model = torchvision.models.resnet50(weights=None)
        except TypeError:
            model = torchvision.models.resnet50(pretrained=False)
        images = torch.randn(STEPS, 32, 3, 224, 224, generator=g)
        labels = torch.randint(0, 1000, (STEPS, 32), generator=g)

        def step_loss(i):
            x, y = images[i].to(dev), labels[i].to(dev)
            return lambda: torch.nn.functional.cross_entropy(model(x), y)
    else:
        raise SystemExit(f"unknown model {model_name}")
    model = model.to(dev)
    model.train()
    return model, step_loss, info


def worker(a):
    import warnings
    if a.allocator == "cachet":
        sys.path.insert(0, PYDIR)
        import cachet_torch
        cachet_torch.install(a.lib, record_history=bool(a.snapshot))
    import torch
    preamble.deterministic(torch)
    dev = torch.device("cuda", 0)
    result = {"model": a.model, "allocator": a.allocator, "torch": torch.__version__}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, step_loss, info = build(a.model, torch, dev)
        result.update(info)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        losses, times = [], []
        for i in range(STEPS):
            compute = step_loss(i)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = compute()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    result["determinism_warnings"] = sorted({str(w.message)[:200] for w in caught
                                             if "determinis" in str(w.message)})
    result["losses"] = [float.hex(x) for x in losses]
    result["loss_values"] = losses
    result["step_seconds"] = times
    if a.allocator == "cachet":
        import cachet_torch
        st = cachet_torch.memory_stats(0)
        result["peak_reserved"] = st["reserved_bytes.all.peak"]
        result["peak_allocated"] = st["allocated_bytes.all.peak"]
        result["peak_requested"] = st["requested_bytes.all.peak"]
        result["num_alloc_retries"] = st["num_alloc_retries"]
        result["num_device_alloc"] = st["num_device_alloc"]
        result["num_device_free"] = st["num_device_free"]
        result["wired_callbacks"] = cachet_torch.wired_callbacks()
        result["settings"] = cachet_torch.settings()["canonical"]
        result["settings_variable"] = cachet_torch.settings()["variable"]
        if a.snapshot:
            cachet_torch.dump_snapshot(a.snapshot)
        try:
            torch.cuda.memory_stats()
            result["torch_memory_stats"] = "works"
        except Exception as e:  # noqa: BLE001
            result["torch_memory_stats"] = "raises: " + str(e).splitlines()[0][:120]
    else:
        result["peak_reserved"] = torch.cuda.max_memory_reserved(dev)
        result["peak_allocated"] = torch.cuda.max_memory_allocated(dev)
        native_stats = torch.cuda.memory_stats(dev)
        result["peak_requested"] = native_stats.get("requested_bytes.all.peak", 0)
        result["num_alloc_retries"] = native_stats["num_alloc_retries"]
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


# ---------------------------------------------------------------- orchestrator

def find_peaks(obj, path=""):
    """(path, value) of every numeric field whose path mentions a peak."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += find_peaks(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += find_peaks(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and "peak" in path.lower():
        out.append((path, obj))
    return out


def replay_check(cachet_bin, snap, want_peak):
    """(status, detail): status is "ok", "FAIL" or "MISSING"."""
    if not cachet_bin or not os.path.exists(cachet_bin):
        return "MISSING", f"the cachet command was not found (CACHET_BIN={cachet_bin!r})"
    h = subprocess.run([cachet_bin, "--help"], capture_output=True, text=True, timeout=60)
    if "replay" not in (h.stdout + h.stderr):
        return "MISSING", "this cachet command has no `replay` subcommand (tools/commands/cmd_replay.cpp not built yet)"
    r = subprocess.run([cachet_bin, "replay", snap, "--json"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return "FAIL", f"cachet replay exited {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}"
    try:
        data = json.loads(r.stdout)
    except ValueError as e:
        return "FAIL", f"cachet replay --json printed no JSON ({e}): {r.stdout[:300]}"
    peaks = find_peaks(data)
    reserved = [(p, v) for p, v in peaks if "reserved" in p.lower()]
    exact = [(p, v) for p, v in reserved if p.endswith("reserved_bytes.all.peak")]
    pick = exact or reserved
    if not pick:
        return "FAIL", f"no reserved peak in the replay's JSON; peak fields: {peaks[:10]}"
    path, value = pick[0]
    if value == want_peak:
        return "ok", f"{path} = {value} = cachet's reserved peak"
    return "FAIL", f"{path} = {value}, cachet reported {want_peak}"


def viz_check(snap):
    for cmd in ("stats", "trace"):
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, snap],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return "FAIL", f"_memory_viz {cmd}: rc {r.returncode}: {r.stderr.strip()[-400:]}"
    return "ok", "_memory_viz stats and trace read it"


def spread(xs):
    return max(xs) - min(xs)


def waste(run):
    """peak reserved / peak requested of a run (None when nothing was requested)."""
    req = run.get("peak_requested") or 0
    return run["peak_reserved"] / req if req > 0 else None


def policy_check(m, n, p):
    """The policy:cachet run `p` of model `m` against the native run `n`: (result dict, failures)."""
    fails = []
    same = n["losses"] == p["losses"]
    first_diff = next((i + 1 for i, (x, y) in enumerate(zip(n["losses"], p["losses"])) if x != y), None)
    w = waste(p)
    tp = p["step_seconds"][TIMED]
    res = {
        "model": m,
        "conf": POLICY_CONF,
        "settings": p.get("settings"),
        "settings_variable": p.get("settings_variable"),
        "peak_reserved": p["peak_reserved"],
        "peak_requested": p["peak_requested"],
        "peak_allocated": p["peak_allocated"],
        "waste": w,
        "max_waste": MAX_POLICY_WASTE,
        "losses_identical": same,
        "first_differing_step": first_diff,
        "final_loss": p["loss_values"][-1],
        "num_alloc_retries": p["num_alloc_retries"],
        "num_device_alloc": p.get("num_device_alloc"),
        "num_device_free": p.get("num_device_free"),
        "median_step_s": statistics.median(tp),
        "spread_step_s": spread(tp),
        "native": {"peak_reserved": n["peak_reserved"], "peak_requested": n["peak_requested"], "waste": waste(n)},
    }
    if "policy:cachet" not in (p.get("settings") or ""):
        fails.append(f"{m}/cachet_policy: the plug-in's configuration is {p.get('settings')!r} "
                     f"(from {p.get('settings_variable')!r}), not policy:cachet")
    if not same:
        fails.append(f"{m}/cachet_policy: losses differ from step {first_diff} "
                     f"(native {n['loss_values'][first_diff - 1]!r}, "
                     f"policy:cachet {p['loss_values'][first_diff - 1]!r})")
    if w is None or w > MAX_POLICY_WASTE:
        fails.append(f"{m}/cachet_policy: waste {w} (peak reserved {p['peak_reserved']} / peak requested "
                     f"{p['peak_requested']}) > {MAX_POLICY_WASTE}")
    return res, fails


def main():
    torch, lib, stop = preamble.start()
    if stop is not None:
        return stop
    wanted = [m for m in os.environ.get("CACHET_E2E_MODELS", "gpt2,resnet50").split(",") if m]
    need = {"gpt2": "transformers", "resnet50": "torchvision"}
    models, skipped = [], []
    for m in wanted:
        if importlib.util.find_spec(need.get(m, m)) is None:
            skipped.append(f"{m} ({need.get(m, m)} missing)")
        else:
            models.append(m)
    if not models:
        print("SKIP: " + ", ".join(skipped))
        return 77
    conf = os.environ.get("CACHET_E2E_CONF", "")
    env = preamble.child_env()
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    # The third run: the plug-in with cachet's policy (CACHET_ALLOC_CONF wins over the others).
    policy_env = dict(env)
    policy_env["CACHET_ALLOC_CONF"] = POLICY_CONF
    policy_models = [m for m in os.environ.get("CACHET_E2E_POLICY_MODELS", "gpt2").split(",")
                     if m and m in models]
    cachet_bin = os.environ.get("CACHET_BIN", "")
    tmp = tempfile.mkdtemp(prefix="cachet-e2e-")
    keep = os.environ.get("CACHET_E2E_KEEP")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"PYTORCH_CUDA_ALLOC_CONF={conf!r}, models {models}" +
          (f", skipped {skipped}" if skipped else ""), flush=True)

    runs = {}
    failures = []
    for m in models:
        kinds = ["native", "cachet"] + (["cachet_policy"] if m in policy_models else [])
        for alloc in kinds:
            out = os.path.join(tmp, f"{m}-{alloc}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", m,
                   "--allocator", "cachet" if alloc == "cachet_policy" else alloc, "--out", out, "--lib", lib]
            if alloc == "cachet":
                cmd += ["--snapshot", os.path.join(tmp, f"{m}-cachet.pickle")]
            t0 = time.time()
            r = subprocess.run(cmd, env=policy_env if alloc == "cachet_policy" else env,
                               capture_output=True, text=True, timeout=600)
            wall = time.time() - t0
            if r.returncode != 0 or not os.path.exists(out):
                failures.append(f"{m}/{alloc}: the run failed (rc {r.returncode})")
                print(f"--- {m}/{alloc} failed (rc {r.returncode}, {wall:.0f} s):\n"
                      f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}", flush=True)
                continue
            with open(out) as f:
                runs[(m, alloc)] = json.load(f)
            print(f"    {m}/{alloc}: {wall:.0f} s", flush=True)

    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "conf": conf,
               "skipped": skipped, "models": {}}
    rows = []
    for m in models:
        n, c = runs.get((m, "native")), runs.get((m, "cachet"))
        p = runs.get((m, "cachet_policy"))
        if n and p:  # the policy:cachet run needs only the native one (a failed run is already a failure)
            pres, fails = policy_check(m, n, p)
            failures += fails
            results.setdefault("cachet_policy", pres)
            results["models"].setdefault(m, {})["cachet_policy"] = pres
        if not n or not c:
            continue
        res = results["models"].get(m, {})
        same = n["losses"] == c["losses"]
        first_diff = next((i + 1 for i, (x, y) in enumerate(zip(n["losses"], c["losses"])) if x != y), None)
        res["losses_identical"] = same
        res["first_differing_step"] = first_diff
        res["final_loss"] = {"native": n["loss_values"][-1], "cachet": c["loss_values"][-1]}
        res["peak_reserved"] = {"native": n["peak_reserved"], "cachet": c["peak_reserved"]}
        res["peak_allocated"] = {"native": n["peak_allocated"], "cachet": c["peak_allocated"]}
        res["peak_requested"] = {"native": n["peak_requested"], "cachet": c["peak_requested"]}
        res["num_alloc_retries"] = {"native": n["num_alloc_retries"], "cachet": c["num_alloc_retries"]}
        tn, tc = n["step_seconds"][TIMED], c["step_seconds"][TIMED]
        med_n, med_c = statistics.median(tn), statistics.median(tc)
        sp_n, sp_c = spread(tn), spread(tc)
        res["median_step_s"] = {"native": med_n, "cachet": med_c}
        res["spread_step_s"] = {"native": sp_n, "cachet": sp_c}
        res["time_within_spread"] = abs(med_c - med_n) <= max(sp_n, sp_c)
        res["determinism_warnings"] = sorted(set(n["determinism_warnings"]) | set(c["determinism_warnings"]))
        res["wired_callbacks"] = c.get("wired_callbacks")
        res["torch_memory_stats_with_plugin"] = c.get("torch_memory_stats")
        res["attn_implementation"] = n.get("attn_implementation")
        snap = os.path.join(tmp, f"{m}-cachet.pickle")
        res["viz"], res["viz_detail"] = viz_check(snap) if os.path.exists(snap) else ("FAIL", "no snapshot")
        res["replay"], res["replay_detail"] = (replay_check(cachet_bin, snap, c["peak_reserved"])
                                               if os.path.exists(snap) else ("FAIL", "no snapshot"))
        res["snapshot_bytes"] = os.path.getsize(snap) if os.path.exists(snap) else 0
        if keep and os.path.exists(snap):
            os.makedirs(keep, exist_ok=True)
            shutil.copy(snap, keep)
        results["models"][m] = res
        if not same:
            failures.append(f"{m}: losses differ from step {first_diff} "
                            f"(native {n['loss_values'][first_diff - 1]!r}, cachet {c['loss_values'][first_diff - 1]!r})")
        if c["peak_reserved"] > n["peak_reserved"]:
            failures.append(f"{m}: cachet's peak reserved {c['peak_reserved']} > native {n['peak_reserved']}")
        if not res["time_within_spread"]:
            failures.append(f"{m}: median step {med_c * 1e3:.2f} ms (cachet) vs {med_n * 1e3:.2f} ms (native), "
                            f"outside the larger spread {max(sp_n, sp_c) * 1e3:.2f} ms")
        if res["viz"] != "ok":
            failures.append(f"{m}: {res['viz_detail']}")
        if res["replay"] != "ok":
            failures.append(f"{m}: replay {res['replay']}: {res['replay_detail']}")
        mib = 1 << 20
        rows.append(f"{m:9} {'yes' if same else 'NO@' + str(first_diff):>7} "
                    f"{n['peak_reserved'] / mib:10.1f} {c['peak_reserved'] / mib:10.1f} "
                    f"{med_n * 1e3:8.2f} {sp_n * 1e3:7.2f} {med_c * 1e3:8.2f} {sp_c * 1e3:7.2f} "
                    f"{res['viz']:>4} {res['replay']:>7}")

    print("\nmodel      losses  peak MiB   peak MiB   median ms  spread  median ms  spread   viz  replay")
    print("           equal   native     cachet     native     native  cachet     cachet")
    for row in rows:
        print(row)
    for m, res in results["models"].items():
        pc = res.get("cachet_policy")
        if pc:
            print(f"  {m}: {POLICY_CONF}: losses {'identical' if pc['losses_identical'] else 'DIFFER'}, "
                  f"peak reserved {pc['peak_reserved']}, peak requested {pc['peak_requested']}, "
                  f"waste {pc['waste'] if pc['waste'] is None else round(pc['waste'], 4)} (<= {MAX_POLICY_WASTE}; "
                  f"native {pc['native']['waste'] if pc['native']['waste'] is None else round(pc['native']['waste'], 4)}), "
                  f"median step {pc['median_step_s'] * 1e3:.2f} ms, settings {pc['settings']!r}")
    for m, res in results["models"].items():
        if "replay_detail" not in res:  # the plug-in's pytorch-policy run failed
            continue
        print(f"  {m}: replay: {res['replay_detail']}")
        print(f"  {m}: peak allocated native {res['peak_allocated']['native']} cachet "
              f"{res['peak_allocated']['cachet']}; callbacks wired: {res['wired_callbacks']}; "
              f"torch.cuda.memory_stats() with the plug-in: {res['torch_memory_stats_with_plugin']}")
        if res["determinism_warnings"]:
            print(f"  {m}: determinism warnings: {res['determinism_warnings']}")
    if "cachet_policy" not in results:
        wanted_policy = [m for m in os.environ.get("CACHET_E2E_POLICY_MODELS", "gpt2").split(",") if m]
        results["cachet_policy"] = {"skipped": (f"no {POLICY_CONF} run completed (models asked: {wanted_policy}, "
                                                f"run: {policy_models})")}
    results["failures"] = failures
    results["passed"] = not failures
    out_path = os.environ.get("CACHET_E2E_OUT")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    print("\n" + ("PASS" if not failures else "FAIL:\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--allocator", choices=["native", "cachet"])
    ap.add_argument("--out")
    ap.add_argument("--lib")
    ap.add_argument("--snapshot")
    args = ap.parse_args()
    sys.exit(worker(args) if args.worker else main())
