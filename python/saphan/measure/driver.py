"""The measure-base driver: the design document's runbook as one POSIX sh
script, run as the confined run's command (``/bin/sh -c SCRIPT``), the same
on this host and on an SSH runner.

Every value reaches the script as a positional parameter, never pasted into
its text; the script is held in the shell's memory (``-c``), so nothing the
run writes can change a later step of it. It writes one file per fact into
``OUT`` (the run's return directory), each named ``measure-*``:

    measure-steps       one line per step: ``NAME STATUS`` (the order below)
    measure-expected    the SHA the order named, expanded in the repository
    measure-target      what ``checkout --detach`` was given (the name, or origin/NAME)
    measure-measured    ``git -C SCRATCH rev-parse HEAD`` after the checkout
    measure-head        ``git -C WORKDIR rev-parse HEAD`` (the head measured)
    measure-paths       (pytest) the base run's import paths, NUL-separated
    measure-PHASE.xml   pytest's --junitxml (PHASE: base, head, final)
    measure-PHASE.json  cargo's libtest JSON (the stdout of its run, teed)

Steps (the runbook's numbers in brackets):

    fresh     the scratch path claimed with one ``mkdir`` (of two runs given the
              same path, one takes it; saphan never clones over, nor removes,
              what it did not make): exit 20 when it is taken; the parent
              directories it needed are made, and removed with it when empty
    toplevel  the working tree is the top of its repository (the clone's
              source): exit 10 when it is a subdirectory, or no repository
    ignored   ``git check-ignore SCRATCH/`` in the working tree; ``add``: the
              default scratch's rule is appended to info/exclude first (a far
              runner, where saphan wrote none before the run): exit 21 when
              not ignored — saphan refuses it (``scratch-not-ignored``)
    expected  the order's SHA (or, with none, the base name) expanded in the
              repository: exit 10 (base not measured) when it names no commit
    clone     [1] git clone --shared --no-checkout REPO WORKDIR/SCRATCH
    checkout  [2] git -C SCRATCH checkout --detach BASE (origin/BASE for a
              branch the clone holds only as a remote-tracking one)
    verify    [3] git -C SCRATCH rev-parse HEAD; no test runs unless it is
              the expected SHA (saphan compares the two files again itself)
    paths     (pytest) what the base run's Python imports from — sys.path and
              editable installs' maps, real paths (measure-paths,
              NUL-separated, written by the probe to the file it is given):
              a path into the working tree outside the scratch means the
              "base" run would import head's code (review: an editable
              install did); the interpreter is argv[0] when it is python*,
              else the #! of the pytest script — not a Python: 126
    base      [4] the test command in the scratch clone (pytest: with
              --rootdir and --confcutdir the scratch and -c its own
              configuration, else /dev/null — never the working tree's
              pytest.ini or conftest.py above it)
    head      [4] the test command in the working tree (the scratch still there;
              pytest: --ignore it, whatever norecursedirs says)
    removed   [5] the scratch clone removed (and what the clone created above it)
    final     [5] the test command in the working tree again: one tree

A relative argv[0] with a slash (``.venv/bin/python``) is the working
tree's, at base too. Every git command here runs with hooks and fsmonitor
off. cargo's stderr joins its stdout in measure-PHASE.json (its "Running …"
lines name each test binary: measure/outcomes.from_cargo). A step's failure
ends the script with the scratch removed (a trap does it on HUP, INT, TERM).
"""

from __future__ import annotations

from collections.abc import Sequence

#: the exit statuses the driver ends with (the report reads the step files)
MEASURED, NOT_MEASURED, SCRATCH_EXISTS, NOT_IGNORED = 0, 10, 20, 21
#: argv[0] of the run: the driver needs nothing but a POSIX shell and git
SHELL = "/bin/sh"
#: $0 of the driver's shell (what `ps` shows for it)
NAME = "saphan-measure-base"
#: the rule the default scratch is ignored by (worktrees.EXCLUDE_LINE's)
DEFAULT_RULE = "/.saphan-run/"

