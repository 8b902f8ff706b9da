"""`pip install --no-build-isolation .` (python/README.md, "pip"): builds cachet with CMake and
packs the cachet_torch package, libcachet_torch.so and libcachet_c10.so (inside the package, where
cachet_torch looks first after an explicit path) and the `cachet` command (the environment's bin/).

The torch built against: the torch importable by this Python (found without importing it), else
$CACHET_TORCH_DIR, else what CMake finds (python/c10/CMakeLists.txt: the shared folder's
torch-2.11 beside the checkout). Without the CUDA Toolkit only the command and the package are
installed (CMake says why). The build tree is build/pip-<python> of the checkout (Release, no tests,
no benchmarks, installed stripped); CACHET_BUILD_DIR=DIR takes the command and the libraries from
a tree already built instead, without configuring or building it (CI: the tree its tests run in).
CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs; CMAKE_CXX_COMPILER_LAUNCHER (ccache) is passed on.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.install_scripts import install_scripts
from distutils.command.build_scripts import build_scripts  # noqa: E402 (setuptools' own copy)

ROOT = os.path.dirname(os.path.abspath(__file__))
_built = {}


def _log(msg):
    print(f"cachet setup.py: {msg}", file=sys.stderr, flush=True)


def _version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(cachet VERSION ([0-9.]+)", text).group(1)


def _torch_dir():
    """(directory, where from) of the torch to build against, or (None, why)."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        return os.path.dirname(spec.origin), f"the torch importable by {sys.executable}"
    env = os.environ.get("CACHET_TORCH_DIR")
    if env:
        return env, "CACHET_TORCH_DIR"
    return None, f"no torch importable by {sys.executable} and no CACHET_TORCH_DIR: CMake looks for one"


def _run(cmd, **kw):
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def cmake_build():
    """Configures (unless CACHET_BUILD_DIR), builds and installs into a staging prefix; returns
    {"cachet": path, "libcachet_torch.so": path or None, "libcachet_c10.so": path or None,
    "libcachet_fakecuda.so": path or None (cachet predict's fake device)}."""
    if _built:
        return _built
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cachet: cmake is not on PATH (Debian: scripts/bootstrap, or apt-get install cmake ninja-build g++)")
    given = os.environ.get("CACHET_BUILD_DIR")
    if given:
        bdir = os.path.abspath(given)
        if not os.path.exists(os.path.join(bdir, "CMakeCache.txt")):
            raise RuntimeError(f"cachet: CACHET_BUILD_DIR={given} is not a configured CMake build tree")
        _log(f"using the build tree {bdir} as it is (CACHET_BUILD_DIR: not configured or built again)")
    else:
        tag = f"{sys.implementation.name}{sys.version_info[0]}{sys.version_info[1]}"
        bdir = os.path.join(ROOT, "build", f"pip-{tag}")
        torch_dir, why = _torch_dir()
        _log(f"torch for the c10 backend: {torch_dir or '-'} ({why})")
        cmd = [cmake, "-S", ROOT, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release", "-DCACHET_BUILD_TESTS=OFF",
               "-DCACHET_BUILD_BENCH=OFF", "-DCACHET_MUTANTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}",
               f"-DCACHET_TORCH_DIR={torch_dir or ''}"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(bdir, "CMakeCache.txt")):
            cmd += ["-G", "Ninja"]
        for launcher in ("CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_C_COMPILER_LAUNCHER"):
            if os.environ.get(launcher):
                cmd.append(f"-D{launcher}={os.environ[launcher]}")
        _run(cmd)
    listing = os.path.join(bdir, "pip-targets.txt")
    if not os.path.exists(listing):
        raise RuntimeError(f"cachet: {listing} is missing: configure {bdir} again with this checkout's CMakeLists.txt")
    targets = [t for t in open(listing).read().split() if t]
    if not given:
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        _run([cmake, "--build", bdir, "-j", jobs, "--target", *targets])
    # Each directory's install rules alone (the command's, the PyTorch libraries'), into a staging
    # prefix: the installed run paths, nothing else of the tree built or installed.
    stage = os.path.join(bdir, "pip-stage")
    shutil.rmtree(stage, ignore_errors=True)
    for sub in ("tools", "python"):
        script = os.path.join(bdir, sub, "cmake_install.cmake")
        if os.path.exists(script):
            _run([cmake, f"-DCMAKE_INSTALL_PREFIX={stage}", "-DCMAKE_INSTALL_DO_STRIP=1", "-P", script])
    found = {"cachet": None, "libcachet_torch.so": None, "libcachet_c10.so": None, "libcachet_fakecuda.so": None,
             "libcachet_fakecudnn.so": None}
    for dirpath, _, files in os.walk(stage):
        for f in files:
            if f in found and found[f] is None:
                found[f] = os.path.join(dirpath, f)
    if found["cachet"] is None:
        raise RuntimeError(f"cachet: the cachet command was not installed into {stage}"
                           + (f" (build the targets {' '.join(targets)} of {bdir} first)" if given else ""))
    _log("built: " + ", ".join(f"{k} ({v})" if v else f"{k} (not built: see CMake's messages)"
                              for k, v in found.items()))
    _built.update(found)
    return _built


class BuildPy(build_py):
    """The package, and the libraries inside it."""

    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "cachet_torch")
        for name in ("libcachet_torch.so", "libcachet_c10.so", "libcachet_fakecuda.so", "libcachet_fakecudnn.so"):
            path = cmake_build()[name]
            if os.path.exists(os.path.join(out, name)):  # never a library of an earlier build
                os.remove(os.path.join(out, name))
            if path:
                self.copy_file(path, os.path.join(out, name), preserve_mode=True)


class BuildScripts(build_scripts):
    """The `cachet` command, an ELF binary: copied as it is (no #! rewriting)."""

    def finalize_options(self):
        super().finalize_options()
        self.scripts = []  # none from the source tree: the one script is built

    def get_source_files(self):
        return []

    def run(self):
        shutil.rmtree(self.build_dir, ignore_errors=True)  # never a command of an earlier build
        self.mkpath(self.build_dir)
        target = os.path.join(self.build_dir, "cachet")
        self.copy_file(cmake_build()["cachet"], target, preserve_mode=True)
        os.chmod(target, 0o755)


class InstallScripts(install_scripts):
    """Installs what BuildScripts built (setuptools' own installs only `scripts=` from the source
    tree, and writes entry-point wrappers, of which there are none)."""

    def run(self):
        self.run_command("build_scripts")
        self.outfiles = self.copy_tree(self.build_dir, self.install_dir)
        for f in self.outfiles:
            os.chmod(f, 0o755)


class NativeDistribution(Distribution):
    """Native code inside: a platform wheel, and the command among its scripts."""

    def has_ext_modules(self):
        return True

    def has_scripts(self):
        return True


os.makedirs(os.path.join(ROOT, "build", "setuptools"), exist_ok=True)
setup(
    version=_version(),
    distclass=NativeDistribution,
    package_dir={"": "python"},
    packages=["cachet_torch"],
    package_data={"cachet_torch": ["_startup/sitecustomize.py"]},
    cmdclass={"build_py": BuildPy, "build_scripts": BuildScripts, "install_scripts": InstallScripts},
    options={"build": {"build_base": os.path.join("build", "setuptools")},
             "egg_info": {"egg_base": os.path.join("build", "setuptools")}},
    zip_safe=False,
)
