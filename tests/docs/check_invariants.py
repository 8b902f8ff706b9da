#!/usr/bin/env python3
"""Checks docs/invariants.md, the table of invariant IDs, against the code.

Usage: check_invariants.py ROOT        check the tree at ROOT (exit 1 and a list of problems)
       check_invariants.py --self-test plant one problem of each kind in a temporary tree and
                                       check that every one is reported (and nothing in a clean one)

The table's rows are `| ID | Policy | Rule | model/ checks it | gpu/ checks it |`; a side's cell
is `—` or entries "`path` `Function`" separated by ";".

Problems reported, each with how to fix it:
  unknown    an invariant ID in a file of the repository (code, tests, READMEs, docs) that is not
             in the table, or an ID of an old scheme (INV-<n>, [C-<n>], [P<n>])
  unchecked  a row whose model/ and gpu/ cells are both empty: the rule is checked nowhere
  not-there  a side lists a file that does not exist, does not name the function, or holds no
             check whose message starts with the ID (a string literal beginning "[ID]")
  unlisted   a file of model/, gpu/ or common/ holds a check of an ID (a literal "[ID]...") but
             the ID's row does not list that file on that side
  untagged   a failure call `fail(...)` in a listed checker file whose message does not start
             with an ID
  table      docs/invariants.md is missing, has no rows, a row with a bad ID or policy, or an ID
             twice
"""
import os
import re
import subprocess
import sys
import tempfile

TABLE = "docs/invariants.md"
SKIP_DIRS = {"build", ".git", ".deps"}
SKIP_PREFIXES = ("tests/data/",)
# This file names the old schemes; it is not scanned.
SELF = "tests/docs/check_invariants.py"
SIDES = ("model", "gpu")
POLICIES = {"both", "pytorch", "cachet"}

ID = r"INV-[A-Z]+-\d+"
ROW_RE = re.compile(r"^\|\s*(" + ID + r")\s*\|(.*)\|\s*$")
# Anything shaped like an invariant ID, so that a misspelt or old one is caught too.
ANY_ID_RE = re.compile(r"(?<![\w-])INV-[A-Z0-9]+(?:-\d+)?(?![\w-])")
OLD_RE = re.compile(r"\[(?:C-\d+|P\d+)\]")
CHECK_RE = re.compile(r"\"\[(" + ID + r")\]")
ENTRY_RE = re.compile(r"`([^`]+)`\s*`([^`]+)`")
FAIL_RE = re.compile(r"(?<![\w.])fail\(\s*(?!(?:std::string\(\s*)?\"\[" + ID + r"\])")


