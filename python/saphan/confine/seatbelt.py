"""Policy -> Seatbelt profile for sandbox-exec (the macOS control-plane boundary).

Deny every write, allow the policy's set, then the read-only carve-outs and the
read denials LAST so nothing after them can re-grant their paths. Seatbelt can
grant a literal that does not exist yet (a ref lock), which bubblewrap cannot.
"""

from __future__ import annotations

from saphan.confine.policy import Policy


def _q(path: str) -> str:
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(policy: Policy) -> str:
    if policy.network == "off":
        # confine/network.py refuses `network: off` here; a renderer never
        # drops what it cannot express.
        raise ValueError("a Seatbelt profile here renders no network cut")
    lines = [
        "(version 1)",
        "(allow default)",
        "(deny file-write*)",
    ]
    if policy.hidden_dirs:
        # saphan's workspaces: unreadable, then the run's own paths under them
        # readable again (the last matching rule wins).
        hidden = [f"(subpath {_q(d)})" for d in policy.hidden_dirs]
        lines.append("(deny file-read* file-write*\n    " + "\n    ".join(hidden) + ")")
        back = [f"(subpath {_q(d)})" for d in (*policy.writable_dirs, *policy.readonly_dirs,
                                               *filter(None, (policy.door_dir,)))]
        lines.append("(allow file-read*\n    " + "\n    ".join(back) + ")")
    allows = [f"(subpath {_q(d)})" for d in policy.writable_dirs]
    allows += [f"(literal {_q(lit)})" for lit in policy.writable_literals]
    if allows:
        lines.append("(allow file-write*\n    " + "\n    ".join(allows) + ")")
    if policy.readonly_dirs:
        ro = [f"(subpath {_q(d)})" for d in policy.readonly_dirs]
        lines.append("(deny file-write*\n    " + "\n    ".join(ro) + ")")
    if policy.read_denials:
        # subpath matches the path itself and everything below it.
        denied = [f"(subpath {_q(p)})" for p in policy.read_denials]
        lines.append("(deny file-read* file-write*\n    " + "\n    ".join(denied) + ")")
    if policy.network == "egress":
        lines += _egress(policy)
    return "\n".join(lines) + "\n"


def _egress(policy: Policy) -> list[str]:
    """An egress run: no network but the door — its socket, and its port on
    loopback (macOS has no network namespace: the door listens there).
    Rendered and golden-tested only: compose refuses egress on Seatbelt
    (``egress-uncuttable``) until this profile is measured on a Mac."""
    from saphan.confine.policy import DOOR_PORT

    return [
        "(deny network*)",
        f"(allow network-outbound (remote unix-socket (path-literal {_q(policy.door_socket)})))",
        f'(allow network-outbound (remote ip "localhost:{DOOR_PORT}"))',
    ]


def argv(policy: Policy, profile_path: str) -> list[str]:
    return ["/usr/bin/sandbox-exec", "-f", profile_path]
