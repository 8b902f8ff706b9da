#!/usr/bin/env python3
"""`pip install --no-build-isolation` of the checkout into a fresh venv (ctest cachet_pip, label pip;
exit 77 where this Python cannot make a venv with pip, e.g. Debian without python3-venv).

  * the venv gets setuptools and wheel from the Debian wheels (/usr/share/python-wheels,
    python3-setuptools-whl, python3-wheel-whl) when it lacks them: no package index is used;
  * `pip install --no-build-isolation --no-index CHECKOUT` with CACHET_BUILD_DIR (the tree ctest
    runs in: nothing is built again) installs the package and the command;
  * from a neutral directory, with no PYTHONPATH, CACHET_TORCH_LIB or CACHET_C10_LIB: `cachet
    --version` is the venv's bin/cachet; `import cachet_torch` is the venv's, imports no torch, finds
    the libraries inside the package (where the build made them) and metrics_text() works;
  * `pip install --target DIR` (how the GPU machine installs with torch's Python) gives
    DIR/bin/cachet and DIR/cachet_torch with its libraries;
  * `pip uninstall` takes the command and the package away.

usage: test_pip.py --source CHECKOUT --build-dir BUILD [--work DIR] [--fresh]
  --fresh: configure and build a tree of its own (build/pip-*) instead of CACHET_BUILD_DIR (minutes)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import preamble

check = preamble.Checks()
DEBIAN_WHEELS = "/usr/share/python-wheels"


def run(cmd, env=None, cwd=None, timeout=1800):
    """subprocess.run, capturing; a command that is not there exits 127, as in a shell."""
    if os.sep not in cmd[0] and shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: not found on PATH")
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def clean_env(venv):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CACHET_TORCH_LIB", "CACHET_C10_LIB", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--work")
    ap.add_argument("--fresh", action="store_true")
    a = ap.parse_args()
    t0 = time.monotonic()
    work = a.work or tempfile.mkdtemp(prefix="cachet-pip-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    venv = os.path.join(work, "venv")
    neutral = os.path.join(work, "neutral")
    os.makedirs(neutral)

    r = run([sys.executable, "-m", "venv", venv])
    py = os.path.join(venv, "bin", "python")
    if r.returncode != 0 or not os.path.exists(py):
        print(f"SKIP: {sys.executable} -m venv failed (Debian: apt-get install python3-venv): {r.stderr.strip()[-300:]}")
        return preamble.SKIP
    env = clean_env(venv)
    if run([py, "-m", "pip", "--version"], env=env).returncode != 0:
        print("SKIP: the venv has no pip (Debian: python3-venv brings python3-pip-whl)")
        return preamble.SKIP
    for mod, pkg in (("setuptools", "setuptools"), ("wheel", "wheel")):
        if run([py, "-c", f"import {mod}"], env=env).returncode == 0:
            continue
        r = run([py, "-m", "pip", "install", "--no-index", "--find-links", DEBIAN_WHEELS, pkg], env=env)
        if r.returncode != 0:
            print(f"SKIP: the venv has no {mod} and {DEBIAN_WHEELS} has none "
                  f"(Debian: python3-{pkg}-whl): {r.stderr.strip()[-300:]}")
            return preamble.SKIP
    print(f"venv ready in {time.monotonic() - t0:.1f} s")

    t1 = time.monotonic()
    penv = dict(env)
    if not a.fresh:
        penv["CACHET_BUILD_DIR"] = os.path.abspath(a.build_dir)
    r = run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "-v", os.path.abspath(a.source)],
            env=penv, cwd=neutral)
    notes = [l for l in (r.stdout + r.stderr).splitlines() if "cachet setup.py:" in l]
    print("\n".join(notes[-8:]))
    check(r.returncode == 0, f"pip install --no-build-isolation --no-index {a.source} "
          f"({time.monotonic() - t1:.1f} s) {'' if r.returncode == 0 else (r.stdout + r.stderr)[-3000:]}")
    if r.returncode != 0:
        return 1
    built = {name: os.path.exists(os.path.join(a.build_dir, *rel))
             for name, rel in (("libcachet_torch.so", ("python", "libcachet_torch.so")),
                               ("libcachet_c10.so", ("python", "c10", "libcachet_c10.so")))}

    # The command, from a neutral directory, found on PATH.
    which = shutil.which("cachet", path=env["PATH"])
    check(which == os.path.join(venv, "bin", "cachet"), f"cachet on PATH is the venv's: {which}")
    r = run(["cachet", "--version"], env=env, cwd=neutral)
    check(r.returncode == 0 and r.stdout.startswith("cachet "), f"cachet --version: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    r = run(["cachet", "check-conf", "max_split_size_mb:128"], env=env, cwd=neutral)
    check(r.returncode == 0 and "max_split_size_mb:128" in r.stdout, f"cachet check-conf: {r.stdout.strip()[-200:]}")

    # The package, from a neutral directory, without torch.
    code = ("import sys, os, cachet_torch\n"
            "print('file', cachet_torch.__file__)\n"
            "print('torch', 'torch' in sys.modules)\n"
            "print('plugin', cachet_torch.library_path() if os.path.exists(os.path.join(os.path.dirname(cachet_torch.__file__), 'libcachet_torch.so')) else None)\n"
            "print('c10', cachet_torch.c10_library_path())\n"
            "print('metrics', cachet_torch.metrics_text({'num_ooms': 2}).count('cachet_ooms_total{device=\"0\"} 2'))\n"
            "from importlib.metadata import entry_points\n"
            "print('plugins', ','.join(e.value for e in entry_points(group='vllm.general_plugins')))\n"
            "print('startup', os.path.exists(os.path.join(os.path.dirname(cachet_torch.__file__), '_startup', 'sitecustomize.py')))\n")
    r = run([py, "-c", code], env=env, cwd=neutral)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    pkg = os.path.dirname(out.get("file", ""))
    check(r.returncode == 0 and pkg.startswith(os.path.join(venv, "lib")) and pkg.endswith("site-packages/cachet_torch"),
          f"import cachet_torch from a neutral directory is the venv's: {pkg} {r.stderr.strip()[-500:]}")
    check(out.get("torch") == "False", "import cachet_torch imports no torch")
    check(out.get("metrics") == "1", "cachet_torch.metrics_text() works")
    check(out.get("plugins") == "cachet_torch.vllm_backend:register" and out.get("startup") == "True",
          f"the vllm.general_plugins entry point and configure_subprocess()'s start hook are installed "
          f"({out.get('plugins')}, {out.get('startup')})")
    for name, key in (("libcachet_torch.so", "plugin"), ("libcachet_c10.so", "c10")):
        want = os.path.join(pkg, name) if built[name] else "None"
        check(out.get(key) == want, f"{name}: {out.get(key)} (built in the tree: {built[name]}; want {want})")

    # --target DIR (the GPU machine's way, with torch's own Python): DIR/cachet_torch, DIR/bin/cachet.
    target = os.path.join(work, "target")
    r = run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--target", target,
             os.path.abspath(a.source)], env=penv, cwd=neutral)
    tenv = dict(env, PYTHONPATH=target, PATH=os.path.join(target, "bin") + os.pathsep + os.environ.get("PATH", ""))
    v = run(["cachet", "--version"], env=tenv, cwd=neutral)
    lib = run([py, "-c", "import cachet_torch; print(cachet_torch.__file__); print(cachet_torch.c10_library_path())"],
              env=tenv, cwd=neutral)
    want = [os.path.join(target, "cachet_torch", "__init__.py"),
            os.path.join(target, "cachet_torch", "libcachet_c10.so") if built["libcachet_c10.so"] else "None"]
    check(r.returncode == 0 and v.stdout.startswith("cachet ") and shutil.which("cachet", path=tenv["PATH"])
          == os.path.join(target, "bin", "cachet") and lib.stdout.split() == want,
          f"pip install --target: {target}/bin/cachet runs, the package and its libraries are there "
          f"({v.stdout.strip()}, {lib.stdout.split()}) {(r.stdout + r.stderr)[-1500:] if r.returncode else ''}")

    r = run([py, "-m", "pip", "uninstall", "-y", "cachet-torch"], env=env, cwd=neutral)
    check(r.returncode == 0 and not os.path.exists(os.path.join(venv, "bin", "cachet")) and not os.path.exists(pkg),
          f"pip uninstall removes the command and the package ({r.stderr.strip()[-300:]})")
    print(f"\n{len(check.failures)} failure(s) in {time.monotonic() - t0:.1f} s")
    if not check.failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
