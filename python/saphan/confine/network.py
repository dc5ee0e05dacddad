"""A permission class's network posture: enforced on the run's path, or refused.

A class says ``network: off`` (the default when it names none) or
``network: open``. ``open`` makes no claim: the record says the network is
not restricted. ``off`` is a claim, so it is made only where something
enforces it, and everywhere else the run is refused
(``network-posture-unenforceable``) — the record never shows ``off`` next to
a network the run in fact had.

Where ``off`` is enforced in this build (:func:`lever`):

- a ``command`` run under the engine's bubblewrap on Linux, and under the
  local Landlock boundary (its outer bubblewrap): ``--unshare-net`` gives the
  jail a network namespace of its own holding only its own loopback device
  (bubblewrap brings it up: 127.0.0.1 there is the jail's, not the host's),
  so no socket reaches any IP address outside it — the host's loopback
  included (tests/confine/test_network.py connects to a server on the host)
  — nor an abstract unix socket. Unix sockets on the filesystem are NOT cut
  (a namespace does not cover them): a daemon's socket the jail can name
  (docker, D-Bus, a resolver's) still answers. saphan denies the store's own
  sockets in every jail (store/reach.py). vsock is not cut either;
- a ``codex`` run: Codex's own sandbox, pinned by saphan with the per-run
  permission profile's ``network.enabled = false``, takes the network from
  every command the model runs (measured: EPERM on a socket). The Codex
  process itself still talks to its model provider.

Where it is refused:

- ``claude`` and ``loop`` runs: the agent process itself must reach its
  model endpoint, and it shares the jail with the commands it runs, so no
  network cut leaves the one and takes the other. With an egress policy
  (egress/cut.py) whose credential route serves the agent, the class's
  ``off`` is enforced instead as a cut whose door serves only the routes;
- Seatbelt (macOS): a network rule is not measured on this build's CI;
- ``run.confinement = vendor`` for Claude Code: the engine composes nothing;
- runs on SSH machines: the launcher has no network lever in this build.
"""

from __future__ import annotations

from saphan import refusals

#: what enforces ``network: off`` on each path that can (see :func:`lever`)
BWRAP_LEVER = ("a network namespace of its own (bubblewrap --unshare-net): only its own "
               "loopback device; no IP address outside the jail is reachable, the host's loopback "
               "included, nor an abstract unix socket. Not cut: unix sockets on the filesystem "
               "(a daemon's socket the jail can name is still reachable) and vsock")
CODEX_LEVER = ("Codex's own sandbox takes the network from every command the model runs "
               "(pinned: network.enabled = false); the codex process itself still reaches its "
               "model provider")


def lever(*, tool: str, mechanism: str) -> str | None:
    """What enforces ``network: off`` for ``tool`` under ``mechanism``
    (``bubblewrap``, ``landlock``, ``seatbelt``, ``vendor:claude``,
    ``vendor:codex``, ``ssh``), or None when nothing on that path can."""
    if mechanism == "vendor:codex":
        return CODEX_LEVER
    if tool == "command" and mechanism in ("bubblewrap", "landlock"):
        return BWRAP_LEVER
    return None


def _why(tool: str, mechanism: str) -> str:
    if tool in ("claude", "loop") and not mechanism.startswith("vendor"):
        return (f"the {tool} agent itself must reach its model endpoint from inside the jail, "
                "so the jail's network cannot be cut without a door (give the run an egress "
                "policy whose credential route serves the agent: then `off` is a cut whose "
                "door serves only that route)")
    if mechanism == "seatbelt":
        return "a Seatbelt network rule is not measured in this build"
    if mechanism == "ssh":
        return "saphan-launcher on a runner has no network lever in this build"
    return f"{mechanism} composes no network cut"


def posture(network: str | None, *, tool: str, mechanism: str) -> tuple[str, str | None]:
    """``(posture, lever)`` for a run whose class says ``network`` (None: no
    class, no claim): ``("open", None)``, or ``("off", what enforces it)``.

    Raises the ``network-posture-unenforceable`` refusal when ``network`` is
    ``off`` and nothing on the run's path enforces it."""
    if network != "off":
        return "open", None
    how = lever(tool=tool, mechanism=mechanism)
    if how is None:
        raise refusals.network_posture_unenforceable(
            f"the permission class says `network: off` (its default when it names none), and "
            f"a {tool} run under {mechanism} cannot enforce it: {_why(tool, mechanism)}",
            "say `\"network\": \"open\"` in the class (the record then says the network is not "
            "restricted), or run the work where the cut is enforced: a command slot on a Linux "
            "control plane, or a codex slot",
        )
    return "off", how
