"""The far side of the SSH site: what saphan asks a runner over SSH, and
how it reads the answers.

Every operation here is one shell script run by the far user's /bin/sh over
the machine's :class:`~saphan.transport.ssh.SSHConnection` (one round trip),
whose answer is parsed and checked on this side. Nothing the far side says is
taken on trust where it matters: digests are compared here, and the session
directory it reports is re-derived here (:func:`verify_session_dir`).

    deliver       upload saphan-launcher, SHA-256 it THERE with the far
                  machine's own sha256sum or shasum -a 256 (through redirection, under set -eu),
                  install it atomically, re-resolve digest and --version of the
                  installed file; any mismatch keeps the previous launcher
    probe         the delivered launcher's `probe` JSON line
    preflight     the dial before a run: the far workdir (exists? resolved?),
                  the launcher's identity, the agent's path and digest, and for
                  a Claude slot this run's own session leaf, created there
    holder        a far holder's liveness facts (boot id, /proc/PID/stat)
    signal        a far holder signalled (`runs cancel`), only if it is still
                  that process (boot id, start time), or its own children

Scripts use only POSIX sh and coreutils (sha256sum, or perl's shasum where it
is absent; mktemp, tr).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from saphan import refusals
from saphan.errors import TransportError
from saphan.liveness import Holder, Liveness
from saphan.store.rows import Machine
from saphan.tools.session_key import session_key
from saphan.transport.ssh import SSHConnection

LAUNCHER_NAME = "saphan-launcher"
#: the signed fact a delivery writes: what is installed where, measured there
FACT_KIND = "launcher"
#: the devices a run may write, when the far machine has them
DEVICES = ("/dev/null", "/dev/tty", "/dev/zero", "/dev/random", "/dev/urandom")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: the configuration files the preflight reads for an agent tool (Preflight.files)
FILE_KINDS = ("codex_system_file", "codex_user_config", "claude_managed_file")


def install_dir(record_key: bytes) -> str:
    """One workspace's far install directory, relative to the far user's
    $HOME: ``.saphan/w-<16 hex>``, derived from the workspace's record key
    (one-way: it names the workspace and reveals nothing of the key), so two
    saphan installs sharing a runner account never overwrite each other's
    launcher. Below it: ``bin/saphan-launcher`` and ``runs/<run id>/`` (each
    run's control directory: its holder and the launcher's status — outside
    every grant, since no working directory may lie in or around ~/.saphan)."""
    tag = hashlib.sha256(b"saphan far install\0" + record_key).hexdigest()[:16]
    return f".saphan/w-{tag}"


def holder_host(m: Machine) -> str:
    """How a far holder's host is written on a run row: never a bare host
    name, so it is never mistaken for a process on the control plane."""
    host = f"[{m.ssh_host}]" if m.ssh_host and ":" in m.ssh_host else m.ssh_host
    return f"ssh://{m.ssh_user}@{host}:{m.ssh_port or 22}"


def _q(value: str) -> str:
    return shlex.quote(value)


def _kv_lines(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


# -- delivery ------------------------------------------------------------------

@dataclass(frozen=True)
class Delivered:
    """What the far machine measured of the launcher it now has installed."""

    path: str
    sha256: str
    version: str


_UPLOAD = """\
set -eu
umask 077
if command -v sha256sum >/dev/null 2>&1; then sha() {{ sha256sum; }}
elif command -v shasum >/dev/null 2>&1; then sha() {{ shasum -a 256; }}
else
  # The upload is read (and dropped) first: leaving early would cut the
  # channel while it is still being sent, and hide this message.
  cat >/dev/null
  echo "no-digest-tool: neither sha256sum nor shasum is on PATH" >&2; exit 3
fi
d="$HOME/{dir}"
mkdir -p "$d"
chmod go-w "$HOME/.saphan" "$HOME/{root}" "$d"
t=$(mktemp "$d/.{name}.XXXXXXXX")
printf 'temp=%s\\n' "$t"
cat > "$t"
s=$(sha < "$t")
printf 'sha256=%s\\n' "${{s%% *}}"
"""

_DISCARD = """\
t={temp}
case $t in "$HOME/{dir}/.{name}."*) rm -f -- "$t" ;; esac
"""

_INSTALL = """\
set -eu
umask 077
if command -v sha256sum >/dev/null 2>&1; then sha() {{ sha256sum; }}
elif command -v shasum >/dev/null 2>&1; then sha() {{ shasum -a 256; }}
else echo "no-digest-tool: neither sha256sum nor shasum is on PATH" >&2; exit 3; fi
t={temp}
want_sha={sha}
want_ver={version}
f="$HOME/{dir}/{name}"
case $t in "$HOME/{dir}/.{name}."*) ;; *) echo "not a saphan temp file: $t" >&2; exit 2 ;; esac
chmod 0755 "$t"
rm -f -- "$f.prev"
if [ -e "$f" ]; then ln -f "$f" "$f.prev"; fi
mv -f -- "$t" "$f"
s=$(sha < "$f")
s=${{s%% *}}
# only the very bytes that were shipped are ever run (their --version)
if [ "$s" != "$want_sha" ]; then v="not run: its digest is not the one delivered"
elif v=$("$f" --version 2>&1); then :; else v="--version failed: $v"; fi
printf 'path=%s\\nsha256=%s\\nversion=%s\\n' "$f" "$s" "$v"
if [ "$s" = "$want_sha" ] && [ "$v" = "$want_ver" ]; then
  rm -f -- "$f.prev"
