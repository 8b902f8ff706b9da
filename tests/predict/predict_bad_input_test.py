#!/usr/bin/env python3
"""Bad input to `cachet predict` exits 2 and says what was wrong (tests/predict/CMakeLists.txt).

    predict_bad_input_test.py CACHET (with-fake-device | without-fake-device)

Without the fake device (a build with no CUDA Toolkit headers) the cases that reach the capture
expect predict to say that libcachet_fakecuda.so is missing instead."""
import os
import subprocess
import sys
import tempfile

cachet = sys.argv[1]
fake = len(sys.argv) < 3 or sys.argv[2] == "with-fake-device"
fails = 0
script = os.path.join(tempfile.mkdtemp(), "train.py")
open(script, "w").write("print('never run')\n")
# A Python without torch: a fresh interpreter with no site-packages (-S does not pass through an
# exec; an empty PYTHONPATH and -I are enough only where torch is not installed system-wide).
no_torch = os.path.join(tempfile.mkdtemp(), "python-without-torch")
with open(no_torch, "w") as f:
    f.write("#!/bin/sh\nexec %s -S \"$@\"\n" % sys.executable)
os.chmod(no_torch, 0o755)
cases = [
    (["--gpu", "X100", "--", script], "--gpu X100: not a GPU cachet knows", "NVIDIA H200"),
    (["--", script], "name the target GPU: --gpu NAME, or --device-memory BYTES with --arch sm_XY", "Tesla T4"),
    (["--gpu", "H100", "--cap", "8", "--", script], "--cap 8: '8' is 8 bytes: did you mean 8G?", None),
    (["--gpu", "H100", "--cap", "1.5", "--", script], "--cap 1.5: '1.5' is 1.5 bytes: did you mean 1.5G?", None),
    (["--gpu", "H100", "--cap", "8GB", "--", script], "GB is ambiguous", None),
    (["--gpu", "H100", "--cap", "100G", "--", script], "--cap 100G: more than the allocator can have on this GPU", None),
    (["--device-memory", "24G", "--", script], "name the target GPU", None),
    (["--device-memory", "24G", "--arch", "sm_42", "--", script], "--arch sm_42: not a CUDA architecture", None),
    (["--gpu", "H100", "--device-memory", "24G", "--", script], "--gpu names the device; leave out --device-memory", None),
    (["--gpu", "H100"], "no program: give it after --", None),
    (["--gpu", "H100", "--", "/nonexistent/train.py"], "/nonexistent/train.py: no such script", None),
    (["--gpu", "H100", "--conf", "max_split_size_mb:abc", "--", script], "--conf 'max_split_size_mb:abc'", None),
    (["--gpu", "H100", "--python", "/nonexistent/python3", "--", script],
     "give the Python that has torch with --python" if fake else "libcachet_fakecuda.so not found", None),
]
probe = subprocess.run([no_torch, "-c", "import torch"], capture_output=True)
if probe.returncode != 0:
    cases.append((["--gpu", "H100", "--python", no_torch, "--", script],
                  "cannot import torch" if fake else "libcachet_fakecuda.so not found", "--python" if fake else None))
for args, want, also in cases:
    r = subprocess.run([cachet, "predict", *args], capture_output=True, text=True, timeout=60)
    ok = r.returncode == 2 and want in r.stderr and (also is None or also in r.stderr) and not r.stdout.strip()
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {' '.join(args)}: exit {r.returncode}: {r.stderr.strip().splitlines()[0] if r.stderr.strip() else ''}")
print(f"predict_bad_input_test: {len(cases) - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
