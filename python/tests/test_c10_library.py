#!/usr/bin/env python3
"""The c10 backend library without a GPU and without torch (ctest cachet_c10_library, label unit).

  * libcachet_c10.so exports the C entry points python/cachet_torch/ calls (nm -D): the
    cachet_c10_* functions and the same cachet_torch_* functions as the plug-in, and no C++
    symbol of cachet or fmt;
  * it links libc10 and libc10_cuda (by SONAME) and the CUDA runtime, never libcuda;
  * it dlopens on a machine without a driver (libc10 and libc10_cuda from the torch it was built
    against, through its build-tree run path);
  * cachet_c10_torch_version() is the torch major.minor it was built for;
  * cachet_c10_install() refuses another minor version with a message naming both versions,
    refuses a bad configuration with the parser's message, and otherwise installs cachet as
    c10's CUDA allocator (no CUDA call is needed for that), once: a second call is a no-op.

Each case runs in a fresh interpreter: the library reads the environment once.

usage: test_c10_library.py --lib path/to/libcachet_c10.so --torch-version 2.11 [--nm nm]
"""
import argparse
import os
import subprocess
import sys
import textwrap

import preamble

check = preamble.Checks()
failures = check.failures

# The cachet_torch_* functions python/cachet_torch/ calls in both libraries (plugin.cpp adds
# cachet_torch_pool_callback, which only the plug-in path needs).
SHARED = ("cachet_torch_init", "cachet_torch_config_error", "cachet_torch_last_error",
          "cachet_torch_string_free", "cachet_torch_record_stream", "cachet_torch_empty_cache",
          "cachet_torch_set_memory_fraction", "cachet_torch_record_history",
          "cachet_torch_clear_trace", "cachet_torch_device_count", "cachet_torch_has_device",
          "cachet_torch_stats_json", "cachet_torch_reset_peak_stats",
          "cachet_torch_reset_accumulated_stats", "cachet_torch_summary",
          "cachet_torch_snapshot_json", "cachet_torch_trace_json", "cachet_torch_settings_json",
          "cachet_torch_release_backup_buffers", "cachet_torch_begin_thread_pool",
          "cachet_torch_end_thread_pool")
C10 = ("cachet_c10_torch_version", "cachet_c10_install", "cachet_c10_installed", "cachet_c10_bench_select")

PRELUDE = """
import ctypes, os
lib = ctypes.CDLL(os.environ["CACHET_C10_LIB"])
lib.cachet_c10_torch_version.restype = ctypes.c_char_p
lib.cachet_c10_install.restype = ctypes.c_int
lib.cachet_c10_install.argtypes = [ctypes.c_char_p]
lib.cachet_c10_installed.restype = ctypes.c_int
lib.cachet_torch_last_error.restype = ctypes.c_void_p
lib.cachet_torch_string_free.argtypes = [ctypes.c_void_p]
def last_error():
    p = lib.cachet_torch_last_error()
    s = ctypes.string_at(p).decode()
    lib.cachet_torch_string_free(p)
    return s
"""


