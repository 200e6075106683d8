#!/usr/bin/env bash
# Runs clang-format (check only) and clang-tidy on our sources, never on LibTorch; fails on findings.
# Also prints the longest functions in src/ and fails on one over 80 lines (outside named tables),
# and fails on development history in comments and docs and on references to missing doc pages.
# Needs a configured build tree with compile_commands.json (scripts/test.sh makes one).
# Usage: scripts/lint.sh [files...]   (default: every tracked .cpp/.h under src, include, tests)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
cd "$AUTOBATCH_ROOT"

# A missing comma in .clang-tidy silently disables whole groups: the count catches it.
expected_checks=138
enabled=$(clang-tidy-14 --list-checks 2>/dev/null | tail -n +2 | grep -c .)
if [ "$enabled" -ne "$expected_checks" ]; then
  echo "lint: .clang-tidy enables $enabled checks, expected $expected_checks (fix .clang-tidy, or" \
       "update expected_checks in scripts/lint.sh when a check was added on purpose)"
  exit 1
fi

# Function lengths (Universal Ctags' line: and end: fields): the 10 longest in src/ are printed,
# and any over max_function_lines fails, except the pure tables named here with their reason.
max_function_lines=80
allowed_long_functions=(
  # src/cli/options.cpp: the CLI's option table, one cxxopts entry per flag with its help text;
  # splitting it would scatter the flags' documentation.
  "src/cli/options.cpp:makeOptions"
)
command -v ctags >/dev/null || { echo "lint: ctags (Universal Ctags) missing: apt-get install universal-ctags"; exit 1; }
mapfile -t sources < <(git ls-files 'src/*.cpp' 'src/*.h')
lengths="$(ctags --fields=+ne -o - --sort=no --kinds-c++=f "${sources[@]}" \
  | awk -F'\t' '{ l = ""; e = ""
      for (i = 4; i <= NF; ++i) { if ($i ~ /^line:/) l = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
      if (l != "" && e != "") printf "%d\t%s:%s\t%s\n", e - l + 1, $2, l, $1 }' \
  | sort -t$'\t' -k1,1nr)"
echo "lint: the 10 longest functions in src/ (lines, file:line, name)"
head -n 10 <<<"$lengths" | sed 's/^/  /'
long=0
while IFS=$'\t' read -r n where name; do
  [ "$n" -gt "$max_function_lines" ] || break
  key="${where%%:*}:$name"
  if printf '%s\n' "${allowed_long_functions[@]}" | grep -qxF "$key"; then continue; fi
  echo "lint: $where $name is $n lines, over $max_function_lines: split it into named steps"
  long=1
done <<<"$lengths"
[ "$long" = 0 ] || exit 1

# The layers' dependency direction (docs/architecture.md): no file includes a higher layer's header.
"$AUTOBATCH_PYTHON" "$here/check_layers.py"
# Comments and docs give a rule's reason and source, not the session or review it came from
# (CONTRIBUTING.md, "Review habits"): that history belongs in commit messages.
"$AUTOBATCH_PYTHON" "$here/check_history.py"
# Every docs/<page>.md the code and the docs name exists: a moved page leaves no dead pointer.
"$AUTOBATCH_PYTHON" "$here/check_doc_refs.py"
# The Python package's public names documented (ruff D1) and the examples type-checked against
# its annotations (mypy), in the tools environment (scripts/lint_python.sh).
bash "$here/lint_python.sh"

if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files 'src/*.cpp' 'src/*.h' 'include/*.h' 'tests/*.cpp' 'tests/*.h' \
                       'examples/*.cpp' | grep -v '^tests/fixtures/')
fi
echo "lint: clang-format on ${#files[@]} files"
clang-format-14 --dry-run --Werror "${files[@]}"

db="$AUTOBATCH_BUILD_DIR/compile_commands.json"
[ -f "$db" ] || { echo "lint: $db missing: run scripts/test.sh first"; exit 1; }
# The test executables compile their files as one unit (UNITY_BUILD, tests/CMakeLists.txt), so the
# database names the generated unity file, not the test files: each file it includes gets the
# unity file's command, written to a database of our own that clang-tidy reads.
dbdir="$(mktemp -d)"
"$AUTOBATCH_PYTHON" - "$db" "$dbdir/compile_commands.json" <<'PY'
import json, re, sys
out = []
for e in json.load(open(sys.argv[1])):
    if "/Unity/unity_" not in e["file"]:
        out.append(e)
        continue
    for src in re.findall(r'^#include "(.+)"$', open(e["file"]).read(), re.M):
        command = (e.get("command") or " ".join(e["arguments"])).replace(e["file"], src)
        out.append({"directory": e["directory"], "command": command, "file": src})
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
db="$dbdir/compile_commands.json"
mapfile -t tus < <(printf '%s\n' "${files[@]}" | grep '\.cpp$' \
                   | while read -r f; do grep -q "\"file\": \"$AUTOBATCH_ROOT/$f\"" "$db" && echo "$f"; done)
