#!/usr/bin/env python3
"""scripts/e2e-policy-cachet.py: GPT-2 training through the cachet plug-in with policy:cachet.

Issue 9's GPU goal: the GPT-2 training run with `policy:cachet` in CACHET_ALLOC_CONF reserves at
most 1.05x its peak requested bytes, with losses identical to PyTorch's own allocator.

Runs python/tests/test_e2e.py's worker (the same model, seed, 20 AdamW steps, deterministic
settings) twice in separate processes: PyTorch's native allocator, and the plug-in with
CACHET_ALLOC_CONF=policy:cachet (CUDA VMM backend, 2 MiB pages). Writes a JSON report and
exits 0 when both goals hold, 1 when one fails, 77 when there is no GPU/torch/transformers.

Usage: CACHET_TORCH_LIB=build/gpu/python/libcachet_torch.so scripts/e2e-policy-cachet.py OUT.json
"""
import importlib.util, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(HERE, "..", "python", "tests", "test_e2e.py")


def load_e2e():
    spec = importlib.util.spec_from_file_location("cachet_e2e", E2E)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def child(allocator, lib, out):
    """One training run in this process; adds requested/reserved peaks from the allocator's stats."""
    e2e = load_e2e()

    class A:
        pass
    a = A()
    a.model, a.allocator, a.lib, a.out, a.snapshot = "gpt2", allocator, lib, out, None
    e2e.worker(a)
    with open(out) as f:
        r = json.load(f)
    if allocator == "cachet":
        import cachet_torch
        st = cachet_torch.memory_stats(0)
        r["settings"] = cachet_torch.settings()["canonical"]
    else:
        import torch
        st = torch.cuda.memory_stats(0)
    r["peak_requested"] = st["requested_bytes.all.peak"]
    r["peak_reserved_stat"] = st["reserved_bytes.all.peak"]
    r["num_device_alloc"] = st.get("num_device_alloc")
    r["num_device_free"] = st.get("num_device_free")
    with open(out, "w") as f:
        json.dump(r, f)
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], sys.argv[4])
    out = sys.argv[1] if len(sys.argv) > 1 else "e2e-policy-cachet.json"
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    if importlib.util.find_spec("transformers") is None:
        print("SKIP: transformers is not installed")
        return 77
    lib = os.environ.get("CACHET_TORCH_LIB", "")
    if not os.path.exists(lib):
        print(f"FAIL: CACHET_TORCH_LIB={lib!r} not found")
        return 1
    base = {k: v for k, v in os.environ.items()
            if k not in ("CACHET_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    base["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    base["PYTHONPATH"] = os.path.join(HERE, "..", "python") + os.pathsep + base.get("PYTHONPATH", "")
    base.setdefault("HF_HUB_OFFLINE", "1")
    base.setdefault("TOKENIZERS_PARALLELISM", "false")
    runs = {}
    for name, alloc, conf in (("native", "native", None), ("cachet_policy", "cachet", "policy:cachet")):
        env = dict(base)
        if conf:
            env["CACHET_ALLOC_CONF"] = conf
        o = os.path.abspath(out) + f".{name}.json"
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", alloc, lib, o],
                           env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            print(f"FAIL: the {name} run failed (rc {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
            return 1
        with open(o) as f:
            runs[name] = json.load(f)
    n, c = runs["native"], runs["cachet_policy"]
    waste = c["peak_reserved"] / c["peak_requested"]
    same = n["losses"] == c["losses"]
    rep = {
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "model": "gpt2", "steps": len(n["losses"]),
        "cachet_settings": c.get("settings"),
        "losses_identical": same,
        "native": {k: n.get(k) for k in ("peak_reserved", "peak_allocated", "peak_requested", "num_alloc_retries")},
        "cachet_policy": {k: c.get(k) for k in ("peak_reserved", "peak_allocated", "peak_requested", "num_alloc_retries",
                                                "num_device_alloc", "num_device_free")},
        "waste_native": n["peak_reserved"] / n["peak_requested"],
        "waste_cachet_policy": waste,
        "median_step_s": {"native": sorted(n["step_seconds"][5:])[len(n["step_seconds"][5:]) // 2],
                          "cachet_policy": sorted(c["step_seconds"][5:])[len(c["step_seconds"][5:]) // 2]},
    }
    rep["passed"] = same and waste <= 1.05
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)
    print(json.dumps(rep, indent=1))
    print("PASS" if rep["passed"] else "FAIL: " + ("losses differ; " if not same else "") +
          (f"waste {waste:.4f} > 1.05" if waste > 1.05 else ""))
    return 0 if rep["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
