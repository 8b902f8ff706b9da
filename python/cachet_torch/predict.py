"""`python3 -m cachet_torch.predict ARGS...` is `cachet predict ARGS...` (docs/predict.md): it finds
the `cachet` command and runs it with this Python as the capture's (unless --python is given).
Importing this module never imports torch."""
from __future__ import annotations

import os
import shutil
import sys


def find_cachet() -> str | None:
    """$CACHET_BIN, else `cachet` on PATH, else beside an installation of this package
    (PREFIX/lib/cachet/python/cachet_torch -> PREFIX/bin/cachet), else the build trees of a source
    checkout (build/*/tools/cachet)."""
    env = os.environ.get("CACHET_BIN")
    if env:
        return env
    found = shutil.which("cachet")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    prefix = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
    candidates = [os.path.join(prefix, "bin", "cachet")]
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    build = os.path.join(repo, "build")
    if os.path.isdir(build):
        candidates += [os.path.join(build, d, "tools", "cachet") for d in sorted(os.listdir(build))]
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cachet = find_cachet()
    if cachet is None:
        print("cachet_torch.predict: the `cachet` command was not found: put it on PATH or set CACHET_BIN",
              file=sys.stderr)
        return 2
    args = [cachet, "predict"]
    if "--python" not in argv[: argv.index("--") if "--" in argv else len(argv)]:
        args += ["--python", sys.executable]
    os.execv(cachet, args + argv)
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
