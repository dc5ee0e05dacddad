"""One cut run: what its egress policy allows, its door, and what the jail holds.

A run with an egress policy (``saphan run --egress-policy FILE``, or a
permission class naming one) gets a network namespace of its own holding
only loopback (bubblewrap ``--unshare-net``, confine/bwrap.py). Its one way
out is the door (egress/door.py): a proxy in this, the unconfined, process,
served on a unix socket in the run's directory, bound read-only into the jail
and exposed there on ``127.0.0.1:DOOR_PORT`` by the jail's first process
(``saphan-launcher reap --bridge``). Inside, the proxy variables name the door
with the run's token; a credential route's tool holds a placeholder where its
key would be, and the door puts the real secret on the upstream leg.

Codex confines itself; its run is cut around its own sandbox
(compose.cut_around: a bubblewrap adding only namespaces).

Where a cut cannot be made the run is refused before its seat
(:func:`refuse_unless_cuttable`): a Landlock lane (``egress-unsupported-lane``:
no network lever there), Claude Code confined by itself alone
(``egress-unsupported-tool``), a platform whose network rule is not measured
(``egress-uncuttable``) — never an open run.
"""

from __future__ import annotations

import os
import platform
import secrets as random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saphan import refusals
from saphan.confine.policy import DOOR_PORT, DOOR_SOCKET
from saphan.egress.policy import EgressPolicy, RouteSpec

if TYPE_CHECKING:
    from saphan.egress.door import Door
    from saphan.tools.adapter import Adapter
    from saphan.tools.auth import Target

#: the proxy variables every cut run gets (both spellings: curl reads only
#: the lower-case http_proxy)
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
              "all_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
#: the run's placeholder, for a command that uses a credential route itself
#: (``curl -H "Authorization: Bearer $SAPHAN_EGRESS_PLACEHOLDER"
#: http://127.0.0.1:3128/<route>/…``); set only when the policy has routes
PLACEHOLDER_VAR = "SAPHAN_EGRESS_PLACEHOLDER"
#: a tool's key variables by the header its route carries the secret in
#: (Codex: its pinned provider's env_key, :attr:`Cut.key_var`)
_KEY_VARS = {
    ("claude", "x-api-key"): "ANTHROPIC_API_KEY",
    ("claude", "authorization"): "ANTHROPIC_AUTH_TOKEN",
}
#: every provider credential variable an agent could read: removed from a
#: routed run's jail (the served tool gets its one variable back, the placeholder)
_PROVIDER_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
                  "OPENAI_API_KEY", "CODEX_API_KEY")
#: what the record says of the agent's credential when a route serves it:
#: what saphan did and checked, no more (a key stored in a file the user can
#: read elsewhere stays readable: reads are not restricted)
NO_PROVIDER_KEY = ("the agent was given no provider key: its key variable holds a per-run "
                   "placeholder, which the door checked and replaced with the real secret on "
                   "the upstream leg; every provider key variable was removed from the jail, "
                   "and the route's secret files and the tool's stored login are unreadable "
                   "in it")


def refuse_unless_cuttable(*, tool: str, mechanism: str, where: str) -> None:
    """The refusal for a run whose path cannot carry an egress policy."""
    if mechanism == "landlock" or where != "local":
        raise refusals.egress_unsupported_lane(
            f"this run declares an egress policy, and it would run under "
            f"{'Landlock' if where == 'local' else 'saphan-launcher on ' + where}, "
            "where this build has no network lever: it would run with the network open",
            "run it on the control plane's bubblewrap boundary (a slot on a --local machine, "
            "without --boundary landlock), or drop --egress-policy",
        )
    if mechanism == "vendor:codex" and platform.system() != "Linux":
        raise refusals.egress_uncuttable(
            "this run declares an egress policy, and saphan cuts a Codex run with a network "
            "namespace around the codex process, which this control plane "
            f"({platform.system()}) does not have",
            "run egress-policy Codex runs on a Linux control plane",
        )
    if mechanism.startswith("vendor:") and mechanism != "vendor:codex":
        raise refusals.egress_unsupported_tool(
            f"this run declares an egress policy, and {tool} confines itself "
            f"({mechanism}): saphan composes no jail around it to cut, and the tool's own "
            "network setting governs only the commands it runs, not the tool",
            f"run the work under saphan's own boundary (`run.confinement = engine`); a {tool} "
            "run confined by the tool alone cannot carry an egress policy in this build",
        )
    if mechanism not in ("bubblewrap", "vendor:codex"):
        raise refusals.egress_uncuttable(
            f"this run declares an egress policy, and this control plane's boundary is "
            f"{mechanism}, whose network rule is not measured in this build",
            "run egress-policy runs on a Linux control plane (bubblewrap)",
        )


