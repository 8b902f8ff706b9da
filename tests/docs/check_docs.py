#!/usr/bin/env python3
"""Checks that the repository's documentation stands alone.

Usage: check_docs.py ROOT        check the tree at ROOT (exit 1 and a list of problems if any)
       check_docs.py --self-test plant one bad reference of each kind in a temporary tree and
                                 check that every one is reported (and nothing good is)

Files: `git ls-files --cached --others --exclude-standard` when ROOT is a git checkout, else every
file under ROOT except build/, .git/ and .deps/. Binary files are skipped.

Problems reported, each as FILE:LINE with how to fix it:
  link      a relative markdown link [text](path) or [text](path#anchor) whose target does not
            exist (http, https, mailto and pure #anchors are not checked; code is skipped)
  docs-path a docs/<something> path named in code or docs (.h .cpp .py .cmake CMakeLists.txt .md,
            scripts) that does not exist
  section   a § citation whose section is not in docs/pytorch-allocator.md (a heading "## N." or
            "### N.M", or item "M." of a numbered list in section N), or a § citation in a file
            that never says which document it cites
  path      a file path in markdown text (tools/x.py, tests/y.cpp: a top-level folder of the
            repository, then a file name with an extension) that does not exist
            (the "reference section N.M" form used before that document existed, is reported too)
  outside   a path outside the repository: the shared folder beside the checkout, an absolute
            path under the machine's work folder, or the old name of the allocator reference
"""
import os
import re
import subprocess
import sys
import tempfile

SPEC = "docs/pytorch-allocator.md"
SKIP_DIRS = {"build", ".git", ".deps"}
# Assembled so that this file does not report itself.
SHARED = ".." + "/shared"
WORK_ROOT = "/" + "work"
OLD_REFERENCE = "pytorch-2.11-" + "allocator"
D = "docs" + "/"  # the self-test's planted paths, kept out of this file's own check

CODE_EXT = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".py", ".cmake", ".md", ".sh",
            ".in", ".yml", ".yaml", ".toml")

LINK_RE = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DOCS_PATH_RE = re.compile(r"(?<![\w./-])docs/[A-Za-z0-9_./-]*[A-Za-z0-9_]")
TOP_DIRS = ("common", "model", "gpu", "tools", "props", "fuzz", "tests", "bench", "python",
            "scripts", "docs", "cmake")
REPO_PATH_RE = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) +
                          r")/[A-Za-z0-9_./-]*[A-Za-z0-9_])")
SECTION_RE = re.compile(r"§+\s*(\d+(?:\.\d+)?)(?:\s*[-\u2013]\s*§?\s*(\d+(?:\.\d+)?))?")
OLD_CITE_RE = re.compile(r"\b[Rr]eference(?:'s)?\s+(?:sections?\s+)?\d+(?:\.\d+)?\b")
WORK_RE = re.compile(r"(?<![\w.}\)$/-])" + re.escape(WORK_ROOT) + r"(?=/|\b)")