def run_py(code, env_extra, lib):
    env = preamble.child_env()
    env.update(env_extra)
    env["CACHET_C10_LIB"] = lib
    return subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)],
                          env=env, capture_output=True, text=True, timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--torch-version", required=True, help="major.minor the library was built for")
    ap.add_argument("--nm", default="nm")
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)
    built = a.torch_version
    major, minor = (int(x) for x in built.split("."))
    other = f"{major}.{minor + 1}.0"

    # 1. exported symbols
    syms = preamble.library_symbols(lib, a.nm)
    if syms is not None:
        for s in C10 + SHARED:
            check(syms.get(s) == "T", f"nm -D: {s} is an exported function")
        leaked = preamble.leaked_cxx_symbols(syms)
        check(not leaked, f"nm -D: no C++ symbols of cachet or fmt exported ({leaked[:3]})")
    else:
        check(False, "nm not found")
    dyn = preamble.dynamic_section(lib)
    if dyn is not None:
        check("libcuda.so" not in dyn, "readelf -d: libcuda is not a dependency")
        for dep in ("libc10.so", "libc10_cuda.so", "libcudart"):
            check(f"[{dep}" in dyn, f"readelf -d: {dep} is a dependency")

    # 2. dlopen without a GPU; the version it was built for
    r = run_py("""
        print("version:", lib.cachet_c10_torch_version().decode())
        print("installed:", lib.cachet_c10_installed())
        """, {}, lib)
    check(r.returncode == 0, f"dlopen without a GPU (rc {r.returncode}) {r.stderr.strip()[-300:]}")
    check(f"version: {built}\n" in r.stdout, f"cachet_c10_torch_version() is {built}: {r.stdout.strip()}")
    check("installed: 0" in r.stdout, "not installed before cachet_c10_install")

    # 3. another minor version is refused, naming both
    r = run_py(f"""
        print("rc:", lib.cachet_c10_install(b"{other}+cu130"))
        print("error:", last_error())
        print("installed:", lib.cachet_c10_installed())
        """, {}, lib)
    check("rc: 1" in r.stdout, f"cachet_c10_install('{other}+cu130') fails: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    check(f"PyTorch {built} " in r.stdout and f"PyTorch {other}+cu130 is running" in r.stdout,
          f"the message names both versions: {r.stdout.strip()}")
    check("installed: 0" in r.stdout, "a refused install installs nothing")
    # the major version counts too, and a version with a longer minor is no prefix match
    r = run_py(f"""
        print("rc:", lib.cachet_c10_install(b"{major + 1}.{minor}.0"), lib.cachet_c10_install(b"{built}1.0"),
              lib.cachet_c10_install(b""))
        """, {}, lib)
    check("rc: 1 1 1" in r.stdout, f"{major + 1}.{minor}.0, {built}1.0 and '' are refused: {r.stdout.strip()}")

    # 4. a bad configuration is refused with the parser's message
    r = run_py(f"""
        print("rc:", lib.cachet_c10_install(b"{built}.0"))
        print("error:", last_error())
        print("installed:", lib.cachet_c10_installed())
        """, {"CACHET_ALLOC_CONF": "max_split_size_mb:banana"}, lib)
    check("rc: 1" in r.stdout and "max_split_size_mb" in r.stdout and "banana" in r.stdout,
          f"a bad CACHET_ALLOC_CONF is refused with the parser's message: {r.stdout.strip()} {r.stderr.strip()[-200:]}")
    check("installed: 0" in r.stdout, "a refused configuration installs nothing")
    r = run_py(f"""
        print("rc:", lib.cachet_c10_install(b"{built}.0"))
        print("error:", last_error())
        """, {"PYTORCH_CUDA_ALLOC_CONF": "cachet_validate:True"}, lib)
    check("rc: 1" in r.stdout and "cachet_validate" in r.stdout,
          f"cachet-only keys are refused in PYTORCH_CUDA_ALLOC_CONF: {r.stdout.strip()}")

    # 5. the running version it was built for: installed (before any CUDA call), once
    r = run_py(f"""
        print("rc:", lib.cachet_c10_install(b"{built}.0+cu130"))
        print("installed:", lib.cachet_c10_installed())
        print("again:", lib.cachet_c10_install(b"{built}.3"))
        print("installed:", lib.cachet_c10_installed())
        """, {"CACHET_ALLOC_CONF": "max_split_size_mb:256"}, lib)
    check(r.returncode == 0 and r.stdout.count("installed: 1") == 2 and "rc: 0" in r.stdout
          and "again: 0" in r.stdout,
          f"cachet_c10_install('{built}.0+cu130') installs, a second call is a no-op: "
          f"{r.stdout.strip()} {r.stderr.strip()[-300:]}")

    # 6. the bench-only switch (bench/c10_empty.py --in-process): refused before install; after it,
    # PyTorch's atomic goes to the replaced allocator and back
    r = run_py(f"""
        print("before:", lib.cachet_c10_bench_select(0))
        print("error:", last_error())
        print("rc:", lib.cachet_c10_install(b"{built}.0"))
        print("native:", lib.cachet_c10_bench_select(1), lib.cachet_c10_installed())
        print("cachet:", lib.cachet_c10_bench_select(0), lib.cachet_c10_installed())
        """, {}, lib)
    check(r.returncode == 0 and "before: 1" in r.stdout
          and "error: cachet_c10_bench_select: cachet is not PyTorch's CUDA allocator (install it first)" in r.stdout
          and "native: 0 0" in r.stdout and "cachet: 0 1" in r.stdout,
          f"cachet_c10_bench_select is refused before install, then switches both ways: "
          f"{r.stdout.strip()} {r.stderr.strip()[-300:]}")

    print(f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
