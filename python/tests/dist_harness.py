"""What the torchrun tests of issue 38 share (test_fsdp2.py, test_rl_tp.py): the environment of
every process they start, torchrun with a timeout that kills the whole process group, the skip
checks, per-rank JSON and tables.

  MULTICAST_OFF        NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1:
                       set in every child (issue 38: NVLink multicast stays off on these machines;
                       nothing here calls cuMulticastCreate); require_multicast_off() in a worker
                       exits 3 when one is missing, so a worker started by hand cannot slip by.
  skip_reason(nproc)   None, or why this machine cannot run `nproc` ranks (no torch, no CUDA, fewer
                       GPUs than ranks: NCCL refuses two ranks on one device, no libcachet_c10.so).
  child_env(extra)     preamble.child_env() (no allocator configuration inherited, python/ first
                       on PYTHONPATH) + MULTICAST_OFF + `extra` (a value None removes the key).
  torchrun(...)        `python -m torch.distributed.run --standalone --nproc_per_node N script ...`
                       in a new session, output to a log file; past `timeout` seconds the whole
                       process group gets SIGTERM, then SIGKILL, and the return code is 124; a
                       SIGTERM to the driver (`timeout` around it) stops the torchrun in flight too.
  nccl_timeout()       the init_process_group timeout of the workers (CACHET_DIST_NCCL_TIMEOUT
                       seconds, default 180): ProcessGroupNCCL's watchdog aborts a hung collective
                       well before the driver's own timeout.
  table(rows, heads)   a plain text table.
"""
import datetime
import json
import os
import signal
import subprocess
import sys
import time

import preamble

SKIP = preamble.SKIP
_running = []  # the torchrun in flight (its process group is killed when this driver is)


def _kill_group(p):
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _on_term(signum, frame):  # noqa: ARG001: `timeout` around the driver must not orphan the ranks
    for p in list(_running):
        _kill_group(p)
    print(f"killed by signal {signum}: the torchrun in flight was stopped", file=sys.stderr, flush=True)
    sys.exit(124)

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def require_multicast_off():
    bad = {k: os.environ.get(k) for k, v in MULTICAST_OFF.items() if os.environ.get(k) != v}
    if bad:
        print(f"FAIL  this worker must run with {MULTICAST_OFF} (issue 38: NVLink multicast stays off); "
              f"found {bad}", file=sys.stderr, flush=True)
        sys.exit(3)


def nccl_timeout():
    return datetime.timedelta(seconds=int(os.environ.get("CACHET_DIST_NCCL_TIMEOUT", "180")))


def skip_reason(nproc, need_transformers=False, need_c10=True):
    """None when this machine can run `nproc` ranks, else the reason (the caller prints
    "skipped: ..." and exits 77)."""
    if nproc < 1:
        return f"{nproc} ranks asked (nvidia-smi listed no GPU?)"
    try:
        import torch
    except ImportError as e:
        return f"PyTorch is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA device"
    n = torch.cuda.device_count()
    if nproc > n:
        return (f"{nproc} ranks asked, {n} CUDA device(s) here (one rank per GPU: NCCL refuses two "
                f"ranks of one communicator on one device)")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return "this PyTorch has no torch.distributed with NCCL"
    if need_transformers:
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            return f"transformers is not importable ({e})"
    if need_c10:
        sys.path.insert(0, preamble.PYDIR)
        import cachet_torch
        if cachet_torch.c10_library_path() is None:
            return "no libcachet_c10.so (set CACHET_C10_LIB or CACHET_TORCH_LIB; built only where torch was found)"
    return None


def child_env(extra=None):
    env = preamble.child_env()
    env.update(MULTICAST_OFF)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun sets it too and warns; say it once here
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def torchrun(script, nproc, args, env, timeout, log_path):
    """Runs torchrun; returns (return code, seconds). 124 after the timeout (the process group
    killed). Its whole output goes to log_path."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--max_restarts=0", script, *args]
    if signal.getsignal(signal.SIGTERM) is not _on_term:  # the driver only, never a rank
        signal.signal(signal.SIGTERM, _on_term)
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.write("# env: " + " ".join(f"{k}={env[k]}" for k in sorted(env) if k.startswith(
            ("NCCL_", "TORCH_", "CACHET_", "PYTORCH_", "NVSHMEM_", "CUBLAS_"))) + "\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        _running.append(p)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            log.write(f"\n# killed after {timeout} s (the driver's timeout)\n")
            rc = 124
        finally:
            _running.remove(p)
    return rc, time.time() - t0


def log_tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return f"(no log at {path})"
    return "".join(lines[-n:])


def read_ranks(out_dir, label, nproc):
    """[per-rank dict or None] of the files LABEL-rankR.json."""
    res = []
    for r in range(nproc):
        p = os.path.join(out_dir, f"{label}-rank{r}.json")
        try:
            with open(p) as f:
                res.append(json.load(f))
        except (OSError, ValueError):
            res.append(None)
    return res


def write_rank(out_dir, label, rank, res):
    with open(os.path.join(out_dir, f"{label}-rank{rank}.json"), "w") as f:
        json.dump(res, f, default=str)


def table(rows, heads):
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(heads)]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line([str(h) for h in heads]), line(["-" * w for w in widths])] + [line(r) for r in rows])


def mib(n):
    return "-" if n is None else f"{n / (1 << 20):.1f}"