def list_files(root):
    if os.path.exists(os.path.join(root, ".git")):
        try:
            out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                                  "--exclude-standard"], check=True, capture_output=True).stdout
            files = sorted({f for f in out.decode("utf-8", "replace").split("\0") if f})
            return [f for f in files if os.path.isfile(os.path.join(root, f))
                    and f.split("/")[0] not in SKIP_DIRS]
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if not (rel_dir == "." and d in SKIP_DIRS) and d != ".git")
        for name in sorted(filenames):
            files.append(os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/"))
    return files


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", "replace")


def parse_table(text, problems):
    rows = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = ROW_RE.match(line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        where = f"{TABLE}:{n}"
        if len(cells) != 4:
            problems.append(f"{where}: table: row {m.group(1)} has {len(cells) + 1} cells, not 5 "
                            "(ID, Policy, Rule, model/ checks it, gpu/ checks it)")
            continue
        policy, rule, model, gpu = cells
        if policy not in POLICIES:
            problems.append(f"{where}: table: {m.group(1)}'s policy is '{policy}': write one of "
                            + ", ".join(sorted(POLICIES)))
        if m.group(1) in rows:
            problems.append(f"{where}: table: {m.group(1)} has two rows: one ID, one rule")
        entries = {}
        for side, cell in zip(SIDES, (model, gpu)):
            entries[side] = ENTRY_RE.findall(cell)
            rest = ENTRY_RE.sub("", cell).replace(";", "").strip()
            if rest not in ("", "—", "-"):
                problems.append(f"{where}: table: {m.group(1)}'s {side}/ cell has '{rest}': write "
                                "`path` `Function` entries separated by ';', or —")
        rows[m.group(1)] = (n, entries)
    if not rows:
        problems.append(f"{TABLE}: table: no rows (| INV-AREA-n | policy | rule | model | gpu |)")
    return rows


def check(root):
    problems = []
    table_text = read_text(os.path.join(root, TABLE))
    if table_text is None:
        return [f"{TABLE}: table: missing; it lists every invariant ID"]
    rows = parse_table(table_text, problems)
    texts = {}
    for rel in list_files(root):
        if rel == SELF or rel.startswith(SKIP_PREFIXES):
            continue
        text = read_text(os.path.join(root, rel))
        if text is not None:
            texts[rel] = text

    # unknown: every ID written anywhere is in the table.
    for rel, text in texts.items():
        if rel == TABLE:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in ANY_ID_RE.finditer(line):
                if m.group(0) not in rows:
                    problems.append(f"{rel}:{n}: unknown: {m.group(0)} is not in {TABLE}: use an "
                                    "ID of the table, or add the rule's row there")
            for m in OLD_RE.finditer(line):
                problems.append(f"{rel}:{n}: unknown: {m.group(0)} is an old ID scheme: use the "
                                f"rule's ID of {TABLE}")

    # Which file checks which ID (a message literal starting with "[ID]").
    checks = {}  # (id, file) -> first line
    for rel, text in texts.items():
        if rel.split("/")[0] not in ("model", "gpu", "common"):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in CHECK_RE.finditer(line):
                checks.setdefault((m.group(1), rel), n)

    listed_files = set()
    for inv, (n, entries) in rows.items():
        where = f"{TABLE}:{n}"
        if not entries["model"] and not entries["gpu"]:
            problems.append(f"{where}: unchecked: {inv} is checked nowhere: list where model/ or "
                            "gpu/ checks it, or remove the row")
        for side in SIDES:
            for path, func in entries[side]:
                listed_files.add(path)
                if path.split("/")[0] != side:
                    problems.append(f"{where}: not-there: {inv}'s {side}/ cell lists {path}, "
                                    f"which is not under {side}/")
                    continue
                text = texts.get(path)
                if text is None:
                    problems.append(f"{where}: not-there: {inv}: {path} does not exist")
                    continue
                name = func.split("::")[-1]
                if not re.search(r"\b" + re.escape(name) + r"\b", text):
                    problems.append(f"{where}: not-there: {inv}: {path} has no {func}")
                if (inv, path) not in checks:
                    problems.append(f"{where}: not-there: {inv}: {path} holds no check whose "
                                    f"message starts with \"[{inv}]\": fix the cell or tag the "
                                    "check")
    for (inv, path), line in sorted(checks.items()):
        if inv not in rows:
            continue  # reported as unknown
        side = path.split("/")[0]
        side = "gpu" if side == "common" else side
        if not any(p == path for p, _ in rows[inv][1].get(side, [])):
            problems.append(f"{path}:{line}: unlisted: {path} checks {inv} but {TABLE} does not "
                            f"list it in {inv}'s {side}/ cell")

    # untagged: every failure call in a checker file starts its message with an ID.
    for path in sorted(listed_files):
        text = texts.get(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if FAIL_RE.search(line):
                problems.append(f"{path}:{n}: untagged: a failure without an ID: start its "
                                f"message with the rule's ID of {TABLE}")
    return problems


def self_test():
    table = (
        "# t\n\n| ID | Policy | Rule | model/ checks it | gpu/ checks it |\n|---|---|---|---|---|\n"
        "| INV-A-1 | both | good | `model/m.cpp` `M::check` | `gpu/g.cpp` `G::invariants` |\n"
        "| INV-A-2 | pytorch | planted: checked nowhere | — | — |\n"
        "| INV-A-3 | cachet | planted: gpu listed, not checked there | — | `gpu/g.cpp` "
        "`G::invariants` |\n"
        "| INV-A-4 | both | checked by model only | `model/m.cpp` `M::check` | — |\n")
    model_src = ('void M::check() {\n  fail("[INV-A-1]", "x");\n  fail("[INV-A-4]", "y");\n}\n')
    gpu_src = ('std::vector<std::string> G::invariants() {\n  fail("[INV-A-1] x");\n}\n')
    planted = {
        "unknown": ("gpu/README.md", "The cap rule is [INV-A-9].\n"),
        "unknown-old": ("props/README.md", "sut-invariants (INV-7); policy:cachet [C-5]\n"),
        "unlisted": ("model/other.cpp", 'void O::f() { fail("[INV-A-1]", "z"); }\n'),
        "untagged": ("gpu/g.cpp", gpu_src + 'void G::more() { fail("no id"); }\n'),
    }

    def make(d, extra):
        files = {TABLE: table, "model/m.cpp": model_src, "gpu/g.cpp": gpu_src}
        files.update(extra)
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)

    ok = True
    with tempfile.TemporaryDirectory() as d:
        make(d, {})
        got = check(d)
        # The clean tree still has the two planted rows (A-2 unchecked, A-3 not there).
        want = {"unchecked: INV-A-2", "not-there: INV-A-3"}
        for w in want:
            if not any(w in p for p in got):
                print(f"self-test: the planted '{w}' was not reported; got: {got}")
                ok = False
        if len(got) != len(want):
            print(f"self-test: expected {len(want)} problems in the base tree, got {got}")
            ok = False
    for kind, (rel, text) in planted.items():
        with tempfile.TemporaryDirectory() as d:
            make(d, {rel: text})
            got = [p for p in check(d) if "INV-A-2 is checked nowhere" not in p
                   and "not-there: INV-A-3" not in p]
            key = kind.split("-")[0] + ":"
            if not got or not all(key in p for p in got):
                print(f"self-test: planting '{kind}' in {rel} gave {got}, expected '{key}' only")
                ok = False
            if kind == "unknown-old" and len(got) != 2:
                print(f"self-test: planting '{kind}' should report INV-7 and [C-5]: {got}")
                ok = False
    with tempfile.TemporaryDirectory() as d:
        make(d, {})
        os.remove(os.path.join(d, TABLE))
        if not any("table: missing" in p for p in check(d)):
            print("self-test: a missing table was not reported")
            ok = False
    print("self-test: " + ("every planted problem was reported" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    problems = check(argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s): {TABLE} and the code disagree")
        return 1
    print(f"{TABLE}: every invariant ID is in the table and checked where it says")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