SCRIPT = r"""set -u
OUT=$1 SRC=$2 WD=$3 SCR=$4 REV=$5 EXPECT=$6 KIND=$7 RULE=$8
shift 8
[ "${1-}" = -- ] && shift
unset GIT_DIR GIT_WORK_TREE GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY \
  GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_NAMESPACE GIT_CEILING_DIRECTORIES \
  GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_EXTERNAL_DIFF CDPATH
export GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 GIT_PAGER=cat
# a command named relative to the working tree is the working tree's, at base too
a0=$1; shift
case $a0 in /*) ;; */*) a0=$WD/$a0 ;; esac
set -- "$a0" "$@"
S=$WD/$SCR
TOP= CLAIMED=
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false "$@"; }
interp() {
  case ${1##*/} in python*) printf '%s\n' "$1"; return 0 ;; esac
  p=$(command -v -- "$1") || return 1
  IFS= read -r l < "$p" || return 1
  case $l in '#!'*) ;; *) return 1 ;; esac
  set -f; set -- ${l#??}; set +f
  [ "${1##*/}" = env ] && { shift; [ "${1-}" = -S ] && shift; }
  [ -n "${1-}" ] && printf '%s\n' "$1"
}
PROBE='import os, sys
out = list(sys.path)
for name, mod in list(sys.modules.items()):
    if name.startswith("__editable__"):
        for attr in ("MAPPING", "NAMESPACES"):
            got = getattr(mod, attr, None)
            if isinstance(got, dict):
                for v in got.values():
                    out += [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
with open(sys.argv[1], "w") as f:
    f.write("\0".join(os.path.realpath(p or ".") for p in out))'
val() { printf '%s\n' "$2" > "$OUT/measure-$1"; }
step() { printf '%s %s\n' "$1" "$2" >> "$OUT/measure-steps"; }
drop() {
  [ -n "$CLAIMED" ] || return 0
  rm -rf -- "$S"
  if [ -e "$S" ] || [ -L "$S" ]; then return 1; fi
  CLAIMED=
  d=${SCR%/*}
  while [ -n "$TOP" ] && [ "$d" != "$SCR" ]; do
    rmdir -- "$WD/$d" 2>/dev/null || break
    [ "$d" = "$TOP" ] && break
    case $d in */*) d=${d%/*} ;; *) break ;; esac
  done
  return 0
}
trap 'drop; exit 129' HUP
trap 'drop; exit 130' INT
trap 'drop; exit 143' TERM
# fresh: the first component above the scratch that is not there (made here,
# removed with it if empty), then the scratch itself claimed by one mkdir —
# of two runs given the same path, one takes it
p=
oifs=$IFS; IFS=/; set -f
for c in ${SCR%/*}; do
  [ "$c" = "$SCR" ] && break
  p=${p:+$p/}$c
  if [ -z "$TOP" ] && [ ! -e "$WD/$p" ] && [ ! -L "$WD/$p" ]; then TOP=$p; fi
done
IFS=$oifs; set +f
case $SCR in */*) mkdir -p -- "$WD/${SCR%/*}" 2>/dev/null ;; esac
if ! mkdir -- "$S" 2>/dev/null; then step fresh 1; exit 20; fi
CLAIMED=1
step fresh 0
# toplevel: the working tree is the top of its repository (the clone's source)
top=$(g -C "$WD" rev-parse --show-toplevel); rc=$?
if [ "$rc" -eq 0 ] && [ "$(cd -P -- "$top" && pwd)" != "$(cd -P -- "$WD" && pwd)" ]; then
  rc=1
fi
step toplevel "$rc"
[ "$rc" -eq 0 ] || { drop; exit 10; }
# ignored
g -C "$WD" check-ignore -q -- "$SCR/"; rc=$?
if [ "$rc" -eq 1 ] && [ "$RULE" = add ]; then
  if cdir=$(g -C "$WD" rev-parse --path-format=absolute --git-common-dir 2>/dev/null) \
      && [ -d "$cdir" ] && [ ! -L "$cdir/info" ] \
      && { [ -d "$cdir/info" ] || mkdir "$cdir/info"; } && [ ! -L "$cdir/info/exclude" ]; then
    printf "\n# saphan's per-run scratch directory\n/.saphan-run/\n" >> "$cdir/info/exclude"
  fi
  g -C "$WD" check-ignore -q -- "$SCR/"; rc=$?
fi
step ignored "$rc"
[ "$rc" -eq 0 ] || { drop; exit 21; }
# expected
exp=$(g -C "$SRC" rev-parse --verify -q "${EXPECT:-$REV}^{commit}"); rc=$?
val expected "$exp"; step expected "$rc"
[ "$rc" -eq 0 ] || { drop; exit 10; }
# [1] clone (into the claimed, empty directory)
g clone -q --shared --no-checkout -- "$SRC" "$S"; rc=$?; step clone "$rc"
[ "$rc" -eq 0 ] || { drop; exit 10; }
# [2] checkout
if g -C "$S" rev-parse --verify -q "$REV^{commit}" >/dev/null; then t=$REV
elif g -C "$S" rev-parse --verify -q "refs/remotes/origin/$REV^{commit}" >/dev/null; then
  t=origin/$REV
else t=; fi
val target "$t"
if [ -n "$t" ]; then g -C "$S" checkout -q --detach "$t"; rc=$?; else rc=1; fi
step checkout "$rc"
[ "$rc" -eq 0 ] || { drop; exit 10; }
# [3] verify
got=$(g -C "$S" rev-parse HEAD); rc=$?; val measured "$got"; step verify "$rc"
if [ "$rc" -ne 0 ] || [ "$got" != "$exp" ]; then drop; exit 10; fi
head=$(g -C "$WD" rev-parse HEAD); val head "$head"
# [4] the test command at base, then at head
phase() {
  name=$1 dir=$2; shift 2
  case $KIND in
  pytest)
    case $name in
    base) ( cd "$dir" && exec "$@" "--junitxml=$OUT/measure-$name.xml" --rootdir="$S" \
              --confcutdir="$S" -c "$INI" ); rc=$? ;;
    head) ( cd "$dir" && exec "$@" "--junitxml=$OUT/measure-$name.xml" --ignore="$S" )
          rc=$? ;;
    *) ( cd "$dir" && exec "$@" "--junitxml=$OUT/measure-$name.xml" ); rc=$? ;;
    esac ;;
  cargo)
    { ( cd "$dir" && RUSTC_BOOTSTRAP=1 && export RUSTC_BOOTSTRAP && exec "$@" ) 2>&1
      echo $? > "$OUT/measure-$name.rc"; } | tee "$OUT/measure-$name.json"
    rc=$(cat "$OUT/measure-$name.rc" 2>/dev/null) || rc=255 ;;
  *) ( cd "$dir" && exec "$@" ); rc=$? ;;
  esac
  step "$name" "$rc"
}
if [ "$KIND" = pytest ]; then
  # the base's own pytest configuration, never the working tree's above it
  # (pytest's order: pytest.toml, .pytest.toml, pytest.ini, .pytest.ini,
  # pyproject.toml, tox.ini, setup.cfg; none: /dev/null)
  INI=/dev/null
  for f in pytest.toml .pytest.toml pytest.ini .pytest.ini; do
    [ -f "$S/$f" ] && { INI=$S/$f; break; }
  done
  if [ "$INI" = /dev/null ]; then
    if [ -f "$S/pyproject.toml" ] && grep -q '^\[tool\.pytest' "$S/pyproject.toml"; then
      INI=$S/pyproject.toml
    elif [ -f "$S/tox.ini" ] && grep -q '^\[pytest\]' "$S/tox.ini"; then INI=$S/tox.ini
    elif [ -f "$S/setup.cfg" ] && grep -q '^\[tool:pytest\]' "$S/setup.cfg"; then
      INI=$S/setup.cfg
    fi
  fi
  # what the base run's Python imports from: its path, and editable installs'
  # maps, written to a file of the probe's own (what it prints is not read)
  if py=$(interp "$1"); then
    case ${py##*/} in
    python*) ( cd "$S" && exec "$py" -c "$PROBE" "$OUT/measure-paths" ) >/dev/null
             step paths "$?" ;;
    *) step paths 126 ;;
    esac
  else step paths 127; fi
fi
phase base "$S" "$@"
phase head "$WD" "$@"
# [5] the scratch removed, then the working tree's own suite again
drop; rc=$?; step removed "$rc"
[ "$rc" -eq 0 ] || exit 10
phase final "$WD" "$@"
exit 0
"""


def argv(*, out: str, repository: str, workdir: str, scratch: str, base: str,
         expect: str | None, kind: str, add_rule: bool, test: Sequence[str]) -> list[str]:
    """The run's command line: the shell, the script, then its parameters."""
    return [SHELL, "-c", SCRIPT, NAME, out, repository, workdir, scratch, base, expect or "",
            kind, "add" if add_rule else "keep", "--", *test]