@dataclass
class Cut:
    """The run's cut, from its egress policy."""

    policy: EgressPolicy
    #: the directory holding the door's socket (in the run's directory)
    door_dir: str = ""
    #: the tool whose model endpoint a route serves (None: none)
    tool: str = ""
    #: ``network: off`` from a class with a policy: the door serves routes only
    routes_only: bool = False
    token: str = field(default_factory=lambda: random.token_urlsafe(24), repr=False)
    placeholder: str = field(default_factory=lambda: "saphan-placeholder-"
                             + random.token_urlsafe(24), repr=False)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    door: Door | None = None
    summary: dict[str, Any] | None = None
    #: the variable the served tool reads its key from (set by :meth:`adapter`)
    key_var: str | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.door_dir, DOOR_SOCKET)

    @property
    def route(self) -> RouteSpec | None:
        return self.policy.route_for(self.tool)

    def door_url(self, route: RouteSpec) -> str:
        return f"http://127.0.0.1:{DOOR_PORT}/{route.name}"

    def check_route(self, adapter: Adapter) -> None:
        """A route serving this run's tool leads where the slot (or lane)
        says, in the shape the tool sends its key."""
        route = self.route
        if route is None and self.tool == "codex":
            raise refusals.policy_invalid(
                f"egress policy {self.policy.source} has no route with \"tool\": \"codex\": a "
                "cut Codex run reaches its provider only through a credential route (it "
                "would retry a denied endpoint until its time limit)",
                "add a route for codex whose upstream is the slot's endpoint (`saphan egress "
                "check FILE` shows the routes)",
            )
        if route is None:
            return
        endpoint, shapes = _tool_endpoint(adapter)
        if endpoint is None or endpoint.rstrip("/") != route.upstream:
            raise refusals.policy_invalid(
                f"egress policy {self.policy.source}: route {route.name} serves the "
                f"{self.tool} agent with upstream {route.upstream}, but this run's endpoint is "
                f"{endpoint or 'none'}: a run's endpoint comes from its slot (or lane)",
                f"make the route's upstream {endpoint}, or name the route's upstream on the "
                "slot (`saphan slot set MACHINE SLOT --endpoint URL`)",
            )
        if (route.header, route.prefix) not in shapes:
            wanted = " or ".join(f"{h!r} with prefix {p!r}" for h, p in shapes)
            raise refusals.policy_invalid(
                f"egress policy {self.policy.source}: route {route.name} carries its secret in "
                f"{route.header!r} with prefix {route.prefix!r}, which is not where the "
                f"{self.tool} agent sends its key",
                f"give the route `header`/`prefix` {wanted}",
            )

    def adapter(self, adapter: Adapter) -> Adapter:
        """The tool pointed at the door: its base URL is the route's door
        address, and the key it holds (a loop's pipe) is the placeholder."""
        route = self.route
        if route is None:
            return adapter
        from dataclasses import replace

        if self.tool == "claude":
            from saphan.tools.claude import ClaudeAdapter

            assert isinstance(adapter, ClaudeAdapter)
            self.key_var = _KEY_VARS.get((self.tool, route.header))
            return replace(adapter, endpoint=self.door_url(route))
        if self.tool == "codex":
            from saphan.tools.codex import CodexAdapter, Provider

            assert isinstance(adapter, CodexAdapter)
            was = adapter.provider
            # A provider of saphan's at the door (the built-in one's base URL
            # cannot be pointed elsewhere), reading the placeholder from the
            # same variable.
            self.key_var = was.env_key if was is not None else "OPENAI_API_KEY"
            return replace(adapter, provider=Provider(
                base_url=self.door_url(route), env_key=self.key_var,
                wire_api=was.wire_api if was is not None else "responses"))
        if self.tool == "loop":
            from saphan.loop.adapter import LoopAdapter

            assert isinstance(adapter, LoopAdapter)
            return replace(adapter, lane=replace(adapter.lane, base_url=self.door_url(route)),
                           secret=self.placeholder.encode("ascii"),
                           scrub_values=(*adapter.scrub_values, adapter.secret))
        return adapter

    def auth_target(self, target: Target) -> Target:
        """The pre-flight of a routed tool: the route's secret against its
        upstream (the slot's endpoint), from this process — the run's own
        key, if any, is not what the upstream will see."""
        route = self.route
        if route is None:
            return target
        from dataclasses import replace

        from saphan.tools.auth import _SECRET_HEADERS

        kept = {k: v for k, v in target.headers.items() if k.lower() not in _SECRET_HEADERS}
        return replace(target, credential=f"egress route {route.name} ({route.secret_source()})",
                       headers={**kept, route.header: route.prefix + self.secrets[route.name]},
                       login_file=None)

    def read_denials(self) -> tuple[str, ...]:
        """What the jail must not read: every route's secret file, and when a
        route serves the tool, the tool's own stored login (it would be a
        provider key the agent holds)."""
        out = [r.secret_file for r in self.policy.routes if r.secret_file is not None]
        if self.route is not None and self.tool == "claude":
            from saphan.tools.claude import config_home

            out.append(os.path.join(config_home(), ".credentials.json"))
        if self.route is not None and self.tool == "codex":
            from saphan.tools.codex import codex_home

            out.append(os.path.join(codex_home(), "auth.json"))
        return tuple(dict.fromkeys(out))

    def check_apart(self, writable: tuple[str, ...], class_source: str | None) -> None:
        """The policy, its secret files and a class naming it must lie
        outside what the run may write: a run that rewrote them would
        reconfigure the next run's door (or read a secret it planted)."""
        named = [("egress policy", self.policy.source),
                 *(("the route secret file", r.secret_file) for r in self.policy.routes
                   if r.secret_file is not None),
                 *((("the run's permission class", class_source),) if class_source else ())]
        for what, path in named:
            real = os.path.realpath(path)
            inside = next((w for w in writable
                           if real == w or real.startswith(w.rstrip("/") + "/")), None)
            if inside is not None:
                raise refusals.policy_invalid(
                    f"{what} {path} lies inside {inside}, which this run may write: the run "
                    "could rewrite it for the next run (its allow-list, its routes)",
                    f"keep {path} outside every directory a run works in (e.g. under "
                    "/etc/saphan or your config directory)",
                )

    def variables(self) -> tuple[str, ...]:
        """The names this cut sets in the jail's environment."""
        return (*PROXY_VARS, *NO_PROXY_VARS,
                *((PLACEHOLDER_VAR,) if self.policy.routes else ()),
                *((self.key_var,) if self.key_var else ()))

    def read_secrets(self, env: Mapping[str, str]) -> None:
        """Every route's secret, read now (before the seat: a missing one is
        refused, nothing held)."""
        from saphan.egress.policy import read_secret

        self.secrets = {r.name: read_secret(r, env) for r in self.policy.routes}

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The jail's environment: the proxy variables naming the door with
        the run's token, NO_PROXY empty, the served tool's key variable set to
        the placeholder; any variable holding a route's real secret removed."""
        values = tuple(self.secrets.values())
        out = {k: v for k, v in env.items() if not any(s in v for s in values)}
        proxy = f"http://saphan:{self.token}@127.0.0.1:{DOOR_PORT}"
        out.update({name: proxy for name in PROXY_VARS})
        out.update({name: "" for name in NO_PROXY_VARS})
        if self.policy.routes:
            out[PLACEHOLDER_VAR] = self.placeholder
        route = self.route
        if route is not None:
            for name in (*_PROVIDER_VARS, *((self.key_var,) if self.key_var else ())):
                out.pop(name, None)
            if self.key_var is not None:
                out[self.key_var] = self.placeholder
        return out

    def start(self, audit_path: str) -> None:
        """The door, listening on its socket before the jail starts."""
        from saphan.egress.door import Allow, Door, Route

        allow = () if self.routes_only else tuple(
            Allow(a.host, a.ports) for a in self.policy.allow)
        routes = tuple(Route(r.name, r.upstream, r.header, r.prefix, self.secrets[r.name])
                       for r in self.policy.routes)
        door = Door(self.socket_path, token=self.token, placeholder=self.placeholder,
                    allow=allow, routes=routes, audit_path=audit_path)
        try:
            door.start()
        except OSError as e:
            raise refusals.egress_uncuttable(
                f"the run's door could not listen on {self.socket_path}: {e}",
                "check that saphan's workspace is on a local filesystem that holds unix "
                "sockets, with room left, and run again",
            ) from None
        self.door = door

    def stop(self) -> dict[str, Any] | None:
        if self.door is not None and self.summary is None:
            self.summary = self.door.stop()
        return self.summary

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cut": "a network namespace of its own (only loopback): the door is the one way out",
            "policy": self.policy.as_record(),
            "door": {"socket": self.socket_path, "jail_address": f"127.0.0.1:{DOOR_PORT}",
                     "bridge": "saphan-launcher reap --bridge (the jail's first process)",
                     "token": "per run, in the proxy variables (Proxy-Authorization)"},
        }
        if self.routes_only:
            out["connect"] = ("none: the permission class says `network: off`, so the door "
                              "serves only its credential routes")
        if self.route is not None:
            out["agent_credential"] = NO_PROVIDER_KEY
            stored = self.stored_keys()
            if stored:
                out["agent_credential_readable"] = stored
        return out

    def stored_keys(self) -> list[str]:
        """Keys the served tool keeps where the jail can still read them
        (the record says so; saphan does not rewrite the tool's config)."""
        if self.route is None or self.tool != "claude":
            return []
        import json

        from saphan.tools.claude import config_home

        found = []
        for path in {os.path.join(config_home(), ".claude.json"),
                     os.path.expanduser("~/.claude.json")}:
            try:
                with open(path, "rb") as f:
                    data = json.loads(f.read(1 << 22))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("primaryApiKey"):
                found.append(f"{path} holds a stored API key (primaryApiKey), readable in the "
                             "jail: remove it (`claude /logout`) for the run to hold none")
        return sorted(found)

    def network_note(self) -> str:
        connect = ("only the credential routes" if self.routes_only or not self.policy.allow
                   else ", ".join(f"{a.host}:{'/'.join(map(str, a.ports))}"
                                  for a in self.policy.allow))
        return (f"egress policy {self.policy.name or self.policy.source}: cut (a network "
                f"namespace of its own); the door allows {connect}")


def _tool_endpoint(adapter: Adapter) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The endpoint a tool's run talks to, and the (header, prefix) shapes it
    sends its key in."""
    if adapter.tool == "claude":
        from saphan.tools import claude

        assert isinstance(adapter, claude.ClaudeAdapter)
        return (adapter.endpoint or claude.DEFAULT_ENDPOINT,
                (("x-api-key", ""), ("authorization", "Bearer ")))
    if adapter.tool == "loop":
        from saphan.loop.adapter import LoopAdapter

        assert isinstance(adapter, LoopAdapter)
        return adapter.lane.base_url, (("authorization", "Bearer "),)
    if adapter.tool == "codex":
        from saphan.tools import codex

        assert isinstance(adapter, codex.CodexAdapter)
        base = adapter.provider.base_url if adapter.provider is not None else codex.OPENAI_BASE_URL
        return base, (("authorization", "Bearer "),)
    return None, ()