log="$(mktemp)"
trap 'rm -rf "$log" "$dbdir"' EXIT
# A unit found clean is not checked again while nothing it is checked from changed (issue 41: 99
# units took 1,236 s of every CI run): the key is the unit's content, its compile command (the
# clone's path taken out, so clones share it), the content of every project header it includes,
# directly or through other project headers (its `#include "..."` and `#include <autobatch/...>`
# lines, resolved as the compiler does: beside the including file, then the command's -I folders
# inside the checkout), .clang-tidy, the tool's version and requirements.txt (LibTorch's headers).
# A header's change re-checks the units that include it, not all of them. Kept outside the clone,
# in AUTOBATCH_LINT_CACHE (default $AUTOBATCH_ENV_ROOT/clang-tidy-clean); AUTOBATCH_LINT_CACHE=off
# checks every unit.
cache="${AUTOBATCH_LINT_CACHE:-$AUTOBATCH_ENV_ROOT/clang-tidy-clean}"
common="$( (clang-tidy-14 --version; cat .clang-tidy requirements.txt) | sha256sum | cut -c1-32)"
mapfile -t keyed < <("$AUTOBATCH_PYTHON" - "$db" "$AUTOBATCH_ROOT" "$common" "${tus[@]}" <<'PY'
import hashlib, json, os, re, shlex, sys
db, root, common, units = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
commands = {e["file"]: e.get("command") or " ".join(e.get("arguments", [])) for e in json.load(open(db))}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
OURS = tuple(f"{root}/{folder}/" for folder in ("src", "include", "tests", "examples"))

def project_headers(path, folders, seen):
    """The project headers `path` includes, directly or through others (into `seen`)."""
    for name in INCLUDE.findall(open(path, encoding="utf-8", errors="replace").read()):
        for folder in (os.path.dirname(path), *folders):
            found = os.path.normpath(os.path.join(folder, name))
            if os.path.isfile(found):
                if found.startswith(OURS) and found not in seen:
                    seen.add(found)
                    project_headers(found, folders, seen)
                break
    return seen

for unit in units:
    command = commands.get(f"{root}/{unit}", "")
    words = shlex.split(command)
    folders = [w[2:] for w in words if w.startswith("-I") and len(w) > 2]
    folders += [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-I", "-iquote")]
    folders = [f for f in folders if os.path.normpath(f).startswith(root + "/")]
    h = hashlib.sha256(common.encode())
    h.update(command.replace(root, "ROOT").encode())
    h.update(open(f"{root}/{unit}", "rb").read())
    for header in sorted(project_headers(f"{root}/{unit}", folders, set())):
        h.update(header.replace(root, "ROOT").encode() + b"\0" + open(header, "rb").read())
    print(f"{unit}:{h.hexdigest()[:32]}")
PY
)
todo=()
for entry in "${keyed[@]}"; do
  if [ "$cache" != off ] && [ -f "$cache/${entry##*:}" ]; then continue; fi
  todo+=("$entry")
done
echo "lint: clang-tidy on ${#todo[@]} of ${#tus[@]} units (the others unchanged since found clean;" \
     "cache $cache)"
[ "$cache" = off ] || mkdir -p "$cache"
export dbdir cache
# shellcheck disable=SC2016
if [ ${#todo[@]} -gt 0 ] && ! printf '%s\n' "${todo[@]}" | xargs -P "$(nproc)" -n 1 bash -c '
     clang-tidy-14 -p "$dbdir" --quiet --extra-arg=-Wno-unknown-warning-option \
       "${0%:*}" || exit 1
     [ "$cache" = off ] || touch "$cache/${0##*:}"' >"$log" 2>&1; then
  grep -v 'warnings generated' "$log"
  echo "lint: clang-tidy findings above"
  exit 1
fi
echo "lint: clean"
