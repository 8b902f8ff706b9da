#!/usr/bin/env python3
"""The cachet_torch package without torch and without a library (ctest cachet_torch_package, label
unit): `import cachet_torch` imports no torch (with a stand-in torch on the path that fails
loudly when imported), every name of __all__ is there, the shared state (_lib_path, _backend) is
read where it lives, and library_path() names the places it looked at when there is no library.
Each case runs in a fresh interpreter, python/ first on PYTHONPATH.
"""
import os
import subprocess
import sys
import tempfile
import textwrap

import preamble

check = preamble.Checks()


def run_py(code, env_extra=None):
    env = preamble.child_env()
    for k in ("CACHET_TORCH_LIB", "CACHET_C10_LIB"):
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tempfile.gettempdir())


def main():
    # A torch that raises when imported: the package must not touch it.
    stand_in = tempfile.mkdtemp(prefix="cachet-no-torch-")
    os.makedirs(os.path.join(stand_in, "torch"))
    with open(os.path.join(stand_in, "torch", "__init__.py"), "w") as f:
        f.write("raise RuntimeError('torch imported')\n")
    env = {"PYTHONPATH": preamble.PYDIR + os.pathsep + stand_in}
    r = run_py("""
        import sys
        import cachet_torch
        assert "torch" not in sys.modules, "torch was imported"
        missing = [n for n in cachet_torch.__all__ if not hasattr(cachet_torch, n)]
        assert not missing, missing
        assert cachet_torch._lib_path is None and cachet_torch._backend is None
        assert cachet_torch.backend() is None and not cachet_torch.installed()
        print("file", cachet_torch.__file__)
        print("ok", len(cachet_torch.__all__))
    """, env)
    check(r.returncode == 0 and "ok " in r.stdout,
          f"import cachet_torch imports no torch, has every name of __all__: {r.stdout.strip()} {r.stderr[-2000:]}")
    want = os.path.join(preamble.PYDIR, "cachet_torch", "__init__.py")
    check(f"file {want}\n" in r.stdout, f"cachet_torch is the package {want}")

    r = run_py("""
        import cachet_torch
        try:
            cachet_torch._no_such_name
        except AttributeError as e:
            print("AttributeError", e)
    """, env)
    check("AttributeError module 'cachet_torch' has no attribute '_no_such_name'" in r.stdout,
          f"an unknown attribute is an AttributeError: {r.stdout.strip()} {r.stderr[-500:]}")

    # library_path() with CACHET_TORCH_LIB naming nothing: FileNotFoundError that names it.
    r = run_py("""
        import cachet_torch
        try:
            cachet_torch.library_path()
        except FileNotFoundError as e:
            print("FNF", e)
    """, {**env, "CACHET_TORCH_LIB": "/nonexistent/libcachet_torch.so"})
    check("FNF CACHET_TORCH_LIB=/nonexistent/libcachet_torch.so: no such file" in r.stdout,
          f"CACHET_TORCH_LIB naming no file: {r.stdout.strip()} {r.stderr[-500:]}")

    # Without it, the places looked at: inside the package, next to it, the checkout's build trees.
    r = run_py('''
        import cachet_torch._library as L
        print("\\n".join(L._find_library("libnone.so", "CACHET_NONE_LIB", "none", None)[1]))
    ''', env)
    root = os.path.dirname(preamble.PYDIR)
    want = [os.path.join(preamble.PYDIR, "cachet_torch", "libnone.so"), os.path.join(preamble.PYDIR, "libnone.so"),
            os.path.join(root, "build", "default", "python", "libnone.so")]
    got = r.stdout.split()
    check(all(w in got for w in want) and got.index(want[0]) < got.index(want[1]) < got.index(want[2]),
          f"the library is looked for in the package, beside it, then in build trees: {got} {r.stderr[-500:]}")

    print(f"\n{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