def list_files(root):
    """Tracked and untracked-but-not-ignored files, relative to root, '/'-separated."""
    if os.path.isdir(os.path.join(root, ".git")) or os.path.isfile(os.path.join(root, ".git")):
        try:
            out = subprocess.run(
                ["git", "-C", root, "ls-files", "-z", "--cached", "--others",
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
            rel = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
            files.append(rel)
    return files


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def is_code_or_doc(rel, text):
    base = rel.rsplit("/", 1)[-1]
    if base == "CMakeLists.txt" or rel.endswith(CODE_EXT):
        return True
    return rel.startswith("scripts/") or text.startswith("#!")


def strip_code(lines):
    """Markdown lines with fenced blocks and inline code blanked (links there are not links)."""
    out, fence = [], None
    for line in lines:
        s = line.lstrip()
        if fence is None and (s.startswith("```") or s.startswith("~~~")):
            fence = s[:3]
            out.append("")
            continue
        if fence is not None:
            if s.startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(re.sub(r"`[^`]*`", "", line))
    return out


def spec_sections(root):
    """The section numbers docs/pytorch-allocator.md defines: headings and numbered items."""
    text = read_text(os.path.join(root, SPEC))
    if text is None:
        return None
    # Items "M." of a numbered list count as N.M only directly in "## N." or under an
    # unnumbered subheading of it (as in §9, §11), not inside a numbered "### N.K".
    found, current = set(), None
    for line in strip_code(text.splitlines()):
        m = re.match(r"^(#{2,6})\s+(\d+(?:\.\d+)*)\.?\s", line)
        if m:
            number = m.group(2)
            found.add(number)
            current = number if m.group(1) == "##" else None
            continue
        if re.match(r"^##\s", line):
            current = None
            continue
        m = re.match(r"^(\d+)\.\s", line)
        if m and current is not None:
            found.add(current + "." + m.group(1))
    return found


def exists(root, rel):
    full = os.path.normpath(os.path.join(root, rel))
    if not (full == os.path.normpath(root) or full.startswith(os.path.normpath(root) + os.sep)):
        return False  # leaves the repository
    first = os.path.relpath(full, root).split(os.sep)[0]
    if first in SKIP_DIRS:
        return False  # build outputs are not part of the repository
    return os.path.exists(full)


def check(root):
    root = os.path.abspath(root)
    problems = []
    sections = spec_sections(root)

    def report(rel, lineno, kind, what, fix):
        problems.append(f"{rel}:{lineno}: [{kind}] {what}\n    fix: {fix}")

    for rel in list_files(root):
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        lines = text.splitlines()
        code_or_doc = is_code_or_doc(rel, text)

        # (d) paths outside the repository, in any text file.
        for n, line in enumerate(lines, 1):
            if SHARED in line:
                report(rel, n, "outside", f"names '{SHARED}', a folder outside the repository",
                       "describe the thing in words (e.g. 'recorded on PyTorch 2.11, H200') or "
                       "point at the copy in the repository (tests/data/, docs/)")
            if WORK_RE.search(line):
                report(rel, n, "outside", f"names an absolute path under {WORK_ROOT}",
                       "use a path relative to the repository root, or describe it in words")
            if OLD_REFERENCE in line:
                report(rel, n, "outside", f"names '{OLD_REFERENCE}.md', a document outside the "
                       "repository", f"cite {SPEC} (same section numbers)")

        # (a) relative links in markdown.
        linked = set()  # (line, path) already reported as a link
        if rel.endswith(".md"):
            md_dir = os.path.dirname(rel)
            for n, line in enumerate(strip_code(lines), 1):
                for m in LINK_RE.finditer(line):
                    target = m.group(2)
                    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                        continue
                    path = target.split("#", 1)[0].split("?", 1)[0]
                    if not path:
                        continue
                    resolved = path.lstrip("/") if path.startswith("/") else os.path.join(
                        md_dir, path)
                    if not exists(root, resolved):
                        linked.add((n, path))
                        report(rel, n, "link", f"link [{m.group(1)}]({target}): "
                               f"'{os.path.normpath(resolved)}' does not exist",
                               "point the link at a file in the repository (paths are relative "
                               "to the markdown file's folder), or remove the link")

        # (a') file paths named in markdown text: a path that starts with one of the
        # repository's top folders and names a file (has an extension) must exist, from the root
        # or from the markdown file's folder. Placeholders (NAME, ..., *) are skipped.
        if rel.endswith(".md"):
            md_dir = os.path.dirname(rel)
            for n, line in enumerate(lines, 1):
                for m in REPO_PATH_RE.finditer(line):
                    path = m.group(1)
                    last = path.rsplit("/", 1)[-1]
                    if "." not in last or "..." in path or re.search(r"(^|/)[A-Z_]+(\.|/|$)",
                                                                      path):
                        continue
                    if (n, path) in linked or path.startswith("docs/"):
                        continue  # reported as a link, or by the docs/ check below
                    if not exists(root, path) and not exists(root, os.path.join(md_dir, path)):
                        report(rel, n, "path", f"'{path}' does not exist in the repository",
                               "name a file that is in the repository, or describe the thing in "
                               "words (e.g. 'a script outside this repository')")

        if not code_or_doc:
            continue

        # (b) docs/<something> paths.
        for n, line in enumerate(lines, 1):
            for m in DOCS_PATH_RE.finditer(line):
                path = m.group(0)
                if (n, path) in linked:
                    continue
                if not exists(root, path):
                    report(rel, n, "docs-path", f"'{path}' does not exist",
                           "cite an existing file under docs/ (ls docs/), or write the missing "
                           "document")

        # (c) citations of the old outside reference by number ("reference section N.M").
        for n, line in enumerate(lines, 1):
            for m in OLD_CITE_RE.finditer(line):
                report(rel, n, "section", f"'{m.group(0)}' cites a reference that is not in the "
                       "repository", f"write it as '{SPEC} §N.M' (same section numbers)")

        # (c) § citations.
        names_spec = os.path.basename(SPEC) in text  # the path, or a link to it
        for n, line in enumerate(lines, 1):
            for m in SECTION_RE.finditer(line):
                if not names_spec:
                    report(rel, n, "section", f"'{m.group(0).strip()}' does not say which "
                           "document it cites",
                           f"write it as '{SPEC} §{m.group(1)}' (or add a line saying that "
                           f"§ numbers refer to {SPEC})")
                    continue
                if sections is None:
                    report(rel, n, "section", f"'{m.group(0).strip()}' cites {SPEC}, which "
                           "does not exist", f"restore {SPEC}")
                    continue
                for number in (m.group(1), m.group(2)):
                    if number and number not in sections:
                        report(rel, n, "section", f"§{number} is not a section of {SPEC}",
                               f"cite a section that exists (grep '^#' {SPEC}), or add it "
                               "there")
    return problems


def self_test():
    planted = {
        SPEC: "# spec\n\n## 1. One\n\n### 1.2 Two\n\n## 9. List\n\n"
                                     "1. first\n2. second\n",
        D + "ok.md": "[spec](pytorch-allocator.md#1-one) [web](https://x.org/a.md) "
                      "[anchor](#top) [up](../README.md)\n```\n[in code](missing.md)\n```\n",
        "README.md": "See [ok](" + D + "ok.md) and [bad](" + D + "missing-link.md).\n"
                     "Cited: " + SPEC + " \u00a71.2, \u00a79.2 and \u00a71.2-1.2.\n",
        "src/a.cpp": "// " + SPEC + " \u00a71.2 is fine, \u00a77.3 is not\n"
                     "// see " + D + "nowhere.md\n",
        "src/b.h": "// bare \u00a71.2 in a file that names no document\n"
                   "// (Reference " + "section 4.1)\n",
        "src/c.py": "# data in " + SHARED + "/oracle and " + WORK_ROOT + "/main/x\n"
                    "# fine: ${CMAKE_CURRENT_BINARY_DIR}" + WORK_ROOT + "/fuzz\n",
        "build/ignored.md": "[x](nowhere.md)\n",
        "tests/data/NOTES.md": "made by `tools/" + "gen_x.py` and `tests/data/NOTES.md`\n",
    }
    expected = [
        ("README.md:1:", "[link]", D + "missing-link.md"),
        ("src/a.cpp:1:", "[section]", "\u00a77.3"),
        ("src/a.cpp:2:", "[docs-path]", D + "nowhere.md"),
        ("src/b.h:1:", "[section]", "does not say which document"),
        ("src/b.h:2:", "[section]", "cites a reference that is not in the repository"),
        ("src/c.py:1:", "[outside]", SHARED),
        ("src/c.py:1:", "[outside]", "absolute path"),
        ("tests/data/NOTES.md:1:", "[path]", "tools/" + "gen_x.py"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for rel, content in planted.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(content)
        problems = check(tmp)
    ok = True
    for where, kind, what in expected:
        if not any(p.startswith(where) and kind in p and what in p for p in problems):
            print(f"self-test: expected a report {where} {kind} ... {what}; none came")
            ok = False
    if len(problems) != len(expected):
        print(f"self-test: expected {len(expected)} reports, got {len(problems)}:")
        ok = False
    for p in problems:
        print(p)
    print("self-test:", "passed" if ok else "FAILED")
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
        print(f"check_docs: {len(problems)} bad reference(s). Every path a document or comment "
              "names must exist in the repository (see tests/docs/check_docs.py).")
        return 1
    print("check_docs: every link, docs/ path and § citation resolves; nothing names a path "
          "outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
