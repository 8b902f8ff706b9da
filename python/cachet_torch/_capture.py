"""The capture side of `cachet predict` (docs/predict.md): run an unmodified PyTorch program on the
fake CUDA device and write what PyTorch's own allocator did, as a PyTorch memory snapshot.

`cachet predict` starts this module in a fresh Python whose environment preloads
libcachet_fakecuda.so and describes the target GPU (CACHET_FAKE_*):

    python3 -m cachet_torch._capture --out DIR [--batch-arg NAME --batch N] -- (SCRIPT | -m MODULE) ARGS...

It writes DIR/snapshot.pickle (torch.cuda.memory._snapshot() with a "cachet_predicted" marker) and
DIR/capture.json (what it saw and assumed). Exit codes: 0 the program ended (also by an
out-of-memory error: that is an answer); 3 the program raised something else (its traceback is on
stderr, the snapshot holds what ran until then); 2 the capture could not start (no torch, the fake
device is not in place).

Nothing here replays or judges: the replay is tools/'s.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import runpy
import sys
import time
import traceback

# What the fake device answers that a GPU would compute (docs/predict.md section 4); written to
# capture.json's "assumptions" only when the program met it.
ASSUME_READ = ("values the program reads from the GPU (.item(), bool(), .tolist(), .cpu(), "
               "GradScaler's inf check) are 0: no data is computed")
ASSUME_NONZERO = ("data-dependent shapes (nonzero, unique, masked_select) are empty: the count read "
                  "from the GPU is 0")
ASSUME_GENERATE = ("generate() runs every step to max_new_tokens/max_length: no sequence ends early "
                   "(an end-of-sequence token cannot be predicted)")
ASSUME_EVENTS = ("the GPU keeps up with the CPU: every event and stream is complete when queried, so "
                 "blocks freed with record_stream are reusable at the next allocation")
ASSUME_CUDNN_SDPA = ("scaled_dot_product_attention never takes cuDNN's backend: where the target "
                     "would, the capture runs the next one (flash or memory-efficient), whose memory "
                     "differs by the backward's workspace")
ASSUME_COMPILE = "torch.compile is refused: Inductor's kernels cannot be generated without the GPU"


class Capture:
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.assumptions: list[str] = []
        self.notes: list[str] = []
        self.started = time.time()
        self.user_history_calls = 0
        self.cudnn = ""

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)


def _rewrite_batch(argv: list[str], name: str, value: int) -> tuple[list[str], bool]:
    """argv with --NAME set to value (--NAME X, --NAME=X, or appended when absent)."""
    flag = "--" + name.lstrip("-")
    out, found, i = [], False, 0
    while i < len(argv):
        a = argv[i]
        if a == flag and i + 1 < len(argv):
            out += [flag, str(value)]
            found, i = True, i + 2
            continue
        if a.startswith(flag + "="):
            out.append(f"{flag}={value}")
            found = True
        else:
            out.append(a)
        i += 1
    if not found:
        out += [flag, str(value)]
    return out, found


def _install_generate_patch(cap: Capture) -> None:
    """generate()'s loop ends on a value read from the GPU; on the fake device it runs to the
    length the call asks for (ASSUME_GENERATE)."""
    import importlib.abc
    import importlib.util

    def patch(mod) -> None:
        gm = getattr(mod, "GenerationMixin", None)
        if gm is None or getattr(gm, "_cachet_patched", False):
            return
        orig_generate = gm.generate
        orig_has = gm._has_unfinished_sequences
        state = {"left": None}

        def generate(self, *args, **kwargs):
            cfg = kwargs.get("generation_config") or getattr(self, "generation_config", None)
            new = kwargs.get("max_new_tokens", getattr(cfg, "max_new_tokens", None))
            inputs = kwargs.get("input_ids", args[0] if args else None)
            if new is None:
                max_len = kwargs.get("max_length", getattr(cfg, "max_length", None))
                if max_len is not None and inputs is not None and hasattr(inputs, "shape"):
                    new = max(0, int(max_len) - int(inputs.shape[-1]))
            saved = state["left"]
            state["left"] = None if new is None else int(new)
            cap.assume(ASSUME_GENERATE)
            try:
                return orig_generate(self, *args, **kwargs)
            finally:
                state["left"] = saved

        def has_unfinished(self, this_peer_finished, *args, **kwargs):
            if state["left"] is None:
                return orig_has(self, False, *args, **kwargs)
            # Called once before the first step and once after each step.
            if state["left"] <= 0:
                return False
            state["left"] -= 1
            return True

        gm.generate = generate
        gm._has_unfinished_sequences = has_unfinished
        gm._cachet_patched = True

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "transformers.generation.utils":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, Finder())


def _refuse_compile(cap: Capture, torch) -> None:
    def compile(*args, **kwargs):
        cap.assume(ASSUME_COMPILE)
        raise RuntimeError(
            "cachet predict: torch.compile cannot run on the fake CUDA device (Inductor generates and "
            "benchmarks kernels on a real GPU). Predict the eager program: run it with torch.compile "
            "disabled (e.g. TORCHDYNAMO_DISABLE=1), which allocates at least what compiled code does")
    torch.compile = compile


def _hold_history(cap: Capture, torch) -> None:
    """The capture records the whole run; a program's own _record_memory_history calls are noted and
    not passed on (its _dump_snapshot still writes the capture's history so far)."""
    real = torch.cuda.memory._record_memory_history

    def record(*args, **kwargs):
        cap.user_history_calls += 1
        if cap.user_history_calls == 1:
            cap.notes.append("the program's own _record_memory_history calls were kept from changing the capture's")
    torch.cuda.memory._record_memory_history = record
    torch.cuda._record_memory_history = record
    return real


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("cachet_torch._capture: usage: --out DIR [--batch-arg NAME --batch N] -- (SCRIPT | -m MODULE) ARGS...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="cachet_torch._capture")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-arg")
    ap.add_argument("--batch", type=int)
    opts = ap.parse_args(argv[:split])
    program = argv[split + 1:]
    if not program or (program[0] == "-m" and len(program) < 2):
        print("cachet_torch._capture: no program given after --", file=sys.stderr)
        return 2
    os.makedirs(opts.out, exist_ok=True)
    cap = Capture(opts.out)

    # NVIDIA's cuDNN runs on the fake device and picks its engines as on the target; the fake
    # cuDNN (CACHET_FAKE_CUDNN=fake, preloaded by cachet predict) is driven through its v7 API
    # (docs/predict.md section 3).
    fake_cudnn = os.environ.get("CACHET_FAKE_CUDNN", "") == "fake"
    if fake_cudnn:
        os.environ["TORCH_CUDNN_V8_API_DISABLED"] = "1"
    # torch counts devices through NVML where it can, honouring CUDA_VISIBLE_DEVICES; the fake
    # device is device 0 whatever the host has (predict hides any real GPU: it never touches it).
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"cachet predict: this Python ({sys.executable}) cannot import torch: {e}. "
              "Give the Python that has torch with --python", file=sys.stderr)
        return 2
    try:
        ver = torch._C._cudnn.getCompileVersion()  # (major, minor, patch)
        os.environ["CACHET_FAKE_CUDNN_VERSION"] = str(ver[0] * 10000 + ver[1] * 100 + ver[2])
    except Exception:  # noqa: BLE001
        pass
    want = os.environ.get("CACHET_FAKE_GPU_NAME", "")
    if not torch.version.cuda:
        print(f"cachet predict: torch {torch.__version__} at {os.path.dirname(torch.__file__)} is built without CUDA; "
              "predict needs a CUDA build of torch (the CPU has no GPU to use, but torch must know CUDA)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or torch.cuda.get_device_name(0) != want:
        print("cachet predict: the fake CUDA device is not in place (LD_PRELOAD of libcachet_fakecuda.so); "
              f"torch sees {torch.cuda.device_count()} device(s)", file=sys.stderr)
        return 2

    cap.cudnn = "fake" if fake_cudnn else f"nvidia {torch.backends.cudnn.version()}"
    if fake_cudnn and torch.backends.cuda.cudnn_sdp_enabled():
        # The fake cuDNN has no graph API, so no attention: PyTorch then takes the next backend the
        # target would take (flash or memory-efficient). NVIDIA's cuDNN builds it as on the GPU.
        torch.backends.cuda.enable_cudnn_sdp(False)
        cap.assume(ASSUME_CUDNN_SDPA)
    real_history = _hold_history(cap, torch)
    real_history(enabled="all", context="all", stacks="python", max_entries=2**31 - 1)
    _refuse_compile(cap, torch)
    _install_generate_patch(cap)
    cap.assume(ASSUME_READ)
    cap.assume(ASSUME_EVENTS)

    batch_found = None
    if opts.batch_arg:
        program_args = program[2:] if program[0] == "-m" else program[1:]
        new_args, batch_found = _rewrite_batch(program_args, opts.batch_arg, opts.batch)
        program = (program[:2] if program[0] == "-m" else program[:1]) + new_args

    status, error, oom_text = "ended", None, None
    sys.argv = program[1:] if program[0] == "-m" else program
    if program[0] != "-m":
        sys.path.insert(0, os.path.dirname(os.path.abspath(program[0])))
    try:
        if program[0] == "-m":
            sys.argv = [program[1]] + program[2:]
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(program[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            status, error = "exited", f"SystemExit({e.code!r})"
    except torch.OutOfMemoryError as e:
        status, oom_text = "oom", str(e)
        traceback.print_exc()
    except BaseException as e:  # noqa: BLE001
        status, error = "raised", "".join(traceback.format_exception(type(e), e, e.__traceback__))
        traceback.print_exc()

    snap = torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    env_conf = {k: os.environ[k] for k in ("CACHET_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
                if k in os.environ}
    snap["cachet_predicted"] = {
        "tool": "cachet predict",
        "gpu": want,
        "device_memory": int(os.environ.get("CACHET_FAKE_GPU_MEMORY", "0")),
        "arch": os.environ.get("CACHET_FAKE_GPU_ARCH_TEXT", ""),
        "torch": str(torch.__version__),
    }
    with open(os.path.join(opts.out, "snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f)
    ledger = []
    lp = os.environ.get("CACHET_FAKE_LEDGER")
    if lp and os.path.exists(lp):
        with open(lp) as f:
            ledger = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    nonzero_seen = any("nonzero" in str(fr.get("name", "")) or "unique" in str(fr.get("name", ""))
                       for tr in snap.get("device_traces", []) for e in tr for fr in (e.get("frames") or [])[:3])
    if nonzero_seen:
        cap.assume(ASSUME_NONZERO)
    info = {
        "status": status,
        "error": error,
        "oom": oom_text,
        "num_ooms": int(stats.get("num_ooms", 0)),
        "peak_reserved": int(stats.get("reserved_bytes.all.peak", 0)),
        "peak_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
        "env_conf": env_conf,
        "assumptions": cap.assumptions,
        "notes": cap.notes,
        "ledger": ledger,
        "batch_arg_found": batch_found,
        "program": program,
        "torch": str(torch.__version__),
        "cudnn": cap.cudnn,
        "seconds": time.time() - cap.started,
    }
    with open(os.path.join(opts.out, "capture.json"), "w") as f:
        json.dump(info, f, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    # The program's own threads and atexit handlers may touch CUDA after this point; the capture is
    # written, so leave without running them.
    os._exit(3 if status in ("raised", "exited") else 0)


if __name__ == "__main__":
    sys.exit(main())
