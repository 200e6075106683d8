#!/usr/bin/env python3
"""Every doc page the code and the docs name exists: a comment that says "docs/planner.md" where
no such page is sends its reader nowhere. Run by scripts/lint.sh.

Reads the text files (.cpp .h .inc .py .sh .md .txt .cmake .toml CMakeLists.txt) under src/,
tests/, scripts/, docs/ and examples/, and README.md and CONTRIBUTING.md, for
  - `docs/<page>.md`, also written `../docs/<page>.md`, resolved from the checkout's root;
  - in Markdown files, the target of a link, `[text](<page>.md)` or `[text](../README.md#part)`,
    resolved from the linking file's folder (web addresses are not checked);
prints `file:line: reference (no such file)` for each that names no file and exits 1 if there is
one, 0 if none.

Usage: python3 scripts/check_doc_refs.py [--self-test] [files...]
       (from anywhere; no files: the folders above; --self-test checks the reference patterns)
"""
from __future__ import annotations

import os
import re
import sys

from text_tree import ROOT, checkout_files

SELF = os.path.relpath(os.path.abspath(__file__), ROOT)
FOLDERS = ("src", "tests", "scripts", "docs", "examples")

# docs/<page>.md not inside a longer path (build/docs/x.md, a URL's .../docs/x.md)
DOCS_PATH = re.compile(r"(?<![\w/.-])((?:\.\./)*docs/[\w.-]+(?:/[\w.-]+)*\.md)\b")
# a Markdown link's target ending in .md, before an optional #anchor
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>#]+\.md)(?:#[^)\s>]*)?>?\s*(?:\"[^\"]*\")?\)")

# (text, file the text is in, the references found and whether each exists in this checkout)
SELF_TEST = [
    ("the planner (docs/planner.md)", "src/search/planner.cpp", ["docs/planner.md"]),
    ("see ../docs/search.md", "examples/x/README.md", ["../docs/search.md"]),
    ("[Search](search.md#the-replayed-peak)", "docs/benchmarks.md", ["search.md"]),
    ("[README](../README.md)", "docs/ci.md", ["../README.md"]),
    ("build/docs/site.md and https://example.org/docs/x.md", "README.md", []),
    ("[web](https://example.org/page.md)", "README.md", []),
]


def references(path: str, text: str):
    """(line number, reference as written, checkout path it names) for each page reference."""
    markdown = path.endswith(".md")
    for number, line in enumerate(text.splitlines(), 1):
        for m in DOCS_PATH.finditer(line):
            ref = m.group(1)
            yield number, ref, os.path.normpath(re.sub(r"^(?:\.\./)+", "", ref))
        if not markdown:
            continue
        for m in MD_LINK.finditer(line):
            ref = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", ref) or DOCS_PATH.fullmatch(ref):
                continue  # a web address; or a docs/ path, already read above
            yield number, ref, os.path.normpath(os.path.join(os.path.dirname(path), ref))


def scanned_files():
    """The checkout paths the check reads, sorted; this file is left out (its examples name pages that do not exist on purpose)."""
    return checkout_files(FOLDERS, leave_out=(SELF,))


def self_test() -> int:
    wrong = 0
    for text, path, expected in SELF_TEST:
        found = [ref for _, ref, _ in references(path, text)]
        if found != expected:
            print(f"check_doc_refs: self-test: {text!r} in {path}: found {found}, "
                  f"expected {expected}")
            wrong += 1
    if not wrong:
        print(f"check_doc_refs: self-test: {len(SELF_TEST)} cases as expected")
    return 1 if wrong else 0


def main(argv) -> int:
    if argv[:1] == ["--self-test"]:
        return self_test()
    paths = [os.path.relpath(os.path.abspath(a), ROOT) for a in argv] or scanned_files()
    missing = 0
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for number, ref, target in references(path, text):
            if not os.path.isfile(os.path.join(ROOT, target)):
                print(f"{path}:{number}: {ref} (no such file: {target})")
                missing += 1
    if missing:
        print(f"check_doc_refs: {missing} reference(s) to pages that do not exist ({len(paths)} "
              "files): name the page that holds the content (grep docs/ for it)")
        return 1
    print(f"check_doc_refs: every page reference names a file ({len(paths)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
