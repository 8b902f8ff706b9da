#!/usr/bin/env python3
"""torch_memory_saver's API and vLLM's sleep-mode hooks over cachet, without a GPU and without torch
(ctest cachet_torch_drop_in, label unit; needs the plug-in, whose sleep and wake run without a
device). A stand-in torch (written here: torch.cuda.is_initialized, torch.cuda.graph,
CUDAPluggableAllocator, change_current_allocator) and the stand-in vLLM of tests/stub_vllm are on
the path; cachet's install() is the real one in the configure_subprocess() case and recorded in
the others. Each case runs in a fresh interpreter.

  torch_memory_saver: region() tags, nested with disable() and cuda_graph() (the capture under the
  region's tag); pause/resume of one tag and of all, backups for enable_cpu_backup regions only,
  the "default" tag never paused; hook_mode "preload"/"torch", refused after first use;
  expandable segments kept with cachet_sleep:True added; the message when CUDA was initialised
  first; TMS_INIT_ENABLE(_CPU_BACKUP); disk backup refused; alias() and its refusal to shadow a
  torch_memory_saver; configure_subprocess(): a child installs cachet when it imports torch, its
  own sitecustomize still runs.
  vLLM: the vllm.general_plugins entry point registers "cachet"; the factory creates the backend,
  which makes get_mem_allocator_instance() cachet's; suspend(1)/suspend(2)/resume(tags) as
  CuMemBackend's; use_memory_pool, sleep(offload_tags), wake_up, discard, get_current_usage, the
  tag restored after an exception inside the pool.
  disable(): under "default" in a pool of its own (torch.cuda.MemPool with the c10 backend, cachet's
  pool of the thread with the plug-in) dropped on exit, empty_cache() only before the device has an
  allocator.
  Installing: the first use_memory_pool() (directly or under the sleep-mode backend, which installs
  nothing itself) and the first region() install cachet with cachet_sleep:True through the backend
  $CACHET_TORCH_AUTOINSTALL_BACKEND names; cachet installed by the program without cachet_sleep:True
  is refused with both ways out.

usage: test_drop_in.py --lib path/to/libcachet_torch.so
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import preamble

check = preamble.Checks()
HERE = os.path.dirname(os.path.abspath(__file__))

STUB_TORCH = '''
import os, sys
__version__ = "2.11.0+stub"
events = []


class _Allocator:
    def __init__(self, path, malloc, free):
        events.append(("CUDAPluggableAllocator", os.path.basename(path), malloc, free))

    def allocator(self):
        return object()


class _Memory:
    CUDAPluggableAllocator = _Allocator

    @staticmethod
    def change_current_allocator(a):
        events.append(("change_current_allocator",))


class _Cuda:
    memory = _Memory

    @staticmethod
    def is_initialized():
        return os.environ.get("STUB_CUDA_INITIALIZED") == "1"

    class graph:
        def __init__(self, g, pool=None, stream=None, capture_error_mode="global"):
            self.args = [g, pool, stream, capture_error_mode]

        def __enter__(self):
            import cachet_torch
            events.append(("graph enter", self.args, cachet_torch.current_tag()))
            return self

        def __exit__(self, *exc):
            import cachet_torch
            events.append(("graph exit", cachet_torch.current_tag()))

    class MemPool:
        def __init__(self):
            events.append(("MemPool",))

        def __del__(self):
            events.append(("~MemPool",))

    class use_mem_pool:
        def __init__(self, pool):
            self.pool = pool

        def __enter__(self):
            import cachet_torch
            events.append(("use_mem_pool enter", cachet_torch.current_tag()))

        def __exit__(self, *exc):
            events.append(("use_mem_pool exit",))


cuda = _Cuda
'''

PRELUDE = '''
import json, os, sys
import cachet_torch
import cachet_torch._install as I, cachet_torch._library as L, cachet_torch._sleep as S
installs, calls, backends = [], [], []
def fake_install(*a, **k):
    installs.append(os.environ.get("CACHET_ALLOC_CONF"))
    backends.append(k.get("backend", "auto"))
    L.load()
    L._set_backend("plugin")
I.install = fake_install
real_sleep, real_wake = S.sleep, S.wake
def rec_sleep(tags=None, backup=("weights",), device=None):
    calls.append(["sleep", sorted(tags) if tags is not None else None, sorted(backup)])
    return real_sleep(tags, backup, device)
def rec_wake(tags=None, device=None):
    calls.append(["wake", sorted(tags) if tags is not None else None])
    return real_wake(tags, device)
S.sleep, S.wake = rec_sleep, rec_wake
out = {}
def done():
    out["installs"], out["calls"], out["backends"] = installs, calls, backends
    print("RESULT " + json.dumps(out))
'''


def make_dirs(tmp):
    torch_dir = os.path.join(tmp, "stub_torch")
    os.makedirs(os.path.join(torch_dir, "torch"))
    with open(os.path.join(torch_dir, "torch", "__init__.py"), "w") as f:
        f.write(STUB_TORCH)
    # The distribution metadata pip writes for cachet-torch: its vllm.general_plugins entry point.
    dist = os.path.join(tmp, "dist", "cachet_torch-0.1.0.dist-info")
    os.makedirs(dist)
    with open(os.path.join(dist, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: cachet-torch\nVersion: 0.1.0\n")
    with open(os.path.join(dist, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\ncachet = cachet_torch.vllm_backend:register\n")
    real_tms = os.path.join(tmp, "real_tms", "torch_memory_saver")
    os.makedirs(real_tms)
    open(os.path.join(real_tms, "__init__.py"), "w").close()
    site = os.path.join(tmp, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write("import os\nos.environ['STUB_SITECUSTOMIZE_RAN'] = '1'\n")
    return torch_dir, os.path.dirname(dist), os.path.dirname(real_tms), site


def run_child(code, env, prelude=True):
    r = subprocess.run([sys.executable, "-c", (PRELUDE if prelude else "") + textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    res = None
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    if res is None:
        print(f"  child exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return res, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cachet-drop-in-")
    torch_dir, dist_dir, real_tms_dir, site_dir = make_dirs(tmp)
    base = preamble.child_env(os.path.abspath(a.lib))
    for k in ("TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP", "TMS_RETAIN_CPU_BACKUP", "TMS_DISK_BACKUP_DIR",
              "CACHET_TORCH_AUTOINSTALL", "CACHET_TORCH_MEMORY_SAVER"):
        base.pop(k, None)
    path = [torch_dir, os.path.join(HERE, "stub_vllm"), dist_dir, preamble.PYDIR]
    base["PYTHONPATH"] = os.pathsep.join(path)

    # 1. Regions, pause and resume.
    env = dict(base, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    res, _ = run_child('''
        import torch
        from cachet_torch.memory_saver import torch_memory_saver as tms
        tms.hook_mode = "torch"
        tags = {}
        with tms.region("weights", enable_cpu_backup=True):
            tags["weights"] = cachet_torch.current_tag()
        with tms.region("kv_cache"):
            tags["kv_cache"] = cachet_torch.current_tag()
            with tms.disable():
                tags["disabled"] = cachet_torch.current_tag()
            tags["after_disable"] = cachet_torch.current_tag()
        with tms.cuda_graph(cuda_graph="G", pool="P", tag="cuda_graph"):
            tags["graph"] = cachet_torch.current_tag()
        tags["outside"] = cachet_torch.current_tag()
        try:
            tms.hook_mode = "preload"
        except AssertionError as e:
            out["late_hook_mode"] = str(e)
        tms.pause("kv_cache"); tms.pause(); tms.resume("weights"); tms.resume(); tms.pause("never_used")
        out["tags"], out["events"] = tags, torch.events
        out["canonical"] = cachet_torch.settings()["canonical"]
        out["enabled"], out["hook_mode"] = tms.enabled, tms.hook_mode
        done()
    ''', env)
    if res:
        check(res["tags"] == {"weights": "tms.weights.cpu", "kv_cache": "tms.kv_cache", "disabled": "default",
                              "after_disable": "tms.kv_cache", "graph": "tms.cuda_graph", "outside": "default"},
              f"region(), disable() and cuda_graph() set cachet's tags: {res['tags']}")
        check(res["events"][:2] == [["graph enter", ["G", "P", None, "global"], "default"],
                                    ["graph exit", "default"]] and res["tags"]["graph"] == "tms.cuda_graph",
              f"cuda_graph() is torch.cuda.graph(...) with the capture's body under the region's tag, as "
              f"torch_memory_saver nests them: {res['events']}")
        all_tags = ["tms.cuda_graph", "tms.kv_cache", "tms.weights.cpu"]
        check(res["calls"] == [["sleep", ["tms.kv_cache"], []], ["sleep", all_tags, ["tms.weights.cpu"]],
                               ["wake", ["tms.weights.cpu"]], ["wake", all_tags]],
              f"pause(tag)/pause()/resume(tag)/resume() sleep and wake those regions, backing up only "
              f"enable_cpu_backup ones, never 'default'; a tag never used does nothing: {res['calls']}")
        check(res["installs"] == ["expandable_segments:True,cachet_sleep:True"]
              and res["canonical"] == "expandable_segments:True,cachet_sleep:True",
              f"cachet installed once, expandable segments kept, cachet_sleep:True added: {res['installs']} "
              f"{res['canonical']}")
        check("Cannot configure after initialization" in res.get("late_hook_mode", "")
              and res["enabled"] is True and res["hook_mode"] == "torch",
              "hook_mode is set before the first use only; enabled is True")

    # 2. Refusals and TMS_* variables.
    res, _ = run_child('''
        from cachet_torch.memory_saver import TorchMemorySaver
        m = TorchMemorySaver()
        for what, f in (("hook_mode", lambda: setattr(m, "hook_mode", "cuda")),
                        ("disk", lambda: m.region("x", enable_disk_backup=True).__enter__()),
                        ("backend", lambda: m.region("x", cpu_backup_backend="pinned").__enter__()),
                        ("bad tag", lambda: m.region("a b").__enter__())):
            try:
                f()
                out[what] = None
            except Exception as e:
                out[what] = type(e).__name__ + ": " + str(e)
        done()
    ''', base)
    if res:
        check(res["hook_mode"].startswith("ValueError") and res["disk"].startswith("NotImplementedError")
              and res["backend"].startswith("ValueError") and res["bad tag"].startswith("ValueError"),
              f"refused: another hook_mode, disk backup, cpu_backup_backend without backup, a bad tag: {res}")
    res, _ = run_child('''
        from cachet_torch.memory_saver import TorchMemorySaver
        m = TorchMemorySaver()
        m.pause()
        out["tag"] = cachet_torch.current_tag()
        out["retain"] = m.retain_cpu_backup
        m.pause()
        done()
    ''', dict(base, TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1", TMS_RETAIN_CPU_BACKUP="1"))
    if res:
        check(res["tag"] == "tms.default.cpu" and res["retain"] is True
              and res["calls"][-1] == ["sleep", ["tms.default.cpu"], ["tms.default.cpu"]],
              f"TMS_INIT_ENABLE(_CPU_BACKUP), TMS_RETAIN_CPU_BACKUP: {res}")
    res, r = run_child('''
        import torch
        from cachet_torch.memory_saver import torch_memory_saver as tms
        try:
            with tms.region("weights"):
                pass
        except RuntimeError as e:
            out["error"] = str(e)
        done()
    ''', dict(base, STUB_CUDA_INITIALIZED="1"))
    if res:
        check("CUDA was already initialised" in (res.get("error") or "") and "configure_subprocess" in res["error"]
              and res["installs"] == [], f"CUDA initialised first: the message, nothing installed: {res.get('error')}")

    # 3. alias(): import torch_memory_saver, never shadowing a real one silently.
    res, _ = run_child('''
        from cachet_torch import memory_saver
        memory_saver.alias()
        import torch_memory_saver
        out["same"] = torch_memory_saver is memory_saver and torch_memory_saver.torch_memory_saver is memory_saver.torch_memory_saver
        done()
    ''', base)
    check(bool(res and res["same"]), "alias(): import torch_memory_saver gives cachet's")
    res, _ = run_child('''
        from cachet_torch import memory_saver
        try:
            memory_saver.alias()
        except RuntimeError as e:
            out["refused"] = str(e)
        memory_saver.alias(force=True)
        import torch_memory_saver
        out["forced"] = torch_memory_saver is memory_saver
        done()
    ''', dict(base, PYTHONPATH=base["PYTHONPATH"] + os.pathsep + real_tms_dir))
    check(bool(res and "a torch_memory_saver is installed" in res.get("refused", "") and real_tms_dir in res["refused"]
               and res["forced"]), f"alias() refuses to shadow an installed torch_memory_saver, naming it; force=True: {res}")

    # 4. configure_subprocess(): the child installs cachet (for real, plug-in) when it imports torch.
    res, _ = run_child('''
        import subprocess
        from cachet_torch.memory_saver import configure_subprocess
        child = ("import os, json, cachet_torch\\n"
                 "before = cachet_torch.backend()\\n"
                 "import torch\\n"
                 "import torch_memory_saver\\n"
                 "torch_memory_saver.torch_memory_saver.hook_mode = 'preload'\\n"
                 "print('RESULT ' + json.dumps({'before': before, 'after': cachet_torch.backend(), 'events': torch.events,"
                 " 'tag': cachet_torch.current_tag(),"
                 " 'conf': cachet_torch.settings()['canonical'], 'site': os.environ.get('STUB_SITECUSTOMIZE_RAN'),"
                 " 'tms': __import__('torch_memory_saver').__name__}))\\n")
        with configure_subprocess():
            env = dict(os.environ, CACHET_TORCH_AUTOINSTALL_BACKEND="plugin", CACHET_TORCH_MEMORY_SAVER="1",
                       TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
            env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + os.environ["STUB_SITE"]
            r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
            inside = os.environ.get("CACHET_TORCH_AUTOINSTALL")
        out["child"] = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        out["stderr"] = r.stderr[-2000:]
        out["restored"] = [inside, os.environ.get("CACHET_TORCH_AUTOINSTALL"), os.environ.get("CACHET_ALLOC_CONF")]
        done()
    ''', dict(base, STUB_SITE=site_dir), prelude=True)
    child = json.loads(res["child"][0][7:]) if res and res["child"] else None
    check(child is not None and child["before"] is None and child["after"] == "plugin"
          and child["events"] == [["CUDAPluggableAllocator", "libcachet_torch.so", "cachet_malloc", "cachet_free"],
                                  ["change_current_allocator"]]
          and child["conf"] == "cachet_sleep:True" and child["tms"] == "cachet_torch.memory_saver",
          f"configure_subprocess(): the child installs cachet as it imports torch (cachet_sleep:True), "
          f"torch_memory_saver aliased with CACHET_TORCH_MEMORY_SAVER=1: {child} {res and res['stderr']}")
    check(child is not None and child["site"] == "1" and "Error in sitecustomize" not in res["stderr"],
          f"configure_subprocess(): the child's own sitecustomize still runs, no start error ({res and res['stderr'][-300:]})")
    r = subprocess.run([sys.executable, "-c", "import sys; print(sys.modules['sitecustomize'].__file__)"],
                       env=dict(base, PYTHONPATH=os.path.join(preamble.PYDIR, "cachet_torch", "_startup")),
                       capture_output=True, text=True, cwd=tempfile.gettempdir())
    check(r.returncode == 0 and "Error in sitecustomize" not in r.stderr,
          f"the start hook alone, with or without another sitecustomize on the path: {r.stdout.strip()} {r.stderr[-300:]}")
    check(child is not None and child["tag"] == "tms.default.cpu",
          f"TMS_INIT_ENABLE(_CPU_BACKUP) in the child: region memory from the start, hook_mode still settable: {child and child['tag']}")
    check(res is not None and res["restored"] == ["1", None, None], f"configure_subprocess() restores the environment: {res and res['restored']}")

    # 5. vLLM: the plug-in entry point, the backend, the allocator.
    res, _ = run_child('''
        from vllm.plugins import load_general_plugins
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
        import vllm.device_allocator as da
        import vllm.worker
        load_general_plugins()
        out["before"] = type(vllm.worker.allocator()).__module__
        cls = SleepModeBackendFactory.get_backend_class("cachet")
        out["class"] = cls.__module__ + "." + cls.__name__
        out["caps"] = [cls.is_supported(), cls.preserves_communicators(), cls.preserves_compiled_artifacts(),
                       cls.preserves_graphs_with_communicators(), cls.supports_durable_storage()]
        class MC:
            sleep_mode_backend = "cachet"
        b = SleepModeBackendFactory.create_backend(MC())
        alloc = da.get_mem_allocator_instance()
        out["patched"] = [type(alloc).__module__, type(vllm.worker.allocator()).__module__]
        with alloc.use_memory_pool(tag="weights"):
            out["in_weights"] = [cachet_torch.current_tag(), alloc.current_tag]
        with alloc.use_memory_pool(tag="kv_cache"):
            pass
        with alloc.use_memory_pool():
            out["in_default"] = cachet_torch.current_tag()
        try:
            with alloc.use_memory_pool(tag="cuda_graph"):
                raise KeyError("inside the pool")
        except KeyError:
            out["after_error"] = [cachet_torch.current_tag(), alloc.current_tag]
        b.suspend(level=1); s1 = b.state(); b.resume(["weights"]); b.resume(None); s2 = b.state()
        b.suspend(level=2)
        alloc.sleep(offload_tags="kv_cache"); alloc.sleep(); alloc.wake_up(); alloc.discard("kv_cache"); alloc.discard(["nope"])
        out["states"] = [s1, s2]
        out["usage"] = alloc.get_current_usage()
        done()
    ''', base)
    if res:
        check(res["class"] == "cachet_torch.vllm_backend.CachetSleepModeBackend",
              f"the vllm.general_plugins entry point registers the backend 'cachet': {res['class']}")
        check(res["caps"] == [True, True, True, True, False], f"capabilities: {res['caps']}")
        check(res["before"] == "vllm.device_allocator.cumem"
              and res["patched"] == ["cachet_torch.vllm_backend", "cachet_torch.vllm_backend"],
              f"creating the backend makes get_mem_allocator_instance() and the class a worker imported "
              f"before (vLLM's, patched in place) give cachet's allocator: {res['before']} -> {res['patched']}")
        check(res["in_weights"] == ["vllm.weights", "weights"] and res["in_default"] == "vllm.default"
              and res["after_error"] == ["default", "default"],
              f"use_memory_pool(tag) sets cachet's tag and current_tag, restored after an exception inside: {res}")
        every = ["vllm.cuda_graph", "vllm.default", "vllm.kv_cache", "vllm.weights"]
        check(res["calls"] == [["sleep", every, ["vllm.weights"]], ["wake", ["vllm.weights"]], ["wake", every],
                               ["sleep", every, []], ["sleep", every, ["vllm.kv_cache"]],
                               ["sleep", every, ["vllm.default"]], ["wake", every], ["sleep", ["vllm.kv_cache"], []]],
              f"suspend(1)/resume(tags)/suspend(2), sleep(offload_tags) (default ('default',)), wake_up, discard: {res['calls']}")
        check(res["states"] == ["SUSPENDED", "RUNNING"] and res["usage"] == 0 and res["installs"] and len(res["installs"]) == 1,
              f"the backend's state; get_current_usage() with no allocation: {res['states']} {res['usage']}")

    res, _ = run_child('''
        import vllm.worker
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        out["at_load"] = type(vllm.worker.allocator()).__module__
        done()
    ''', dict(base, CACHET_VLLM_ALLOCATOR="1"))
    check(bool(res and res["at_load"] == "cachet_torch.vllm_backend"),
          f"CACHET_VLLM_ALLOCATOR=1: cachet's allocator from the plug-in's load on: {res and res['at_load']}")

    # 6. The backend cachet installs itself with: $CACHET_TORCH_AUTOINSTALL_BACKEND, for vLLM's
    # allocator (directly and through the sleep-mode backend) and torch_memory_saver alike.
    res, _ = run_child('''
        from cachet_torch.vllm_backend import CuMemAllocator
        alloc = CuMemAllocator.get_instance()
        out["before"] = cachet_torch.installed()
        with alloc.use_memory_pool(tag="weights"):
            pass
        out["canonical"] = cachet_torch.settings()["canonical"]
        done()
    ''', dict(base, CACHET_TORCH_AUTOINSTALL_BACKEND="plugin", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"))
    check(bool(res and res["before"] is False and res["backends"] == ["plugin"]
               and res["installs"] == ["expandable_segments:True,cachet_sleep:True"]
               and res["canonical"] == "expandable_segments:True,cachet_sleep:True"),
          f"vLLM's allocator installs cachet at its first use_memory_pool(), with cachet_sleep:True added and the "
          f"backend $CACHET_TORCH_AUTOINSTALL_BACKEND names: {res}")
    res, _ = run_child('''
        from vllm.plugins import load_general_plugins
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
        import vllm.device_allocator as da
        load_general_plugins()
        class MC:
            sleep_mode_backend = "cachet"
        b = SleepModeBackendFactory.create_backend(MC())
        b.suspend(level=1); b.resume(None)
        out["after_backend"] = [cachet_torch.installed(), list(calls)]
        with da.get_mem_allocator_instance().use_memory_pool(tag="weights"):
            pass
        b.suspend(level=1)
        out["canonical"] = cachet_torch.settings()["canonical"]
        done()
    ''', dict(base, CACHET_TORCH_AUTOINSTALL_BACKEND="c10"))
    check(bool(res and res["after_backend"] == [False, []] and res["backends"] == ["c10"]
               and res["installs"] == ["cachet_sleep:True"] and res["canonical"] == "cachet_sleep:True"
               and res["calls"] == [["sleep", ["vllm.weights"], ["vllm.weights"]]]),
          f"the sleep-mode backend path: creating the backend and suspend()/resume() before any pool install "
          f"nothing; the worker's first use_memory_pool() installs cachet with cachet_sleep:True, through "
          f"$CACHET_TORCH_AUTOINSTALL_BACKEND: {res}")
    res, _ = run_child('''
        from cachet_torch.memory_saver import torch_memory_saver as tms
        with tms.region("weights"):
            pass
        done()
    ''', dict(base, CACHET_TORCH_AUTOINSTALL_BACKEND="plugin"))
    check(bool(res and res["backends"] == ["plugin"] and res["installs"] == ["cachet_sleep:True"]),
          f"torch_memory_saver's first region() installs through $CACHET_TORCH_AUTOINSTALL_BACKEND too: {res}")
    # A program that installed cachet itself without cachet_sleep:True (what test_vllm_gpu.py's
    # worker once did): the first pool refuses, saying how to get both the backend and sleep.
    res, _ = run_child('''
        L.load(); L._set_backend("plugin")   # cachet_torch.install() with no CACHET_ALLOC_CONF
        from cachet_torch.vllm_backend import CuMemAllocator
        try:
            with CuMemAllocator.get_instance().use_memory_pool(tag="weights"):
                pass
        except RuntimeError as e:
            out["error"] = str(e)
        done()
    ''', base)
    err = (res or {}).get("error") or ""
    check("vLLM's CuMemAllocator (cachet): cachet runs with '', without cachet_sleep:True" in err
          and "CACHET_TORCH_AUTOINSTALL_BACKEND" in err and "before cachet_torch.install()" in err,
          f"cachet installed by the program without cachet_sleep:True: the refusal names both ways out: {err}")

    # 7. disable(): the allocations inside in a pool of their own, given back alone on exit (a
    # MemPool with the c10 backend, cachet's pool calls with the plug-in), never empty_cache()
    # while the device has an allocator (it would give back free memory that pause() put to sleep).
    res, _ = run_child('''
        import torch, contextlib
        import cachet_torch._stats as St
        empties = []
        St.empty_cache = lambda *a: empties.append(cachet_torch.current_tag())
        def c10_install(*a, **k):
            installs.append(os.environ.get("CACHET_ALLOC_CONF")); L.load(); L._set_backend("c10")
        I.install = c10_install
        from cachet_torch.memory_saver import torch_memory_saver as tms
        with tms.region("kv_cache"):
            with tms.disable():
                out["inside"] = cachet_torch.current_tag()
            try:
                with tms.disable():
                    raise KeyError("inside disable")
            except KeyError:
                out["after_error"] = cachet_torch.current_tag()
        out["events"], out["empties"] = torch.events, empties
        done()
    ''', base)
    if res:
        one = [["MemPool"], ["use_mem_pool enter", "default"], ["use_mem_pool exit"], ["~MemPool"]]
        check(res["inside"] == "default" and res["after_error"] == "tms.kv_cache" and res["events"] == one + one
              and res["empties"] == [],
              f"c10 backend: disable() allocates under 'default' inside torch.cuda.MemPool() + use_mem_pool(pool) "
              f"and drops the pool on exit (an exception too), no empty_cache(): {res['events']} {res['empties']}")
    res, _ = run_child('''
        import torch
        import cachet_torch._stats as St
        empties, pool_calls = [], []
        St.empty_cache = lambda *a: empties.append(cachet_torch.current_tag())
        from cachet_torch.memory_saver import torch_memory_saver as tms
        with tms.disable():
            pass
        out["no_device"] = [list(empties), list(pool_calls)]
        real = L.load()
        class Lib:  # the plug-in with an allocator on device 0 (a GPU's, once something was allocated)
            def __getattr__(self, name):
                return getattr(real, name)
            def cachet_torch_has_device(self, d):
                return 1
            def cachet_torch_begin_thread_pool(self, d, ref):
                pool_calls.append(["begin", d, cachet_torch.current_tag()])
                ref._obj.value = 42
                return 0
            def cachet_torch_end_thread_pool(self, d, pool):
                pool_calls.append(["end", d, pool])
                return 0
        lib = Lib()
        L.load = lambda path=None: lib
        with tms.region("kv_cache"):
            with tms.disable():
                pool_calls.append(["body", cachet_torch.current_tag()])
        out["pool"] = [list(empties), pool_calls]
        out["events"] = torch.events
        done()
    ''', base)
    if res:
        check(res["no_device"] == [["default"], []] and res["pool"][0] == ["default"]
              and res["pool"][1] == [["begin", 0, "default"], ["body", "default"], ["end", 0, 42]]
              and not any(e[0] == "MemPool" for e in res["events"]),
              f"plug-in: disable() begins cachet's pool of this thread on the current device and ends it on exit "
              f"(no MemPool, which PyTorch refuses for the plug-in, no empty_cache()); before the device has an "
              f"allocator, empty_cache() on exit: {res['no_device']} {res['pool']}")

    print(f"\n{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
