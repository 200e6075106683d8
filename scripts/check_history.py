#!/usr/bin/env python3
"""No development history in the code or the docs: a comment or a doc says why a rule is as it
is and where it comes from (a PyTorch file, a bug report, a paper, a doc page, a test), never
which work session, review round, helper's run or scratch path it came out of; that history
belongs in commit messages (CONTRIBUTING.md, "Review habits"). Run by scripts/lint.sh.

Scans the text files (.cpp .h .inc .py .sh .md .txt .cmake CMakeLists.txt) under src/, tests/,
scripts/ and docs/, and README.md and CONTRIBUTING.md, for the phrasings in PATTERNS; prints
`file:line: text` for each hit and exits 1 if there is one, 0 if none. An issue cited as the
source of a requirement ("issue 40 row 15") is allowed; words that only look alike ("pytest
session", `_Session`, "a session of its own", "stops the search", "a stop signal") are not hits
(SELF_TEST lists both kinds).

Usage: python3 scripts/check_history.py [--self-test] [files...]
       (from anywhere; no files: the folders above; --self-test checks the patterns themselves)
"""
from __future__ import annotations

import os
import re
import sys

from text_tree import ROOT, checkout_files

FOLDERS = ("src", "tests", "scripts", "docs")
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)

# What a number after "stop" must not be followed by for it to name a work session: a unit or a
# count ("stops 3 steps in", "stop 2 s later").
_NOT_A_UNIT = (r"(?!\s*(?:s|ms|us|ns|min|minutes?|seconds?|hours?|steps?|trials?|ranks?|bytes?"
               r"|[KMGT]i?B|%)\b)")
PATTERNS = [
    # the project's work sessions were called stops: "stop 55", "a review of stop 54", "stops 50
    # to 58", "Stop 57's tables"
    ("work session", re.compile(r"\b[Ss]tops? \d+\b" + _NOT_A_UNIT)),
    ("work session", re.compile(r"\b(?:this|last|previous|that|the next) session\b", re.I)),
    ("scratch path of a session", re.compile(r"/tmp/s\d+/")),
    ("helper's run", re.compile(r"\b(?:a|the) helper(?:'s)? (?:read|review|run|found|test|clone)"
                                r"\w*", re.I)),
    ("helper's run", re.compile(r"\(helper,", re.I)),
    ("new user's run", re.compile(r"\bnew user's (?:clone|round|run|fresh)\b", re.I)),
    ("new user's run", re.compile(r"\bmeasured as a new user\b", re.I)),
    ("review round", re.compile(r"\bround (?:one|two|three|four|five|six|seven|eight)\b", re.I)),
    ("review round", re.compile(r"\b(?:first|second|third|fourth|fifth|sixth) review\b", re.I)),
    ("review round", re.compile(r"\bthe review's (?:repro|finding)", re.I)),
    ("review round", re.compile(r"\ba review (?:had )?(?:found|saw|read)\b", re.I)),
    ("review round", re.compile(r"\bfound (?:in|by) (?:a |the )?(?:review|user test|new user)",
                                re.I)),
]

_COMMENT_MARK = re.compile(r"^\s*(?:#+|/{2,3}|\*)?\s*")

# (text, whether it must be a hit): the phrasings the patterns are for, and words of the code
# that look like them.
SELF_TEST = [
    ("a review of stop 54: a step's own", True),
    ("(no GPU lent in stops 50 to 58)", True),
    ("Stop 57's two runs", True),
    ("--jsonl /tmp/s58/race_full2.jsonl", True),
    ("A second user test (this session) found", True),
    ("in the last session", True),
    ("(a helper reading only this README, a fresh clone)", True),
    ("A new user's round on the rows above (helper, stop 45)", True),
    ("on a new user's clone of stop 55", True),
    ("Measured as a new user", True),
    ("(issue 31 round four)", True),
    ("(a fifth review, H2)", True),
    ("# a review of stop\n# 55: wrapped", True),
    ("// the work of\n// stop 12", True),
    ("(the review's repro: 23 where", True),
    ("Found in review: a hierarchy", True),
    ("(a review found the training column stale", True),
    ("in a new user's fresh environment", True),
    ("code review: see CONTRIBUTING.md", False),
    ("found by a user test: \"--memory-limit 1.5\"", True),
    ("def pytest_sessionfinish(session, exitstatus):", False),
    ("one trial's calls taking find()'s search options as _Session's TypeError", False),
    ("A session of its own, killed whole at the timeout", False),
    ("a session of the search", False),
    ("a pytest session", False),
    ("a time limit that stops the search before anything fits", False),
    ("the trial stops (on the CPU at its next op)", False),
    ("One stop request, one report", False),
    ("a stop signal", False),
    ("stop_on_failure", False),
    ("stops 3 steps in", False),
    ("stop 2 s later", False),
    ("issue 40 row 15: one step ran for minutes past a 10 s budget", False),
    ("(issue 40, \"hostile input, third round\")", False),
    ("the job round compares them", False),
    ("the helpers in the package", False),
    ("/tmp/scratch/out.json", False),
    ("the search can stop\n# 3 trials later", False),
]


def _what(line: str):
    """The name of the first pattern `line` matches, or None."""
    return next((what for what, pattern in PATTERNS if pattern.search(line)), None)


def hits_in(text: str):
    """(line number, line, what) for each line of `text` a pattern matches, and for each line that
    matches only together with the next one (a phrase wrapped in a comment: "a review of stop" at
    a line's end, "55" on the next), whose comment marker is left out of the join."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        what = _what(line)
        if what is None and i + 1 < len(lines) and _what(lines[i + 1]) is None:
            what = _what(line.rstrip() + " " + _COMMENT_MARK.sub("", lines[i + 1]))
        if what is not None:
            yield i + 1, line, what


def scanned_files():
    """The checkout paths the check reads, sorted; this file is left out (it names the patterns)."""
    return checkout_files(FOLDERS, leave_out=(SELF,))


def self_test() -> int:
    wrong = [(text, hit) for text, hit in SELF_TEST if bool(list(hits_in(text))) != hit]
    for text, hit in wrong:
        print(f"check_history: self-test: {text!r} should {'' if hit else 'not '}be a hit")
    if not wrong:
        print(f"check_history: self-test: {len(SELF_TEST)} cases as expected")
    return 1 if wrong else 0


def main(argv) -> int:
    if argv[:1] == ["--self-test"]:
        return self_test()
    paths = [os.path.relpath(os.path.abspath(a), ROOT) for a in argv] or scanned_files()
    count = 0
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for number, line, what in hits_in(text):
            print(f"{path}:{number}: {line.strip()[:200]}")
            count += 1
    if count:
        print(f"check_history: {count} history reference(s) ({len(paths)} files): say the rule "
              "and its source (a test, an issue, a doc page, a PyTorch file) instead; the history "
              "belongs in the commit message")
        return 1
    print(f"check_history: no history references in {len(paths)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
