#!/usr/bin/env python3
"""Issue 35, done-when 3: the OOM doctor walked through as a new user would, on the repository's
traces (tests/data), with the exact line each point of the issue names.

1. The README's OOM section ("My run ran out of memory: what now?"): each `$ cachet ...` block is
   run from a scratch folder where tests/ is the repository's, and must print exactly the lines the
   README shows (stderr for a command that exits 2; the recorded script's folder shortened to
   "..."; trailing spaces dropped). This is the one place the README's worked example is compared;
   `--write` regenerates the blocks from the commands' current output instead of failing.
2. The issue's list, command by command: one pick from tune and explain; a verdict for a run that
   never failed; sizes refused with "did you mean"; readable sites (a ResNet-18 snapshot with C++
   frames); figures that say which moment and which bytes; check-conf's advice for an environment
   variable's name and for the empty string; plot and summary of a capped trace without --cap;
   --conf; plot --from/--to. Expected figures come from PyTorch's own recordings where one has them
   (tests/data/oracle/snapshots/*.json, PyTorch's out-of-memory message in the README).

    new_user_walkthrough.py CACHET REPO_ROOT [--write]"""
import json
import os
import re
import subprocess
import sys
import tempfile

cachet, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
write = "--write" in sys.argv[3:]
fails = 0
scratch = tempfile.mkdtemp(prefix="cachet_walkthrough_")
os.symlink(os.path.join(root, "tests"), os.path.join(scratch, "tests"))
SNAP = "tests/data/oracle/snapshots/"
GPT2 = SNAP + "gpt2_train_oom_cap12g.pickle.gz"
MLP = SNAP + "mlp_train.pickle.gz"
RESNET = SNAP + "resnet18_cxx.pickle.gz"


def check(cond, what, detail=""):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails += 1
        if detail:
            print("     " + detail.replace("\n", "\n     "))