else
  if [ -e "$f.prev" ]; then mv -f -- "$f.prev" "$f"; else rm -f -- "$f"; fi
  printf 'restored=yes\\n'
fi
"""


def deliver(conn: SSHConnection, data: bytes, *, root: str, sha256: str, version: str,
            previous: str | None, what: str = LAUNCHER_NAME) -> Delivered:
    """Install ``data`` (saphan-launcher, or with ``what`` an agent tool's
    single executable, whose local digest is ``sha256`` and ``--version``
    line is ``version``) as ``<root>/bin/saphan-launcher`` (an agent:
    ``<root>/agents/<what>``).

    Raises the refusal ``digest-mismatch`` when the far machine measures
    anything else, after removing the upload and keeping what was installed
    before (``previous`` names it in the message).
    """
    name = conn.name
    thing = "launcher" if what == LAUNCHER_NAME else what
    kept = (f"the previously installed {thing} (sha256 {previous}) is kept"
            if previous else f"no {thing} was installed before, and none is now")
    bindir = f"{root}/bin" if what == LAUNCHER_NAME else f"{root}/agents"
    if not re.fullmatch(r"[a-z][a-z0-9-]*", what):
        raise ValueError(f"not a name saphan installs: {what!r}")
    up = conn.run(_UPLOAD.format(dir=bindir, root=root, name=what), stdin=data)
    got = _kv_lines(up.out)
    temp = got.get("temp", "")
    if "no-digest-tool" in up.err:
        raise TransportError(
            name, f"machine {name} has no SHA-256 tool (neither sha256sum nor shasum is on its "
            f"PATH), so an upload cannot be verified there; nothing was installed and {kept}")
    if up.exit_code != 0 or not _HEX64.match(got.get("sha256", "")):
        if temp:
            conn.run(_DISCARD.format(temp=_q(temp), dir=bindir, name=what))
        raise TransportError(
            name, f"machine {name}: the upload failed (exit {up.exit_code}): "
            f"{up.err or up.out.strip() or 'no output'}; nothing was installed and {kept}"
        )
    if got["sha256"] != sha256:
        conn.run(_DISCARD.format(temp=_q(temp), dir=bindir, name=what))
        raise refusals.digest_mismatch(
            f"the {thing} uploaded to {name} measures sha256 {got['sha256']} there (its own "
            f"digest tool), but the launcher sent is sha256 {sha256}; the upload was removed, "
            f"nothing was installed, and {kept}",
            f"deliver again (`saphan machine deliver {name}{_agent_opt(what)}`); if it "
            f"recurs, investigate {name}: something between here and its disk changes the "
            "bytes",
        )
    inst = conn.run(_INSTALL.format(
        temp=_q(temp), sha=_q(sha256), version=_q(version), dir=bindir,
        name=what,
    ))
    res = _kv_lines(inst.out)
    if inst.exit_code != 0 or "path" not in res:
        conn.run(_DISCARD.format(temp=_q(temp), dir=bindir, name=what))
        raise TransportError(
            name, f"machine {name}: installing the {thing} failed (exit {inst.exit_code}): "
            f"{inst.err or 'no output'}"
        )
    if res.get("sha256") != sha256 or res.get("version") != version:
        raise refusals.digest_mismatch(
            f"after installing, the {thing} at {res['path']} on {name} re-resolves to sha256 "
            f"{res.get('sha256')} and version {res.get('version')!r}, but sha256 {sha256} "
            f"version {version!r} was delivered; it was rolled back, and {kept}",
            f"deliver again (`saphan machine deliver {name}{_agent_opt(what)}`); if it recurs, "
            f"investigate {name}",
        )
    return Delivered(res["path"], res["sha256"], res["version"])


def _agent_opt(what: str) -> str:
    return "" if what == LAUNCHER_NAME else f" --agent {what}"


# -- a run's frame ----------------------------------------------------------------

FRAME_MAGIC = b"saphan-frame 1\n"


def frame(*, keep: Sequence[str] = (), env: Mapping[str, str | bytes] | None = None,
          stdin: bytes | None = None) -> bytes:
    """What saphan writes first on a far run's channel stdin, read by
    ``saphan-launcher --stdin-frame`` after it proved its own digest: the
    names the command keeps from the far environment (``keep``), the
    variables it gets with their values (``env``: secrets among them — they
    cross the channel here, never a command line, a far file or the far
    environment), and its stdin (``stdin``: the prompt, or the loop's key).
    The command's environment holds nothing else (and TMPDIR, under
    ``exec``). Everything after it on the channel is the lifeline."""
    out = [FRAME_MAGIC]
    for name in dict.fromkeys(keep):
        if env is not None and name in env:
            continue
        out.append(f"keep {_frame_name(name)}\n".encode())
    for name, value in (env or {}).items():
        data = value.encode() if isinstance(value, str) else value
        out.append(f"env {_frame_name(name)} {len(data)}\n".encode() + data)
    if stdin is not None:
        out.append(f"stdin {len(stdin)}\n".encode() + stdin)
    out.append(b"end\n")
    return b"".join(out)


_FRAME_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


def _frame_name(name: str) -> str:
    if not _FRAME_NAME.match(name):
        raise ValueError(f"not a variable name saphan-launcher takes: {name!r}")
    return name


# -- probe ---------------------------------------------------------------------

def probe(conn: SSHConnection, launcher_path: str) -> tuple[str, str, int]:
    """The delivered launcher's ``probe`` run on the far machine:
    ``(stdout, stderr, exit code)``, parsed by the engine like a local probe."""
    done = conn.run(f"exec {_q(launcher_path)} probe")
    return done.out, done.err, done.exit_code


# -- preflight dial --------------------------------------------------------------

_PREFLIGHT = """\
LC_ALL=C
export LC_ALL
# (transport/ssh.sh: the dial's own tools come from the system's
# directories; the far user's PATH, in UP, resolves a command slot's argv[0])
emit() {{ printf '%s=%s\\0' "$1" "$2"; }}
wd={workdir}
lsha={launcher_sha256}
pin={pin}
L={launcher}
tool={tool}
agent={agent}
engine_key={engine_key}
session={session}
resuming={resuming}
also={also}
if command -v sha256sum >/dev/null 2>&1; then dt=sha256sum; sha() {{ sha256sum; }}
elif command -v shasum >/dev/null 2>&1; then dt="shasum -a 256"; sha() {{ shasum -a 256; }}
else dt=; sha() {{ return 127; }}; fi
if [ -n "$dt" ]; then emit digest_tool "$dt"; else emit digest_tool_missing "sha256sum, shasum"; fi
lok=
if [ -f "$L" ] && [ -x "$L" ]; then
  lok=yes
  emit launcher_dir_real "$(cd "$(dirname "$L")" && pwd -P)"
  if s=$(sha < "$L"); then emit launcher_sha256 "${{s%% *}}"; fi
  if v=$("$L" --version 2>&1); then emit launcher_version "$v"; fi