def run(args):
    """`cachet ARGS` (a shell word list as a string) from the scratch folder."""
    r = subprocess.run(cachet + " " + args, shell=True, cwd=scratch, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def flat(text):
    """The text with lines joined by spaces (the verdict paragraph wraps at 100 columns)."""
    return " ".join(text.split())


def paragraph(text, head):
    at = text.find(head)
    if at < 0:
        return f"(no paragraph starting {head!r})"
    end = text.find("\n\n", at)
    return flat(text[at:end if end >= 0 else len(text)])


def has_line(text, line, what):
    check(line in text.split("\n"), what, f"expected the line: {line!r}\nin:\n{text}")


# --- 1. the README's worked example ---------------------------------------------------------------

def shorten(out):
    """The recorded script's folder shortened to '...', as the README shows it; trailing spaces off."""
    out = re.sub(r"(?<= )\S*/(oom_gpt2\.py)", r".../\1", out)
    return "".join(line.rstrip() + "\n" for line in out.split("\n")[:-1]) + (out.split("\n")[-1].rstrip())


readme_path = os.path.join(root, "README.md")
readme = open(readme_path).read()
start = readme.find("## My run ran out of memory: what now?")
check(start >= 0, "README: the OOM section is there")
end = readme.find("\n## ", start + 5)
section = readme[start:end]
blocks = list(re.finditer(r"\n   \$ cachet (?P<args>[^\n]*)\n(?P<body>.*?)\n   ```", section, re.S))
check(len(blocks) == 3, f"README: three command blocks in the OOM section ({len(blocks)}): explain, explain --cap, report")
new_section, last = "", 0
for b in blocks:
    rc, out, err = run(b["args"])
    got = shorten(err if rc == 2 else out)
    body = "\n".join("   " + line if line else "" for line in got.rstrip("\n").split("\n"))
    want = "\n".join(line[3:] if line.startswith("   ") else line for line in b["body"].split("\n"))
    if write:
        new_section += section[last:b.start("body")] + body
        last = b.end("body")
    else:
        check(got.rstrip("\n") == want, f"README: `cachet {b['args']}` prints what the README shows",
              "README:\n" + want + "\n--- the command:\n" + got)
if write:
    new_section += section[last:]
    if new_section != section:
        open(readme_path, "w").write(readme[:start] + new_section + readme[end:])
        print("wrote README.md: the OOM section's blocks regenerated")
    else:
        print("README.md: the OOM section's blocks are the commands' output already")
    sys.exit(0)

# --- 2. the list ----------------------------------------------------------------------------

# One pick: explain's recommended change is tune's pick, not the change with the fewest keys.
rc, out, err = run(f"tune {GPT2} --cap 12G --json")
tj = json.loads(out)
rc, eout, err = run(f"explain {GPT2} --cap 12G --json")
ej = json.loads(eout)
check(tj["results"][tj["pick"]]["conf"] == ej["recommendation"]["conf"] == "policy:cachet",
      "one pick: tune's and explain's are policy:cachet (GPT-2 under 12 GiB: only the plug-in avoids it)")
rc, out, err = run(f"replay {GPT2} --cap 12G --json")
check(rc == 0 and json.loads(out)[0].get("verdict") == tj["verdict"], "one verdict: replay --json carries tune's verdict")

# A verdict for a run that never failed: mlp_train fits without a cap; under 150 MiB only the replay fails.
rc, out, err = run(f"replay {MLP}")
check(paragraph(out, "Verdict for").startswith(
    "Verdict for the recorded configuration (PyTorch's defaults) with no device limit (the device's memory is not "
    "known: --device-memory gives it): it fits, no out-of-memory."), "verdict: a run with no OOM and no cap fits",
    out)
rc, out, err = run(f"replay {MLP} --cap 150M")
check("it does not fit" in paragraph(out, "Verdict for") and
      "The recorded run never ran out of memory: this is the replay under the limit given." in paragraph(out, "Verdict for"),
      "verdict: a recorded run that never failed, under a cap where the replay does, is said to have never failed", out)

# Sizes with units: never guessed.
tail = (" (a size without a suffix is in bytes; K, M, G and T are powers of 1024; no cap or device is under 1 MiB)\n")
rc, out, err = run(f"replay {GPT2} --cap 8")
check(rc == 2 and err == "cachet replay: --cap: '8' is 8 bytes: did you mean 8G?" + tail, "sizes: --cap 8 is refused, 'did you mean 8G?'", err)
rc, out, err = run(f"replay {GPT2} --cap 1.5")
check(rc == 2 and err == "cachet replay: --cap: '1.5' is 1.5 bytes: did you mean 1.5G?" + tail,
      "sizes: --cap 1.5 is refused, 'did you mean 1.5G?'", err)
rc, out, err = run(f"replay {GPT2} --cap 8GB")
check(rc == 2 and err.startswith("cachet replay: --cap: '8GB': GB is ambiguous (powers of 1000 or of 1024?): write 8G or 8GiB"),
      "sizes: --cap 8GB is refused as ambiguous", err)

# Readable sites: the ResNet-18 snapshot recorded with C++ frames (stacks="all").
rc, out, err = run(f"explain {RESNET} --cap 2G")
sites = out[out.find("Allocation sites"):].split("\n\n")[0].split("\n")[1:]
check(len(sites) >= 3 and not any("torch::unwind" in s or "??" in s or " c10::" in s or " at::" in s for s in sites),
      f"sites: explain's {len(sites)} allocation sites on resnet18_cxx name no PyTorch C++ frame", "\n".join(sites))
check(any(".py:" in s for s in sites) and any("(autograd's backward" in s for s in sites),
      "sites: Python lines, and the backward thread's blocks by their autograd node", "\n".join(sites))

# Figures that say which moment and which bytes.
rc, out, err = run(f"explain {MLP}")
has_line(out, "Memory at peak reserved (trace event 204; allocated and requested as they were then, not their own peaks):",
         "figures: explain's moment of peak reserved says its figures are of that moment")
rc, out, err = run(f"explain {GPT2} --cap 12G")
has_line(out, "Memory when it failed (trace event 5754: that moment's figures; the run's peak reserved is the verdict's):",
         "figures: explain's figures at the out-of-memory say which moment")
# PyTorch's message: "Of the allocated memory 10.40 GiB is allocated by PyTorch, and 1.47 GiB is
# reserved by PyTorch but unallocated".
check(re.search(r"\n  allocated   10\.40 GiB +\d+ bytes \(blocks in use\)\n", out) is not None and
      "Where the 1.47 GiB reserved but not allocated was" in out,
      "figures: explain's allocated and reserved-but-unallocated at the failure are PyTorch's 10.40 and 1.47 GiB", out)
rc, out, err = run(f"trace-info {GPT2}")
check(" bytes requested), " in out, "figures: trace-info's live bytes say they are requested bytes", out)

# check-conf: an environment variable's name, and the empty string.
rc, out, err = run("check-conf 'PYTORCH_NO_CUDA_MEMORY_CACHING=1'")
check(rc == 2 and err.startswith("error: PYTORCH_NO_CUDA_MEMORY_CACHING is an environment variable of its own, not an "
                                 "option of the configuration string: set it in the environment"),
      "check-conf: PYTORCH_NO_CUDA_MEMORY_CACHING=1 is told to go in the environment", err)
check("did you mean" not in err and "docs/configuration.md" not in err, "check-conf: ... with no far-fetched suggestion", err)
rc, out, err = run("check-conf PYTORCH_CUDA_ALLOC_CONF")
check(rc == 2 and "give its value, e.g. cachet check-conf \"$PYTORCH_CUDA_ALLOC_CONF\"" in err,
      "check-conf: the variable's name is told to give its value", err)
rc, out, err = run("check-conf ''")
check(rc == 0 and out == "\n" and err == "(default: PyTorch's defaults)\n",
      "check-conf '': stdout the canonical form (empty), stderr '(default: PyTorch's defaults)'", repr((out, err)))

# A capped trace without --cap: plot and summary draw it and say what they could not judge.
svg = os.path.join(scratch, "w.svg")
for cmd in (f"plot {GPT2} -o {svg}", f"summary {GPT2}"):
    rc, out, err = run(cmd)
    check(rc == 0 and "no --cap was given: replayed without a cap" in err and
          "what the cap would have done (the out-of-memory, the headroom) is not judged here" in err,
          f"{cmd.split()[0]} of a capped trace without --cap draws it and says what it did not judge", err)

rc, out, err = run(f"summary {GPT2}")
has_line(out, "memory cap: none (replayed without one; --cap gives it)", "summary names the cap it used: none")
rc, out, err = run(f"summary {GPT2} --cap 12G")
has_line(out, "memory cap: 12.00 GiB = 12884901888 bytes (set_per_process_memory_fraction, --cap)",
         "summary names the cap it used: PyTorch's 12.00 GiB allowed")

# No configuration avoids the out-of-memory under 11 GiB: explain says so and still names tune's pick.
rc, out, err = run(f"explain {GPT2} --cap 11G")
check("  none of them avoids it.\n  cachet tune's pick still runs out of memory, with the fewest requests that fail" in out,
      "explain: nothing avoids it, said plainly, and tune's pick named", out)

# --conf: the verdict is for the given configuration.
rc, out, err = run(f"tune {GPT2} --cap 12G --conf expandable_segments:True")
check(paragraph(out, "Verdict for").startswith("Verdict for the given configuration 'expandable_segments:True' under the "
                                               "cap of 12.00 GiB: it does not fit"),
      "--conf: tune's verdict is for the given configuration", out)

# plot --from/--to: a window, the out-of-memory marked in it.
rc, out, err = run(f"plot {GPT2} --cap 12G -o {svg} --from 5754 --to 5851")
w = open(svg).read() if rc == 0 else ""
check("window 5754 to 5851" in w and '<g id="ooms">' in w, "plot --from/--to: the window, its out-of-memory marked", err)

print(f"new_user_walkthrough: {fails} failed")
sys.exit(1 if fails else 0)