else
  emit launcher_missing "$L"
fi
# An agent binary (hundreds of MB) is digested by the delivered launcher
# (saphan's own SHA-256, ~10x the speed of coreutils here); what it says
# counts only if the launcher itself is the delivered one (checked by the
# engine on this very answer, or the run is refused).
adigest() {{ if [ -n "$lok" ]; then "$L" sha256 "$1" 2>/dev/null; else sha < "$1"; fi; }}
for dev in {devices}; do [ -e "$dev" ] && emit device "$dev"; done
if [ -n "${{HOME:-}}" ] && h=$(cd "$HOME" 2>/dev/null && pwd -P); then
  emit home_real "$h"
  for n in ssh:.ssh install:.saphan; do
    if [ -d "$HOME/${{n#*:}}" ]; then r=$(cd "$HOME/${{n#*:}}" && pwd -P); else r=$h/${{n#*:}}; fi
    emit "${{n%%:*}}_real" "$r"
  done
fi
for t in /tmp /var/tmp /dev/shm "${{TMPDIR:-}}"; do
  [ -n "$t" ] && [ -d "$t" ] && emit tmp_root "$(cd "$t" && pwd -P)"
done
# The working directory is entered only to resolve it: nothing runs from it.
if ! rwd=$(cd "$wd" 2>/dev/null && pwd -P); then emit workdir_missing "$wd"; exit 0; fi
cd /
emit workdir "$rwd"
if [ -d "$rwd/.git" ] && [ ! -L "$rwd/.git" ]; then emit git_dir "$rwd/.git"; fi
case $agent in
  */*) p=$agent ;;
  *)
    # `command -v` is the shell's own: it resolves, it runs nothing
    p=$(cd "$rwd" && PATH=$UP && command -v "$agent" 2>/dev/null) || p=
    case $p in
      /*) ;;
      *)
        p=
        saved_ifs=$IFS; IFS=:
        for dir in $UP; do
          [ -n "$dir" ] || dir=.
          case $dir in /*) ;; *) dir=$rwd/$dir ;; esac
          if [ -f "$dir/$agent" ] && [ -x "$dir/$agent" ]; then p=$dir/$agent; break; fi
        done
        IFS=$saved_ifs ;;
    esac ;;
esac
case $p in ''|/*) ;; *) p=$rwd/$p ;; esac
if [ -n "$p" ] && [ -f "$p" ] && [ -x "$p" ]; then
  emit agent_path "$p"
  ar=$(readlink -f -- "$p" 2>/dev/null) || ar=$(cd "$(dirname "$p")" && pwd -P)/$(basename "$p")
  emit agent_real "$ar"
  digest=
  if s=$(adigest "$p"); then digest=${{s%% *}}; emit agent_sha256 "$digest"; fi
  # An agent's --version runs only if it is not in the working directory, it
  # is the pinned one (when the slot pins one), the launcher is there — and
  # then inside a Landlock domain of the delivered launcher (which proves its
  # own digest first) that may write nothing but a fresh empty directory, and
  # that runs only the file just digested (agent_sha256).
  case $ar in "$rwd"|"$rwd"/*) inwd=yes ;; *) inwd= ;; esac
  if [ "$tool" != command ] && [ -z "$inwd" ] && [ -n "$lok" ] && [ -n "$lsha" ] \
      && [ -n "$digest" ] && {{ [ -z "$pin" ] || [ "$pin" = "$digest" ]; }} \
      && vd=$(mktemp -d /tmp/saphan-version.XXXXXXXX); then
    pol='{{"version":1,"workdir":"'$vd'","writable":["'$vd'"],"readable":"everything","agent_sha256":"'$digest'"}}'
    if v=$("$L" exec --expect-sha256 "$lsha" --policy "$pol" -- "$p" --version \
           </dev/null 2>/dev/null); then
      emit agent_version "$(printf '%s\n' "$v" | head -n 1)"
    fi
    rm -rf -- "$vd"
  fi
else
  emit agent_missing "$agent"
fi
if [ -n "$also" ]; then
  if [ -f "$also" ] && s=$(adigest "$also"); then emit also_sha256 "${{s%% *}}"
  else emit also_missing "$also"; fi
fi
show() {{ if [ -e "$1" ] || [ -L "$1" ]; then
  if [ -f "$1" ] && [ ! -L "$1" ] && c=$(head -c 1048576 < "$1"); then emit "$2" "$1
$c"; else emit "$2" "$1
(unreadable)"; emit "$2_unreadable" "$1"; fi; fi; }}
if [ "$tool" = codex ]; then
  xh=${{CODEX_HOME:-${{HOME:-}}/.codex}}
  emit codex_home "$xh"
  if [ -d "$xh" ]; then emit codex_home_real "$(cd "$xh" && pwd -P)"; fi
  for f in /etc/codex/managed_config.toml /etc/codex/config.toml /etc/codex/requirements.toml; do
    show "$f" codex_system_file
  done
  show "$xh/config.toml" codex_user_config
  [ -f "$xh/auth.json" ] && emit login_file "$xh/auth.json"
  exit 0
fi
[ "$tool" = claude ] || exit 0
for f in /etc/claude-code/managed-settings.json /etc/claude-code/managed-settings.d/*.json; do
  show "$f" claude_managed_file
done
if [ -n "${{CLAUDE_CONFIG_DIR:-}}" ]; then ch=$CLAUDE_CONFIG_DIR
elif [ -n "${{HOME:-}}" ]; then ch=$HOME/.claude
else emit session_unresolved "neither CLAUDE_CONFIG_DIR nor HOME is set there"; exit 0
fi
emit config_home "$ch"
[ -f "$ch/.credentials.json" ] && emit login_file "$ch/.credentials.json"
case $ch in /*) ;; *) emit session_unresolved "the configuration home $ch is not absolute"; exit 0 ;; esac
key=
case $rwd in
  *[!\\ -~]*) ;;
  *) [ "${{#rwd}}" -le 200 ] && key=$(printf '%s' "$rwd" | tr -c 'A-Za-z0-9' '-') ;;
esac
if [ -z "$key" ] && [ "$rwd" = "$wd" ]; then key=$engine_key; fi
if [ -z "$key" ]; then
  emit session_unresolved "the working directory resolves to $rwd, whose project key this shell cannot derive"
  exit 0
fi
emit session_key "$key"
for p in "$ch" "$ch/projects" "$ch/projects/$key" "$ch/session-env" \
    ${{session:+"$ch/session-env/$session"}}; do
  # nothing is made through a link: the engine refuses the leaf by name
  if [ -L "$p" ]; then
    [ -L "$ch" ] || emit config_home_real "$(cd "$ch" && pwd -P)"
    emit session_dir_link "$p"; emit session_dir "$p"; exit 0
  fi
done
if ! out=$( (umask 077; mkdir -p "$ch/projects/$key") 2>&1); then
  emit session_unresolved "cannot create $ch/projects/$key: $out"; exit 0
fi
emit config_home_real "$(cd "$ch" && pwd -P)"
sd=$(cd "$ch/projects/$key" && pwd -P)
emit session_dir "$sd"
[ -n "$session" ] || exit 0
if out=$( (umask 077; mkdir -p "$ch/session-env/$session") 2>&1); then
  emit session_env_dir "$(cd "$ch/session-env/$session" && pwd -P)"
else
  emit session_env_unresolved "cannot create $ch/session-env/$session: $out"
fi
if [ -n "$resuming" ]; then
  f=$sd/$session.jsonl
  if [ -f "$f" ] && [ ! -L "$f" ] && s=$(sha < "$f"); then emit transcript_sha256 "${{s%% *}}"
  else emit transcript_unreadable "$f"; fi
fi
"""


@dataclass(frozen=True)
class Preflight:
    """What the far machine answered to the dial, parsed."""

    raw: dict[str, str]
    devices: tuple[str, ...] = field(default=())
    #: the far machine's temporary roots (/tmp, /var/tmp, /dev/shm, $TMPDIR), resolved
    tmp_roots: tuple[str, ...] = field(default=())
    #: configuration files the far agent reads whatever saphan pins, as read
    #: there: kind (codex_system_file, codex_user_config, claude_managed_file)
    #: → [(path, text or None when it could not be read)]
    files: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        return self.raw.get(key)

    def as_record(self) -> dict[str, Any]:
        return {**self.raw, "devices": list(self.devices), "tmp_roots": list(self.tmp_roots),
                "files": {k: [p for p, _ in v] for k, v in self.files.items()}}


def preflight(conn: SSHConnection, *, workdir: str, launcher_path: str, tool: str,
              agent: str, session: str | None = None, resuming: bool = False,
              also: str | None = None, launcher_sha256: str | None = None,
              pin: str | None = None) -> Preflight:
    """One round trip: everything a remote run needs to know before it is
    composed. ``session``: the Claude Code session the run has (a UUID) —
    its ``session-env/<session>`` directory is created there (Claude Code
    writes it for every shell command, measured), and when ``resuming``, the
    SHA-256 of its transcript in this run's leaf is measured there.
    ``also``: one more file the run executes (the loop's zipapp), digested
    there. An agent's ``--version`` runs only confined (the delivered
    launcher, proving ``launcher_sha256``, with a policy that may write a
    fresh empty directory only), only for the binary just digested, never
    from inside the working directory and never when it is not ``pin``.
    Raises TransportError when the dial itself fails."""
    if session is not None and not _UUID.match(session):
        raise ValueError(f"not a session id: {session!r}")
    script = _PREFLIGHT.format(
        workdir=_q(workdir), launcher=_q(launcher_path), tool=_q(tool), agent=_q(agent),
        engine_key=_q(session_key(workdir)), devices=" ".join(DEVICES),
        session=_q(session or ""), resuming="yes" if resuming else "''",
        also=_q(also or ""), launcher_sha256=_q(launcher_sha256 or ""), pin=_q(pin or ""),
    )
    done = conn.run(script)
    devices: list[str] = []
    tmp_roots: list[str] = []
    raw: dict[str, str] = {}
    files: dict[str, list[tuple[str, str | None]]] = {}
    unreadable: set[tuple[str, str]] = set()
    for item in done.stdout.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if not sep:
            continue
        k, v = key.decode(), value.decode(errors="surrogateescape")
        if k == "device":
            devices.append(v)
        elif k == "tmp_root":
            tmp_roots.append(v)
        elif k in FILE_KINDS:
            path, _, text = v.partition("\n")
            files.setdefault(k, []).append((path, text))
        elif k.endswith("_unreadable") and k[: -len("_unreadable")] in FILE_KINDS:
            unreadable.add((k[: -len("_unreadable")], v))
        else:
            raw[k] = v
    files = {k: [(p, None if (k, p) in unreadable else t) for p, t in v]
             for k, v in files.items()}
    if done.exit_code != 0 or ("workdir" not in raw and "workdir_missing" not in raw):
        raise TransportError(
            conn.name, f"machine {conn.name}: the preflight dial failed (exit {done.exit_code}): "
            f"{done.err or 'no answer'}"
        )
    return Preflight(raw, tuple(devices), tuple(dict.fromkeys(tmp_roots)), files)


def verify_session_dir(machine: str, pf: Preflight) -> str:
    """This run's own session leaf, re-derived here from the far answers; the
    refusal ``session-dir-foreign`` for anything else the far side reported.

    The far side resolved the working directory (``pwd -P``) and the
    configuration home; the key is derived here again from that directory,
    and the leaf must be exactly ``<config home>/projects/<key>`` — so the
    configuration home and the ``projects`` directory above the leaf, or
    another directory's leaf, can never become writable through this grant.
    """
    rwd = pf.get("workdir") or ""
    home = pf.get("config_home_real") or ""
    reported = pf.get("session_dir") or ""
    key = session_key(rwd)
    expected = posixpath.join(home, "projects", key)
    problems = []
    for label, p in (("working directory", rwd), ("configuration home", home),
                     ("session directory", reported)):
        if not p.startswith("/") or posixpath.normpath(p) != p or p.startswith("//"):
            problems.append(f"the {label} {p!r} is not an absolute, normal path")
    if key in ("", ".", "..") or "/" in key:
        problems.append(f"the key {key!r} derived from {rwd!r} cannot name a leaf")
    if pf.get("session_key") is not None and pf.get("session_key") != key:
        problems.append(f"it derived the key {pf.get('session_key')!r}, this engine derives {key!r}")
    if reported != expected:
        problems.append(f"it is not {expected}")
    if posixpath.basename(posixpath.dirname(reported)) != "projects":
        problems.append("its parent is not a `projects` directory")
    if pf.get("session_dir_link") is not None:
        problems.append(f"{pf.get('session_dir_link')} is a link there (the preflight made "
                        "nothing through it)")
    if problems:
        raise refusals.session_dir_foreign(
            f"the preflight on {machine} reported {reported!r} as this run's session directory, "
            f"but it is not this run's own leaf ({'; '.join(problems)})",
            f"check the seat's configuration home on {machine} (CLAUDE_CONFIG_DIR or "
            "$HOME/.claude): its `projects` directory and the leaf must be real directories, "
            "not links elsewhere",
        )
    return reported


_TRANSCRIPT = """\
f={path}
if [ -f "$f" ] && [ ! -L "$f" ]; then
  if command -v sha256sum >/dev/null 2>&1; then s=$(sha256sum < "$f"); else s=$(shasum -a 256 < "$f"); fi
  printf 'sha256=%s\\n' "${{s%% *}}"
elif [ -e "$f" ] || [ -L "$f" ]; then echo "unreadable=not a regular file"
else echo "unreadable=no such file"; fi
"""


_RUN_FILE = """\
d={dir}
f=$d/{name}
case $d in /*) ;; *) exit 3 ;; esac
p=
set -f
IFS=/
for c in ${{d#/}}; do
  p=$p/$c
  [ -L "$p" ] && exit 4
done
unset IFS
rc=0
if [ -f "$f" ] && [ ! -L "$f" ]; then head -c {limit} < "$f"; else rc=5; fi
[ -z "{remove}" ] || rm -rf -- "$d"
exit $rc
"""


def read_run_file(conn: SSHConnection, directory: str, name: str,
                  limit: int = 1 << 20, *, remove: bool = False) -> bytes | None:
    """A file a far run wrote (the loop's result), read there: no component
    of ``directory`` a link, the file regular and not a link, at most
    ``limit`` bytes; None when it is not so, or the runner could not be
    asked. What it holds is the run's: the caller parses, never executes.
    ``remove``: then remove ``directory`` (the run's own return directory;
    never reached through a link)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"not a run file saphan reads: {directory!r} {name!r}")
    try:
        done = conn.run(_RUN_FILE.format(dir=_q(directory), name=_q(name), limit=int(limit),
                                         remove="yes" if remove else ""))
    except TransportError:
        return None
    return done.stdout if done.exit_code == 0 else None


def transcript_sha256(conn: SSHConnection, leaf: str, session: str) -> dict[str, Any]:
    """A far Claude Code session's transcript (``<leaf>/<session>.jsonl``),
    digested there after the run: ``{"path", "sha256"}`` (``sha256`` None
    and ``unreadable`` saying why when it is not a regular file)."""
    if not _UUID.match(session):
        raise ValueError(f"not a session id: {session!r}")
    path = posixpath.join(leaf, f"{session}.jsonl")
    try:
        got = _kv_lines(conn.run(_TRANSCRIPT.format(path=_q(path))).out)
    except TransportError as e:
        got = {"unreadable": f"the far machine could not be asked: {e}"}
    digest = got.get("sha256")
    if digest is not None and _HEX64.match(digest):
        return {"path": path, "sha256": digest}
    return {"path": path, "sha256": None, "unreadable": got.get("unreadable") or "no answer"}


def verify_session_env(machine: str, pf: Preflight, session: str) -> str:
    """This run's own ``session-env/<session>`` directory, re-derived here:
    exactly ``<config home>/session-env/<session>`` (``session-dir-foreign``
    for anything else the far side reported)."""
    home = pf.get("config_home_real") or ""
    reported = pf.get("session_env_dir") or ""
    expected = posixpath.join(home, "session-env", session)
    if (not _UUID.match(session) or not home.startswith("/") or reported != expected
            or posixpath.normpath(reported) != reported):
        raise refusals.session_dir_foreign(
            f"the preflight on {machine} reported {reported!r} as this run's Claude Code "
            f"session-env directory, but it is not {expected}",
            f"check the seat's configuration home on {machine}: its `session-env` directory "
            "must be a real directory, not a link elsewhere",
        )
    return reported


# -- holder liveness -------------------------------------------------------------

_HOLDER = """\
b=$(cat /proc/sys/kernel/random/boot_id)
printf 'boot=%s\\n' "$b"
if s=$(tr '\\n' ' ' < /proc/{pid}/stat 2>/dev/null); then printf 'stat=%s\\n' "$s"; fi
"""


def holder_liveness(conn: SSHConnection, holder: Holder) -> Liveness:
    """The far holder's liveness, read over the transport: boot id, then the
    pid's start time and state. Unreachable is "unknown" (counted alive)."""
    from saphan.liveness import judge

    try:
        done = conn.run(_HOLDER.format(pid=int(holder.pid)), timeout=conn.connect_timeout * 2)
    except TransportError as e:
        return Liveness("unknown", f"{e}")
    got = _kv_lines(done.out)
    boot = got.get("boot") or None
    ticks: int | None = None
    state: str | None = None
    stat = got.get("stat")
    if stat:
        try:
            rest = stat[stat.rindex(")") + 2 :].split()
            state, ticks = rest[0], int(rest[19])
        except (ValueError, IndexError):
            # A name with a newline or a bracket can cut the line short:
            # what cannot be read is not "dead".
            return Liveness("unknown", f"/proc/{holder.pid}/stat on {conn.name} could not be "
                            f"parsed: {stat[:120]!r}")
    return judge(holder, here_boot=boot, ticks=ticks, state=state, where=conn.name)


_SIGNAL = """\
b=$(cat /proc/sys/kernel/random/boot_id)
[ "$b" = {boot} ] || {{ echo gone=rebooted; exit 0; }}
s=$(sed 's/.*) //' /proc/{pid}/stat 2>/dev/null) || s=
set -f; set -- $s; set +f
[ "$#" -ge 20 ] && [ "${{20}}" = {ticks} ] || {{ echo gone=pid; exit 0; }}
case $1 in Z|X) echo gone=zombie; exit 0 ;; esac
if [ {target} = children ]; then
  sent=
  for k in $(cat /proc/{pid}/task/*/children 2>/dev/null); do
    p=$(sed 's/.*) //' "/proc/$k/stat" 2>/dev/null | cut -d' ' -f2)
    [ "$p" = {pid} ] && kill -{sig} "$k" 2>/dev/null && sent="$sent $k"
  done
  echo "sent=$sent"
else
  kill -{sig} {pid} && echo sent={pid}
fi
"""

#: the signals :func:`signal_holder` sends (saphan-launcher passes the first
#: three on to its command, then ends what the command left)
SIGNALS = ("TERM", "INT", "HUP", "KILL")


def signal_holder(conn: SSHConnection, holder: Holder, sig: str, *,
                  children: bool = False) -> str:
    """Send ``sig`` (one of :data:`SIGNALS`) to a far run's holder — the
    launcher the far script exec'd (run_script), as the row names it — in
    one far script that first checks it is still that process: the boot id,
    then the pid's start time (a reused pid is left alone). ``children``:
    send it to the launcher's own children instead, as the far kernel lists
    them (/proc/PID/task/*/children), each checked to still have the
    launcher as its parent: SIGKILL there ends the command while the
    launcher, a subreaper, still ends the rest of the tree. Nothing the run
    wrote is read as a pid. Returns "sent ..." or "gone: why"."""
    if sig not in SIGNALS:
        raise ValueError(f"not a signal saphan sends to a far run: {sig!r}")
    if holder.start_ticks is None or holder.boot_id is None:
        return "gone: the holder's start time or boot id was not recorded; nothing was sent"
    done = conn.run(_SIGNAL.format(boot=_q(holder.boot_id), pid=int(holder.pid),
                                   ticks=int(holder.start_ticks), sig=sig,
                                   target="children" if children else "holder"),
                    timeout=conn.connect_timeout * 2)
    got = _kv_lines(done.out)
    if "sent" in got:
        who = got["sent"].strip()
        return f"sent SIG{sig} to pid {who}" if who else "sent nothing: no children left"
    why = {"rebooted": f"{conn.name} rebooted since", "pid": f"pid {holder.pid} no longer "
           f"runs on {conn.name} (or is another process)", "zombie": f"pid {holder.pid} on "
           f"{conn.name} has exited"}.get(got.get("gone", ""), f"no answer ({done.err.strip()})")
    return f"gone: {why}"


# -- a run's control directory ---------------------------------------------------

_RUN_ID = re.compile(r"^[0-9A-Z]{26}$")

_READ_HOLDER = """\
f="$HOME"/{dir}/{run}/holder
i=0
while [ ! -s "$f" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
cat "$f"
"""

_READ_STATUS = """\
f="$HOME"/{dir}/{run}/status
[ -f "$f" ] && head -c {limit} "$f"
exit 0
"""

_FORGET = """\
d="$HOME"/{dir}/{run}
rm -f -- "$d/holder" "$d/status" "$d/holder.tmp" {files} && rmdir -- "$d"
"""

#: the per-run files a far run's control directory may hold (write_run_files)
RUN_FILES = ("claude-settings.json", "loop-spec.json")

_WRITE_RUN_FILE = """\
set -eu
umask 077
D="$HOME"/{dir}/{run}
{make}
cat > "$D"/{name}
"""


def write_run_files(conn: SSHConnection, root: str, run_id: str,
                    files: Sequence[tuple[str, bytes]]) -> None:
    """Make a run's control directory (new) with ``files`` in it — what the
    agent reads there (its settings, the loop's spec) — each sent on the
    channel's stdin, so no far command line holds it (nor is limited by the
    kernel's argument size). Raises TransportError when it fails."""
    for i, (name, data) in enumerate(files):
        if name not in RUN_FILES:
            raise ValueError(f"not a run file saphan writes: {name!r}")
        make = ('mkdir -p "$HOME"/{d} && mkdir "$D"'.format(d=_q(f"{root}/runs"))
                if i == 0 else '[ -d "$D" ] && [ ! -L "$D" ]')
        done = conn.run(_WRITE_RUN_FILE.format(dir=_q(f"{root}/runs"), run=_run(run_id),
                                               make=make, name=_q(name)), stdin=data)
        if done.exit_code != 0:
            raise TransportError(conn.name, f"machine {conn.name}: the run's {name} could not "
                                 f"be written there: {done.err.strip() or 'no answer'}")


def _run(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return run_id


def read_holder(conn: SSHConnection, root: str, run_id: str) -> tuple[int, int, str]:
    """The far process that holds a run's seat, as the far script wrote it
    before anything of the run started (pid, start ticks, boot id)."""
    done = conn.run(_READ_HOLDER.format(dir=f"{root}/runs", run=_run(run_id)),
                    timeout=conn.connect_timeout * 2 + 10)
    parts = done.out.split()
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        raise TransportError(conn.name, f"machine {conn.name}: the far run's holder could not be "
                             f"read from {root}/runs/{run_id}/holder ({done.err or done.out!r})")
    return int(parts[0]), int(parts[1]), parts[2]


def read_status(conn: SSHConnection, root: str, run_id: str, limit: int = 1 << 16) -> bytes:
    """The far launcher's status file (its control lines), at most ``limit`` bytes."""
    return conn.run(_READ_STATUS.format(dir=f"{root}/runs", run=_run(run_id),
                                        limit=limit)).stdout


def forget_run(conn: SSHConnection, root: str, run_id: str) -> None:
    """Remove an ended run's control directory (best effort: it is small)."""
    with suppress(TransportError):
        conn.run(_FORGET.format(dir=f"{root}/runs", run=_run(run_id),
                                files=" ".join(f'"$d"/{n}' for n in RUN_FILES)))
