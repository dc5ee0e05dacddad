"""The `saphan` command line: a thin layer over saphan.Engine.

Exit codes: 0 done; 1 the run's command failed or an environment error;
2 bad input (one line naming the thing and the fix; nothing written);
3 a refusal (``refused [class]: …`` / ``fix: …``). Heavy modules (the engine,
the store drivers, paramiko) are imported inside the verbs, never here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from saphan.engine import Engine
    from saphan.records import RunRecord

EXIT_FAILED = 1
#: the most seats a slot may have (a bigger number is bad input, exit 2)
MAX_SESSIONS = 1_000_000
#: `saphan run --wait`: bare, and at most (seconds)
DEFAULT_WAIT, MAX_WAIT = 600.0, 86_400.0


def _engine(ctx: click.Context) -> Engine:
    from saphan.engine import Engine

    obj = ctx.find_root().obj
    if obj.get("engine") is None:
        obj["engine"] = Engine(obj.get("home"))
        obj["engine"].ctx.verb = ctx.command_path  # named in what reconciliation writes
        # SSH connections (and the store) are closed when the command ends.
        ctx.find_root().call_on_close(obj["engine"].close)
    engine: Engine = obj["engine"]
    return engine


def _emit_json(value: Any) -> None:
    import json

    click.echo(json.dumps(value, indent=2, sort_keys=True))


def _emit_compact(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    # One word per header and "-" for an empty cell: `awk '{print $N}'` stays on column N.
    cells = [[("-" if c is None or str(c) == "" else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    click.echo("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from saphan import __version__, launcher

    click.echo(f"saphan {__version__}")
    ident = launcher.identity()
    if ident is None:
        click.echo("saphan-launcher: not found (run ci/setup, or set SAPHAN_LAUNCHER)")
    else:
        click.echo(f"saphan-launcher {ident.version} sha256:{ident.sha256} ({ident.path})")
    ctx.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home", envvar="SAPHAN_HOME", type=click.Path(file_okay=False), default=None,
    help="Workspace directory (default: $SAPHAN_HOME, else ~/.saphan).",
)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show saphan's and the launcher's version and SHA-256.")
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """saphan runs coding agents inside an operating-system write boundary and
    records what enforced it.

    \b
    Quick start (local machine, generic command):
      saphan init
      saphan machine add here --local
      saphan slot add here s1 --tool command --max-sessions 2
      saphan run --machine here --slot s1 --workdir ./wd -- sh -c 'echo hi > out.txt'
      saphan runs show last

    A run that cannot be confined does not happen: it is refused by name
    (exit 3) and the refusal is recorded. See docs/ for what each boundary
    gives and does not give.
    """
    ctx.obj = {"home": home, "engine": None}


# -- workspace ------------------------------------------------------------------

@cli.command()
@click.option("--database-url", default=None, metavar="URL",
              help='Store: "sqlite" (default, in the workspace) or postgresql://… (shared; '
                   "a unix socket: postgresql://USER@/DB?host=/var/run/postgresql).")
@click.option("--join", is_flag=True,
              help="Join the fleet sharing that store: take its key from --key-file.")
@click.option("--key-file", default=None, metavar="FILE|-",
              help="With --join: the fleet key (a fleet workspace's record.key, owner-only "
                   "0600), or - to read it from a pipe.")
@click.option("--new-key", is_flag=True,
              help="Mint a record key where it is missing (says which signed rows it leaves "
                   "unverifiable).")
@click.pass_context
def init(ctx: click.Context, database_url: str | None, join: bool, key_file: str | None,
         new_key: bool) -> None:
    """Create the workspace: config.toml, the record key (0600) and the database.

    All or nothing: the store is connected to and migrated before anything is
    written, and a failure leaves nothing behind. On an existing workspace,
    --database-url changes the store only once the new one is reachable and
    migrated. A key is never overwritten, and a missing one is refused (not
    quietly replaced): restore it, --join the fleet's, or --new-key.
    """
    engine = _engine(ctx)
    done = engine.init(database_url=database_url, key_file=key_file, join=join,
                       new_key=new_key)
    for path in done:
        click.echo(f"created {path}")
    for note in done.notes:
        click.echo(f"note: {note}")
    if done.changed:
        click.echo(f"workspace ready at {engine.workspace.home} (store: "
                   f"{engine.store.description}; record key id {done.key_id})")
    else:
        click.echo(f"workspace {engine.workspace.home} already exists; nothing changed "
                   f"(record key id {done.key_id})")


@cli.group()
def db() -> None:
    """The store's schema."""


@db.command("migrate")
@click.pass_context
def db_migrate(ctx: click.Context) -> None:
    """Apply pending schema migrations (also done automatically on first use)."""
    engine = _engine(ctx)
    applied = engine.migrate()
    from saphan.store.migrations import LATEST

    if applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))}; schema at version {LATEST}")
    else:
        click.echo(f"schema at version {LATEST}; nothing to apply ({engine.store.description})")


# -- machines -------------------------------------------------------------------

@cli.group()
def machine() -> None:
    """Machines that run agents: this host (--local) or reached over SSH."""


@machine.command("add")
@click.argument("name")
@click.option("--local", "local", is_flag=True, help="This host.")
@click.option("--ssh", metavar="USER@HOST[:PORT]|ALIAS", default=None,
              help="Reach the machine over SSH (a Host of ~/.ssh/config works too: its "
                   "HostName, User, Port, IdentityFile and ProxyJump are honoured).")
@click.option("--identity", type=click.Path(dir_okay=False), default=None,
              help="Private key for --ssh (an encrypted one is asked for on a terminal).")
@click.option("--ssh-agent", "ssh_agent", is_flag=True,
              help="Also authenticate with the keys of your ssh-agent (opt-in).")
@click.option("--expect-fingerprint", metavar="SHA256:…", default=None,
              help="Pin only if the machine presents this host key (from its owner).")
@click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
              help="Pin only a host key this known_hosts file lists for it.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
              help="Read this SSH client config instead of ~/.ssh/config.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label casts match (`saphan run --tool T --label KEY=VALUE`); repeatable.")
@click.pass_context
def machine_add(
    ctx: click.Context, name: str, local: bool, ssh: str | None, identity: str | None,
    ssh_agent: bool, expect_fingerprint: str | None, known_hosts: str | None,
    ssh_config: str | None, labels: tuple[str, ...],
) -> None:
    """Register a machine. For --ssh the host key is fetched, checked against
    --expect-fingerprint / --known-hosts when given (otherwise shown here and
    pinned on first use), and logging in is tried before anything is saved;
    every later connection trusts exactly that key."""
    from saphan.fleet import labels as labels_mod

    labels_mod.parse_all(labels)  # bad input: nothing is added
    engine = _engine(ctx)
    m = engine.add_machine(name, local=local, ssh=ssh, identity=identity,
                           ssh_agent=ssh_agent, expect_fingerprint=expect_fingerprint,
                           known_hosts=known_hosts, ssh_config=ssh_config)
    click.echo(f"added machine {m.name} ({m.address()})")
    if labels:
        got = labels_mod.set_labels(engine.ctx, m.name, "", labels, ())
        click.echo(f"labels: {_labels_text(got)}")
    if m.host_key:
        from saphan.transport.ssh import HostKey

        key = HostKey(m.host_key)
        how = ("it matched what you gave" if expect_fingerprint or known_hosts else
               "compare it with the machine's own `ssh-keygen -lf` of its host key")
        click.echo(f"pinned host key {key.type} {key.fingerprint} ({how}); any other key is "
                   "refused")
    if m.proxy_jump:
        jump_target, _, jump_key = m.proxy_jump.partition(" ")
        from saphan.transport.ssh import HostKey

        click.echo(f"through jump host {jump_target}: pinned host key "
                   f"{HostKey(jump_key).fingerprint}")


@machine.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def machine_list(ctx: click.Context, as_json: bool) -> None:
    """List machines (and their labels)."""
    from saphan.fleet.labels import all_labels

    engine = _engine(ctx)
    ms = engine.machines()
    labels = all_labels(engine.ctx)
    if as_json:
        _emit_json([{**m.as_dict(), "labels": labels.get((m.name, ""), {})} for m in ms])
        return
    _table(["name", "transport", "address", "added", "labels"],
           [[m.name, m.transport, m.address(), m.created_at,
             _labels_text(labels.get((m.name, ""), {}))] for m in ms])


@machine.command("set")
@click.argument("name")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="Set a label (repeatable); one already there with KEY is replaced.")
@click.option("--unlabel", "unlabels", multiple=True, metavar="KEY",
              help="Remove the label KEY (repeatable).")
@click.pass_context
def machine_set(ctx: click.Context, name: str, labels: tuple[str, ...],
                unlabels: tuple[str, ...]) -> None:
    """Change a machine's labels (all or nothing). A slot's own label of the
    same KEY overrides its machine's when a cast matches."""
    from saphan.errors import UserError
    from saphan.fleet import labels as labels_mod

    if not labels and not unlabels:
        raise UserError("nothing to change: give --label KEY=VALUE or --unlabel KEY")
    got = labels_mod.set_labels(_engine(ctx).ctx, name, "", labels, unlabels)
    click.echo(f"machine {name} labels: {_labels_text(got)}")


def _labels_text(labels: dict[str, str]) -> str:
    from saphan.confine.protected import printable

    return printable(",".join(f"{k}={v}" for k, v in sorted(labels.items()))) or "-"


@machine.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def machine_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show a machine, its slots and its measured (signed) facts."""
    engine = _engine(ctx)
    m = engine.machine(name)
    slots = engine.slots(name)
    facts = engine.machine_facts(name)
    from saphan.fleet import machines
    from saphan.fleet.labels import all_labels

    every = all_labels(engine.ctx)
    value = {
        **m.as_dict(),
        "labels": every.get((name, ""), {}),
        "slots": [{**s.as_dict(), "labels": every.get((name, s.name), {})} for s in slots],
        "facts": facts,
        "agents": machines.agents(engine.ctx, name, slots, facts),
    }
    if as_json:
        _emit_json(value)
        return
    for k in ("name", "transport", "address", "identity_file", "host_key", "created_at"):
        if value.get(k) is not None:
            click.echo(f"{k}: {value[k]}")
        if k == "host_key" and value.get(k):
            from saphan.transport.ssh import fingerprint

            click.echo(f"host_key_fingerprint: {fingerprint(value[k])}")
    click.echo(f"labels: {_labels_text(value['labels'])}")
    click.echo("slots:" if value["slots"] else "slots: none")
    for s in value["slots"]:
        click.echo(f"  {s['slot']}  tool={s['tool']}  max_sessions="
                   f"{s['max_sessions'] or '1 (default)'}  labels={_labels_text(s['labels'])}")
    click.echo("agents:" if value["agents"] else "agents: none delivered or configured")
    for a in value["agents"]:
        measured = (f"sha256 {a['sha256']}, {a['version'] or 'version not measured'}"
                    if a.get("sha256") else "not run there yet; measured there at every run")
        from saphan.confine.protected import printable

        click.echo(printable(f"  {a['tool']}: {a['path']} ({a['source']}; {measured})"))
    click.echo("facts:" if value["facts"] else "facts: none measured")
    for kind, fact in value["facts"].items():
        if "unverified_value" in fact:  # signed by a key not held here (records.foreign_fact)
            from saphan.confine.protected import printable

            click.echo(printable(
                f"  {kind}: signed by key {fact['signature']['key_id']}, not held here "
                f"(measured {fact['measured_at']}; not verified here, nothing is decided on "
                f"it): {_emit_compact(fact['unverified_value'])}"))
            continue
        click.echo(f"  {kind}: {_emit_compact(fact['value'])} "
                   f"(measured {fact['measured_at']})")


@machine.command("probe-confinement")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def machine_probe_confinement(ctx: click.Context, name: str, as_json: bool) -> None:
    """Measure NAME's Landlock level with saphan-launcher and record it.

    The measured value is written onto the machine's signed row; it is the
    only way that value is ever written. There is deliberately no option to
    type a level, override it or force it. On an SSH machine the launcher
    delivered by `saphan machine deliver` measures, on that machine.
    """
    value = _engine(ctx).probe_confinement(name)
    if as_json:
        _emit_json(value)
        return
    from saphan.confine.landlock_gate import floor

    verdict = ("meets the floor" if value["level"] >= floor()
               else f"is below the floor of {floor()}: Landlock runs there will be refused")
    click.echo(f"{name}: landlock level {value['level']} ({value['reason']}, kernel "
               f"{value['kernel_release']}) {verdict}; measured with saphan-launcher "
               f"{value['launcher_version']} sha256:{value['launcher_sha256']}")


@machine.command("probe-container")
@click.argument("name")
@click.option("--image", required=True, metavar="REF@sha256:DIGEST",
              help="The image to run, pinned by its digest (it must already be on NAME).")
@click.option("--expect-output", default=None, metavar="TEXT",
              help="Require the container's output to contain TEXT (else: exit 0 is required).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def machine_probe_container(ctx: click.Context, name: str, image: str,
                            expect_output: str | None, as_json: bool) -> None:
    """Run the pinned image by digest with NAME's container runtime (podman,
    else docker; over its own transport) and require the outcome; then write
    the signed docker-oci row for that digest and NAME's runtime, vm_cpus and
    vm_memory_bytes (this probe is their only writer). A cast with --image
    DIGEST reads the row while it is fresh ([cast] image_fresh_seconds).
    Eligibility is a routing fact: runs are not executed in a container.
    Exit 1 when a step fails (nothing is written)."""
    from saphan.fleet.container_probe import ProbeFailed

    try:
        got = _engine(ctx).probe_container(name, image, expect_output=expect_output)
    except ProbeFailed as e:
        from saphan.confine.protected import printable

        click.echo(printable(f"saphan: probe-container {name}: {e}; nothing was written"),
                   err=True)
        ctx.exit(EXIT_FAILED)
    if as_json:
        _emit_json(got)
        return
    row = got["rows"][next(k for k in got["rows"] if k.startswith("docker-oci:"))]
    from saphan.confine.protected import printable

    click.echo(printable(
        f"{name}: {row['runtime_version']} ran {row['image']} ({row['outcome']}); rows "
        f"written: {', '.join(got['rows'])} (measured {got['measured_at']})"))


@machine.command("deliver")
@click.argument("names", nargs=-1, metavar="[MACHINE]...")
@click.option("--all", "all_machines", is_flag=True, help="Every --ssh machine.")
@click.option("--probe", is_flag=True,
              help="Then measure each machine's Landlock level with the launcher just "
                   "installed (as probe-confinement does).")
@click.option("--agent", type=click.Choice(["codex", "loop"]), default=None,
              help="Deliver an agent instead of the launcher, into the same far directory's "
                   "agents/: codex, its native binary (the one this host runs; codex slots "
                   "there run it unless they name an --agent-path); loop, saphan's loop as "
                   "one zipapp (loop slots there run it with their --agent-path Python).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def machine_deliver(
    ctx: click.Context, names: tuple[str, ...], all_machines: bool, probe: bool,
    agent: str | None, as_json: bool
) -> None:
    """Install saphan-launcher on SSH machines, in parallel.

    Each machine receives it under a temporary name, computes its SHA-256
    itself (`sha256sum < FILE`, under `set -eu`), and only a match is moved
    into place as ~/.saphan/w-<id>/bin/saphan-launcher; the installed file's digest
    and --version are then re-resolved there and written onto the machine's
    signed row. Any mismatch is refused (digest-mismatch) and the previously
    installed launcher stays. Exit 3 if any machine refused, 1 if any failed.
    """
    engine = _engine(ctx)
    count = len(names) or len([m for m in engine.machines() if m.transport == "ssh"])
    if as_json:
        from saphan.fleet.delivery import as_row

        results = engine.deliver(list(names), all_machines=all_machines, probe=probe,
                                 agent=agent)
        _emit_json([as_row(r) for r in results])
    else:
        with click.progressbar(
            length=max(count, 1), label=f"delivering {agent or 'saphan-launcher'}",
            file=sys.stderr,
            show_pos=True, item_show_func=lambda item: item,
        ) as bar:
            def done(res: dict[str, Any]) -> None:
                bar.update(1, f"{res['machine']}: {res['result']}")

            results = engine.deliver(list(names), all_machines=all_machines, probe=probe,
                                     on_done=done, agent=agent)
        rows = []
        for res in results:
            landlock = ""
            if "probe" in res:
                landlock = f"level {res['probe']['level']}"
            elif "probe_error" in res:
                landlock = "probe failed"
            detail = (res.get("refusal") or {}).get("class") or res.get("error", "")
            rows.append([res["machine"], res["result"], (res.get("sha256") or "")[:16],
                         res.get("version", ""), landlock, detail if res["result"] != "installed"
                         else res.get("path", "")])
        headers = ["machine", "result", "sha256", "version"]
        if probe:
            headers.append("landlock")
        else:
            rows = [r[:4] + r[5:] for r in rows]
        _table([*headers, "detail"], rows)
        for res in results:
            if res["result"] != "installed":
                click.echo(f"{res['machine']}: {res['error']}", err=True)
            if "probe_error" in res:
                click.echo(f"{res['machine']}: probe: {res['probe_error']}", err=True)
    if any(r["result"] == "refused" for r in results):
        from saphan.errors import REFUSAL_EXIT_CODE

        ctx.exit(REFUSAL_EXIT_CODE)
    if any(r["result"] == "error" or "probe_error" in r for r in results):
        ctx.exit(EXIT_FAILED)


@machine.command("remove")
@click.argument("name")
@click.pass_context
def machine_remove(ctx: click.Context, name: str) -> None:
    """Remove a machine, its slots and facts (run history is kept)."""
    _engine(ctx).remove_machine(name)
    click.echo(f"removed machine {name}")


# -- slots ----------------------------------------------------------------------

@cli.group()
def slot() -> None:
    """Slots: named capacity on a machine, for one tool."""


def _run_default_options(f: Any) -> Any:
    """The slot's run defaults, on `slot add` and `slot set` alike (fleet/slots.py)."""
    for opt in reversed((
        click.option("--endpoint", default=None, metavar="URL",
                     help="claude, codex: the model API endpoint every run uses (claude: "
                          "ANTHROPIC_BASE_URL, set by saphan and taken from nowhere else; "
                          "codex: the pinned provider's base URL). Default: the tool's own."),
        click.option("--model", default=None, metavar="NAME",
                     help="claude, codex: the model when `saphan run` names none (else the "
                          "model saphan pins for the tool, docs/tools.md)."),
        click.option("--max-seconds", type=int, default=None, metavar="S",
                     help="claude, codex, loop: the wall-clock budget when `saphan run` gives "
                          "none (1..604800)."),
        click.option("--max-turns", type=int, default=None, metavar="N",
                     help="claude, loop: the model-turn budget when `saphan run` gives none "
                          "(1..10000)."),
        click.option("--agent-path", default=None, metavar="PATH",
                     help="claude, codex, loop: the agent's absolute path on the slot's "
                          "machine (never looked up on PATH there): Claude Code's executable, "
                          "Codex's native binary (default on an SSH machine: the one `machine "
                          "deliver --agent codex` installed), the loop's Python. Digest and "
                          "version are measured there at every run."),
    )):
        f = opt(f)
    return f


def _defaults_text(s: Any) -> str:
    parts = [f"{k}={v}" for k, v in (("endpoint", s.endpoint), ("model", s.model),
                                      ("max_seconds", s.max_seconds),
                                      ("max_turns", s.max_turns),
                                      ("agent_path", s.agent_path)) if v is not None]
    return ", ".join(parts) if parts else "none"


@slot.command("add")
@click.argument("machine_name", metavar="MACHINE")
@click.argument("slot_name", metavar="SLOT")
@click.option("--tool", required=True, type=click.Choice(["command", "claude", "codex", "loop"]),
              help="The agent tool this slot runs.")
@click.option("--max-sessions", type=click.IntRange(max=MAX_SESSIONS), default=None,
              help="Concurrent runs allowed, 1..1000000 (default: exactly one).")
@click.option("--pin-sha256", "pin", metavar="HEX", default=None,
              help="Refuse any run whose agent binary's SHA-256 is not HEX (digest-mismatch).")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label casts match (overrides the machine's label of the same KEY); "
                   "repeatable.")
@_run_default_options
@click.pass_context
def slot_add(
    ctx: click.Context, machine_name: str, slot_name: str, tool: str, max_sessions: int | None,
    pin: str | None, endpoint: str | None, model: str | None, max_seconds: int | None,
    max_turns: int | None, agent_path: str | None, labels: tuple[str, ...],
) -> None:
    """Add a slot to a machine.

    An agent slot may carry run defaults: e.g.
    saphan slot add here cl --tool claude --endpoint https://gw.example/anthropic
    --model claude-sonnet-4-5 --max-seconds 1800 --max-turns 40
    """
    from saphan.fleet import labels as labels_mod

    labels_mod.parse_all(labels)  # bad input: nothing is added
    engine = _engine(ctx)
    s = engine.add_slot(machine_name, slot_name, tool=tool, max_sessions=max_sessions,
                        agent_sha256=pin, endpoint=endpoint, model=model,
                        max_seconds=max_seconds, max_turns=max_turns, agent_path=agent_path)
    if labels:
        labels_mod.set_labels(engine.ctx, machine_name, slot_name, labels, ())
    pinned = f", agent pinned to sha256 {s.agent_sha256}" if s.agent_sha256 else ""
    defaults = _defaults_text(s)
    extra = f", run defaults {defaults}" if defaults != "none" else ""
    click.echo(f"added slot {s.name} on {s.machine} (tool {s.tool}, capacity {s.capacity}"
               f"{pinned}{extra})")


@slot.command("list")
@click.argument("machine_name", metavar="[MACHINE]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def slot_list(ctx: click.Context, machine_name: str | None, as_json: bool) -> None:
    """List slots (of one machine, or all), with their own labels."""
    from saphan.fleet.labels import all_labels

    engine = _engine(ctx)
    ss = engine.slots(machine_name)
    labels = all_labels(engine.ctx)
    if as_json:
        _emit_json([{**s.as_dict(), "labels": labels.get((s.machine, s.name), {})}
                    for s in ss])
        return
    _table(["machine", "slot", "tool", "max_sessions", "agent_pin", "labels"],
           [[s.machine, s.name, s.tool, s.max_sessions or 1, s.agent_sha256 or "-",
             _labels_text(labels.get((s.machine, s.name), {}))] for s in ss])


@slot.command("show")
@click.argument("machine_name", metavar="MACHINE")
@click.argument("slot_name", metavar="SLOT")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def slot_show(ctx: click.Context, machine_name: str, slot_name: str, as_json: bool) -> None:
    """Show a slot and who holds each of its ordinals, with liveness."""
    engine = _engine(ctx)
    s = engine.slot(machine_name, slot_name)
    holders = engine.holders(machine_name, slot_name)
    from saphan.fleet.labels import all_labels

    own = all_labels(engine.ctx).get((machine_name, slot_name), {})
    if as_json:
        _emit_json({**s.as_dict(), "labels": own, "capacity": s.capacity,
                    "holders": holders})
        return
    click.echo(f"slot {s.name} on {s.machine}: tool {s.tool}, capacity {s.capacity}, "
               f"{len(holders)} live")
    click.echo(f"agent pin: sha256 {s.agent_sha256}" if s.agent_sha256 else "agent pin: none")
    click.echo(f"run defaults: {_defaults_text(s)}")
    click.echo(f"labels: {_labels_text(own)}")
    _table(["ordinal", "run", "pid", "host", "since", "liveness"],
           [[h["ordinal"], h["run"], h["pid"], h["host"], h["since"], h["liveness"]]
            for h in holders])


@slot.command("set")
@click.argument("machine_name", metavar="MACHINE")
@click.argument("slot_name", metavar="SLOT")
@click.option("--max-sessions", type=click.IntRange(max=MAX_SESSIONS), default=None,
              help="New capacity, 1..1000000. Lowering never evicts a live run.")
@click.option("--pin-sha256", "pin", metavar="HEX", default=None,
              help="Pin the agent binary's SHA-256 (runs with another binary are refused).")
@click.option("--unpin", is_flag=True, help="Remove the agent binary pin.")
@_run_default_options
@click.option("--unset", "unset", multiple=True,
              type=click.Choice(["endpoint", "model", "max-seconds", "max-turns",
                                 "agent-path"]),
              help="Clear a run default (repeatable).")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="Set a label (repeatable; overrides the machine's of the same KEY).")
@click.option("--unlabel", "unlabels", multiple=True, metavar="KEY",
              help="Remove the slot's label KEY (repeatable).")
@click.pass_context
def slot_set(
    ctx: click.Context, machine_name: str, slot_name: str, max_sessions: int | None,
    pin: str | None, unpin: bool, endpoint: str | None, model: str | None,
    max_seconds: int | None, max_turns: int | None, agent_path: str | None,
    unset: tuple[str, ...], labels: tuple[str, ...], unlabels: tuple[str, ...],
) -> None:
    """Change a slot's capacity, agent binary pin, run defaults or labels (at least one)."""
    from saphan.errors import UserError
    from saphan.fleet.slots import check_run_defaults
    from saphan.tools.binaries import check_pin_format

    defaults = {"endpoint": endpoint, "model": model, "max_seconds": max_seconds,
                "max_turns": max_turns, "agent_path": agent_path}
    touched = any(v is not None for v in defaults.values()) or bool(unset)
    if max_sessions is None and pin is None and not unpin and not touched and not labels \
            and not unlabels:
        raise UserError("nothing to change: give --max-sessions N, --pin-sha256 HEX, --unpin, "
                        "a run default (--endpoint, --model, --max-seconds, --max-turns, "
                        "--agent-path), --unset NAME, --label KEY=VALUE or --unlabel KEY")
    from saphan.fleet import labels as labels_mod

    labels_mod.parse_all(labels)
    if pin is not None and unpin:
        raise UserError("give --pin-sha256 HEX or --unpin, not both")
    # Validate everything before writing anything.
    if pin is not None:
        check_pin_format(pin)
    if max_sessions is not None and max_sessions < 1:
        raise UserError(f"--max-sessions {max_sessions} is below 1; give N >= 1")
    engine = _engine(ctx)
    s = engine.slot(machine_name, slot_name)
    if touched:
        check_run_defaults(s.tool, **defaults)
    if max_sessions is not None:
        s = engine.set_max_sessions(machine_name, slot_name, max_sessions)
        click.echo(f"slot {s.name} on {s.machine} now has capacity {s.capacity}")
    if pin is not None or unpin:
        s = engine.set_agent_pin(machine_name, slot_name, None if unpin else pin)
        click.echo(f"slot {s.name} on {s.machine} now pins its agent binary to sha256 "
                   f"{s.agent_sha256}" if s.agent_sha256
                   else f"slot {s.name} on {s.machine} now pins no agent binary")
    if touched:
        s = engine.set_run_defaults(machine_name, slot_name,
                                    unset=tuple(u.replace("-", "_") for u in unset), **defaults)
        click.echo(f"slot {s.name} on {s.machine} run defaults: {_defaults_text(s)}")
    if labels or unlabels:
        got = labels_mod.set_labels(engine.ctx, machine_name, slot_name, labels, unlabels)
        click.echo(f"slot {s.name} on {s.machine} labels: {_labels_text(got)}")


@slot.command("remove")
@click.argument("machine_name", metavar="MACHINE")
@click.argument("slot_name", metavar="SLOT")
@click.pass_context
def slot_remove(ctx: click.Context, machine_name: str, slot_name: str) -> None:
    """Remove a slot (its runs' history is kept). Refused (exit 2) while a run
    holds one of its seats: let it finish, or `saphan runs cancel ID`."""
    from saphan.fleet import slots

    gone = slots.remove_slot(_engine(ctx).ctx, machine_name, slot_name)
    click.echo(f"removed slot {gone.name} on {gone.machine} (its run history is kept)")


# -- runs -----------------------------------------------------------------------

@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--machine", "machine_name", default=None,
              help="Machine to run on (with --slot); with --tool, only that machine's slots.")
@click.option("--slot", "slot_name", default=None,
              help="Slot on that machine. Without it, give --tool: the run is cast on the fleet.")
@click.option("--tool", "cast_tool", default=None, metavar="TOOL",
              help="Cast instead of naming a slot: any slot of TOOL (command, claude, codex, "
                   "loop) whose machine can give the run its boundary, in the documented order "
                   "(docs/fleet.md); refused fleet-full or no-eligible-slot, naming each.")
@click.option("--label", "cast_labels", multiple=True, metavar="KEY=VALUE",
              help="With --tool: only slots whose labels (or their machine's) say KEY=VALUE; "
                   "repeat for more.")
@click.option("--image", "cast_image", default=None, metavar="DIGEST",
              help="With --tool: only machines probed with this image digest within "
                   "[cast] image_fresh_seconds (`saphan machine probe-container`). A routing "
                   "fact, not a boundary: the run does not execute in a container.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Working directory (default: the current one). The only tree the run may write. "
                   "On an SSH machine: required, an absolute path there.")
@click.option("--repo", type=click.Path(file_okay=False), default=None,
              help="Run in a new linked worktree of this git repository, on branch "
                   "saphan/<run-id> (made outside the boundary; the run can commit there).")
@click.option("--base", "base_ref", default=None, metavar="REF",
              help="With --repo: the commit the worktree starts from (default HEAD).")
@click.option("--keep-worktree/--remove-worktree", default=True, show_default=True,
              help="With --repo: keep the worktree afterwards (the branch is always kept).")
@click.option("--boundary", type=click.Choice(["landlock"]), default=None,
              help="Enforce writes with saphan-launcher's Landlock domain (needs a probed "
                   "machine at or above the floor) instead of the platform's own boundary.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the final record as JSON on stdout (a refusal: the refused run's "
                   "record, or {\"refusal\": ...} when none was written); the command's own "
                   "output then streams to stderr.")
@click.option("--wait", "wait", type=click.FloatRange(0, MAX_WAIT), is_flag=False,
              flag_value=DEFAULT_WAIT, default=None, metavar="[SECS]",
              help=f"When the slot is full, try the same reservation again with backoff for up "
                   f"to SECS seconds (bare --wait: {DEFAULT_WAIT:.0f}; 0..{MAX_WAIT:.0f}) "
                   "instead of refusing seat-full at once. Nothing is held while waiting.")
@click.option("--exit-code", "exit_code", type=click.Choice(["saphan", "command"]),
              default="saphan", show_default=True,
              help="command: exit with the command's own status (a signal N: 128+N; none: "
                   "1); saphan: 0 when it exited 0, else 1.")
@click.option("--raw", is_flag=True,
              help="claude and codex slots: show the tool's raw event stream (JSONL) live. "
                   "Without it, when stdout is a terminal, they show one line per step (tool "
                   "call, file edited, command run, tokens so far) and a summary line, all "
                   "text escaped; when stdout is not a terminal the raw stream is shown, "
                   "unchanged for programs that read it. stdout.log always keeps the raw stream.")
@click.option("--prompt", default=None, metavar="TEXT",
              help="Agent slots (claude, codex, loop): the task, never on a command line.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), default=None,
              help="Agent slots: read the task from FILE.")
@click.option("--model", default=None, metavar="NAME",
              help="Agent slots: the model; pinned on the tool's command line, nothing else.")
@click.option("--permission-class", "permission_class", type=click.Path(dir_okay=False),
              default=None, help="A permission class JSON file (see `saphan policy check`).")
@click.option("--egress-policy", "egress_policy", type=click.Path(dir_okay=False),
              default=None, metavar="FILE",
              help="Cut the run's network: its own network namespace, and a per-run door "
                   "(an authenticated proxy) allowing only what FILE allows, adding its "
                   "credential routes' secrets outside the jail (see `saphan egress check`). "
                   "Refused, never run open, where it cannot be enforced.")
@click.option("--resume", "resume", default=None, metavar="RUN",
              help="Agent slots: continue RUN's tool session, explicitly and on the record "
                   "(the only way a session is ever continued).")
@click.option("--lane", default=None, metavar="NAME",
              help="Loop slots: the model lane (default: the only one declared).")
@click.option("--max-turns", type=int, default=None, metavar="N",
              help="Loop and claude slots: model turns before the run ends (loop default 50; "
                   "else the slot's default, if any).")
@click.option("--max-seconds", type=int, default=None, metavar="S",
              help="Agent slots: wall-clock budget in seconds (default: the slot's, else loop "
                   "1800, claude and codex 3600), after which the run's whole tree is ended: "
                   "time-limit-killed.")
@click.argument("command", nargs=-1, required=False, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context, machine_name: str | None, slot_name: str | None, workdir: str | None,
    repo: str | None, base_ref: str | None, keep_worktree: bool, boundary: str | None,
    as_json: bool, prompt: str | None, prompt_file: str | None, model: str | None,
    permission_class: str | None, resume: str | None, lane: str | None,
    max_turns: int | None, max_seconds: int | None, command: tuple[str, ...],
    raw: bool, wait: float | None, exit_code: str, egress_policy: str | None,
    cast_tool: str | None, cast_labels: tuple[str, ...], cast_image: str | None,
) -> None:
    """Run COMMAND inside the write boundary: saphan run --machine M --slot S -- CMD ARGS…

    Or cast it on the fleet: saphan run --tool command [--label K=V] -- CMD ARGS…

    On a claude or codex slot, give the task instead of a command:
    saphan run --machine M --slot S --prompt TEXT [--model NAME] [--resume RUN]

    On a loop slot (saphan's own agent loop), the lane names the endpoint and
    model: saphan run --machine M --slot S --prompt TEXT [--lane NAME]

    The run's output streams here and to $SAPHAN_HOME/runs/<id>/. Exit status:
    0 when the command exited 0, 1 when it failed, 3 when refused
    (--exit-code=command: the command's own status).
    """
    from click.core import ParameterSource

    from saphan.errors import UserError

    if repo is None and ctx.get_parameter_source("keep_worktree") is ParameterSource.COMMANDLINE:
        raise UserError(f"--{'keep' if keep_worktree else 'remove'}-worktree needs --repo (only "
                        "a --repo run has a worktree); drop it or give --repo PATH")
    if wait is not None and command and command[0].startswith("-"):
        # click leaves `--wait=-1`'s value on the command line: a negative wait, not a command
        raise click.BadParameter(f"{command[0]!r}: give seconds 0..{MAX_WAIT:.0f} (--wait=SECS)",
                                 param_hint="'--wait'")
    if slot_name is not None and (cast_tool or cast_labels or cast_image):
        raise click.UsageError("give --slot (a named slot) or --tool (a cast), not both; "
                               "--label and --image go with --tool")
    if slot_name is None and cast_tool is None:
        raise click.UsageError("give --machine M --slot S, or --tool T to cast the run on the "
                               "fleet")
    if slot_name is not None and machine_name is None:
        raise click.UsageError("--slot needs --machine")
    labels = None
    if cast_labels:
        from saphan.fleet.labels import parse_all

        labels = parse_all(cast_labels)
    engine = _engine(ctx)
    request = None
    if any(v is not None for v in (prompt, prompt_file, model, permission_class, resume, lane,
                                   max_turns, max_seconds, egress_policy)):
        # A light module: the agent tools' adapters are not a plain command's cost.
        from saphan.tools.instruction import Request

        request = Request(prompt=prompt, prompt_file=prompt_file, model=model,
                          permission_class=permission_class, resume=resume, lane=lane,
                          max_turns=max_turns, max_seconds=max_seconds,
                          egress_policy=egress_policy)
    from saphan.run import outcome as run_outcome

    with run_outcome.json_stdout(engine, as_json):
        record = engine.run(machine_name, slot_name, list(command), workdir=workdir,
                            stream=True, boundary=boundary, repo=repo, base_ref=base_ref,
                            keep_worktree=keep_worktree, request=request,
                            view=not (as_json or raw) and sys.stdout.isatty(), wait=wait or 0.0,
                            tool=cast_tool, labels=labels, image=cast_image)
    if as_json:
        click.echo(record.to_json())
    else:
        from saphan.run.end import signal_text

        enforced = record.enforced_by or {}
        by = " ".join(str(enforced[k]) for k in ("mechanism", "version") if enforced.get(k))
        click.echo(
            f"run {record.id} {record.outcome} (exit {signal_text(record.exit_code)}); "
            f"enforced by {by or 'nothing'}; record: saphan runs show {record.id}", err=True,
        )
    code = run_outcome.exit_status(record.exit_code, own=exit_code == "command")
    if code != 0:
        ctx.exit(code)


@cli.command("measure-base", context_settings={"ignore_unknown_options": True})
@click.option("--machine", "machine_name", required=True, help="Machine to run on.")
@click.option("--slot", "slot_name", required=True, help="A --tool command slot on it.")
@click.option("--repo", type=click.Path(file_okay=False), default=None,
              help="Measure in a new linked worktree of this repository (this machine only); "
                   "the scratch clone is made from the repository itself.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Measure in this git working tree (head is its current content); on an SSH "
                   "machine an absolute path there. Give --repo or --workdir.")
@click.option("--base", "base", required=True, metavar="REV",
              help="The base the order named: a SHA, an abbreviation of one, a branch or a tag.")
@click.option("--expect", default=None, metavar="SHA",
              help="The SHA the order was written against (full or abbreviated; expanded in "
                   "the repository). Default: REV expanded when the run begins. A checkout "
                   "that lands elsewhere (a branch that moved) is reported base not measured.")
@click.option("--scratch", default=None, metavar="PATH",
              help="Where the scratch clone goes, relative to the working tree; the repository "
                   "must already ignore it (else refused: scratch-not-ignored). Default: "
                   ".saphan-run/base-<random>, ignored through info/exclude.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the run's record (the report under \"measure\") as JSON on stdout; "
                   "the test output then streams to stderr.")
@click.argument("test", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def measure_base(ctx: click.Context, machine_name: str, slot_name: str, repo: str | None,
                 workdir: str | None, base: str, expect: str | None, scratch: str | None,
                 as_json: bool, test: tuple[str, ...]) -> None:
    """Measure a named base commit from inside the boundary, per test:
    saphan measure-base --machine M --slot S --workdir W --base SHA -- pytest -q

    One confined run (the same pipeline, boundary and record as `saphan run`)
    performs the design document's runbook in the working tree: 1 `git clone
    --shared --no-checkout` into an ignored scratch path, 2 `checkout --detach
    REV`, 3 `rev-parse HEAD` held against the SHA the order named (if they
    differ: base not measured, both SHAs, no verdicts), 4 TEST in the scratch
    clone and in the working tree, every item paired (pre-existing,
    introduced, fixed, passing, only-base, only-head), 5 the scratch removed
    and TEST run again over one tree.

    Per-test outcomes come from pytest (--junitxml is added), cargo test (libtest
    JSON) or, for any other command, its exit status as one item. The report
    is in `saphan runs show ID` and runs/<id>/measure.json (docs/measure-base.md).

    Exit status: 0 measured, nothing to look at; 1 measured, something to look
    at (a failure introduced, one only at head, a suite that did not complete);
    4 base not measured (or not isolated, or its outcomes unreadable); 3 refused.
    """
    from saphan.errors import UserError
    from saphan.measure import report
    from saphan.run import outcome as run_outcome

    if (repo is None) == (workdir is None):
        raise UserError("give --repo PATH or --workdir PATH (the tree head is measured in)")
    if test and test[0] == "--":
        test = test[1:]
    engine = _engine(ctx)
    with run_outcome.json_stdout(engine, as_json):
        record = engine.measure_base(machine_name, slot_name, list(test), base=base,
                                     repo=repo, workdir=workdir, scratch=scratch,
                                     expect=expect)
    got = record.data.get("measure") or {}
    if as_json:
        click.echo(record.to_json())
    else:
        from saphan.confine.protected import printable

        for line in report.lines(got):
            click.echo(printable(line))
        click.echo(f"run {record.id} {record.outcome}; record: saphan runs show {record.id}",
                   err=True)
    code = report.exit_status(got)
    if code != 0:
        ctx.exit(code)


# -- lanes ----------------------------------------------------------------------

@cli.group()
def lane() -> None:
    """Lanes: model endpoints for the built-in loop (docs/loop.md).

    A lane is an OpenAI-compatible chat-completions endpoint (llama.cpp,
    vLLM, Ollama, ...), the model to ask for, and a file holding its API key
    (yours, mode 0600, one link). Inside a loop run's jail every lane's key
    file and the lanes file are unreadable; the key reaches the loop on a pipe.
    """


@lane.command("add")
@click.argument("name")
@click.option("--base-url", required=True, metavar="URL",
              help="The endpoint's OpenAI-compatible base, e.g. http://127.0.0.1:8080/v1.")
@click.option("--model", required=True, metavar="M", help="The model the loop asks for.")
@click.option("--credential-file", required=True, type=click.Path(dir_okay=False),
              metavar="PATH", help="File holding the API key (mode 0600, owned by you).")
@click.option("--credential-env", default="OPENAI_API_KEY", show_default=True, metavar="VAR",
              help="The variable this key is known by; scrubbed from every loop environment.")
@click.option("--timeout", type=int, default=120, show_default=True, metavar="S",
              help="Seconds one request to the endpoint may take.")
@click.pass_context
def lane_add(ctx: click.Context, name: str, base_url: str, model: str, credential_file: str,
             credential_env: str, timeout: int) -> None:
    """Declare a lane (its credential file's custody is checked now)."""
    got = _engine(ctx).add_lane(name, base_url=base_url, model=model,
                                credential_file=credential_file,
                                credential_env=credential_env, timeout=timeout)
    click.echo(f"added lane {got.name}: {got.model} at {got.base_url} (key file "
               f"{got.credential_file}, custody ok; known as ${got.credential_env})")


@lane.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def lane_list(ctx: click.Context, as_json: bool) -> None:
    """List the declared lanes (never their keys)."""
    declared = _engine(ctx).lanes()
    if as_json:
        _emit_json([x.as_dict() for x in declared])
        return
    _table(["lane", "model", "base_url", "credential_file", "variable", "timeout"],
           [[x.name, x.model, x.base_url, x.credential_file, x.credential_env, x.timeout]
            for x in declared])


@lane.command("check")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def lane_check(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """Check the custody of every lane's credential file (or one lane's).

    Exit 3 (custody-key-unsafe) on the first file that fails; nothing is sent
    to any endpoint.
    """
    results = [{"lane": x.name, "credential_file": x.credential_file, "custody": "ok"}
               for x in _engine(ctx).check_lanes(name)]
    if as_json:
        _emit_json(results)
        return
    for r in results:
        click.echo(f"lane {r['lane']}: {r['credential_file']}: custody ok")
    if not results:
        click.echo("no lanes declared; add one with `saphan lane add`")


@lane.command("remove")
@click.argument("name")
@click.pass_context
def lane_remove(ctx: click.Context, name: str) -> None:
    """Remove a lane (its credential file is left where it is)."""
    gone = _engine(ctx).remove_lane(name)
    click.echo(f"removed lane {gone.name} (its key file {gone.credential_file} was not touched)")


@cli.group()
def runs() -> None:
    """Run records."""


@runs.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="At most N runs (1..10000).")
@click.option("--state", default=None, metavar="STATE",
              help="Only runs in STATE: live (reserved or running), reserved, running, ended, "
                   "refused.")
@click.option("--machine", "machine_name", default=None, metavar="NAME",
              help="Only runs on machine NAME.")
@click.option("--slot", "slot_name", default=None, metavar="NAME", help="Only runs on slot NAME.")
@click.option("--tool", default=None, metavar="TOOL",
              help="Only runs of TOOL (command, claude, codex, loop).")
@click.option("--outcome", default=None, metavar="OUTCOME",
              help="Only runs that ended OUTCOME (exited, failed, refused, cancelled, ...).")
@click.option("--since", default=None, metavar="WHEN",
              help="Only runs started since WHEN: a duration back from now (30m, 12h, 7d) or "
                   "a UTC date or time (2026-11-30, 2026-11-30T12:00).")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output: every run with the same keys (null when empty).")
@click.pass_context
def runs_list(ctx: click.Context, limit: int, state: str | None, machine_name: str | None,
              slot_name: str | None, tool: str | None, outcome: str | None,
              since: str | None, as_json: bool) -> None:
    """List recent runs, newest first (the filters combine: all must hold).

    Every record is verified against the workspace record key. The SIG column
    reads valid, pending (a live run, signed when it ends), or — flagged —
    !invalid (edited, or written under another key) or !missing (no
    signature); a record signed by a key this workspace does not hold reads
    ?foreign:KEYID (not verified here; not invalid); --json carries the same
    as each run's "signature" object. Flagged and foreign rows are listed,
    never hidden, and named again on stderr; the exit status stays 0 (`saphan
    runs show ID` says why, and exits 3 for one).
    """
    from saphan.run import listing

    wanted = listing.filters(state=state, machine=machine_name, slot=slot_name, tool=tool,
                             outcome=outcome, since=since)
    records = _engine(ctx).runs(limit, **wanted)
    flagged = [r for r in records if r.signature_flagged]
    foreign = [r for r in records if r.signature == "foreign"]
    if as_json:
        _emit_json([listing.json_row(r.data) for r in records])
    else:
        _table(listing.HEADERS, [listing.table_row(r.data, _sig_cell(r)) for r in records])
    if flagged:
        verb = "does" if len(flagged) == 1 else "do"
        click.echo(
            f"record-signature-invalid: {len(flagged)} of the {len(records)} records listed "
            f"{verb} not verify against the workspace key (marked !invalid / !missing): "
            f"{', '.join(r.id for r in flagged)}; see `saphan runs show ID`", err=True,
        )
    if foreign:
        signers = sorted({str((r.data.get("signature") or {}).get("key_id")) for r in foreign})
        click.echo(
            f"{len(foreign)} of the {len(records)} records listed are signed by key "
            f"{', '.join(signers)}, not held here (marked ?foreign; not verified here, not "
            f"invalid): {', '.join(r.id for r in foreign)}; see docs/operators.md", err=True,
        )


def _sig_cell(r: RunRecord) -> str:
    if r.signature_flagged:
        return f"!{r.signature}"
    if r.signature == "foreign":
        return f"?foreign:{(r.data.get('signature') or {}).get('key_id')}"
    return r.signature


@runs.command("show")
@click.argument("run_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show one run's record (ID, a unique prefix, or `last`).

    The record is verified against the workspace record key (HMAC-SHA256)
    and the row's columns are held against the signed values. A record that
    does not verify is still shown in full, flagged by a first line naming
    the refusal class; with --json, by its "signature" object ("status",
    "class", "message", "remediation"):

    \b
      record-signature-invalid: this record does not verify against the
      workspace key (edited, or written under another key)

    \b
    Exit status:
      0  the record verifies (valid), or the run is live and its record
         is not written yet (pending: signed when it ends)
      3  it does not (invalid: edited, written under another key, or a
         column disagrees with what was signed; missing: no signature,
         e.g. written by an older build), or it is signed by a key this
         workspace does not hold (foreign: "signed by key K, not held
         here"; not invalid, but nothing here vouches for it) -- the record
         is still printed
    """
    from saphan.refusals import EXIT_CODE as REFUSAL_EXIT

    record = _engine(ctx).run_record(run_id)
    if as_json:
        click.echo(record.to_json())
    else:
        from saphan.run.shown import record_lines

        try:
            for line in record_lines(record):
                click.echo(line)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError):
            if not record.signature_unverified:
                raise
            # An edited record need not have the shape saphan writes: show it as stored.
            click.echo("record (not in the shape saphan writes; as stored):")
            click.echo(record.to_json())
    if record.signature_unverified:
        ctx.exit(REFUSAL_EXIT)


@runs.command("logs")
@click.argument("run_id", metavar="ID")
@click.option("-f", "--follow", is_flag=True,
              help="Keep copying while the run is live; stop once it has ended.")
@click.pass_context
def runs_logs(ctx: click.Context, run_id: str, follow: bool) -> None:
    """Print a run's output (ID, a unique prefix, or `last`): its stdout.log
    to stdout and its stderr.log to stderr, byte for byte (on a terminal,
    control characters but newline and tab are shown escaped). A refused
    run has none. With -f, follow a live run until it ends."""
    from saphan.run import logs

    engine = _engine(ctx)
    row = engine.ctx.find_run(run_id)
    try:
        logs.copy(engine.ctx, row, sys.stdout.buffer, sys.stderr.buffer, follow=follow,
                  escape_out=sys.stdout.isatty(), escape_err=sys.stderr.isatty())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@runs.command("finalize")
@click.argument("run_id", metavar="ID")
@click.option("--reason", default="operator request", show_default=True,
              help="Recorded on the run.")
@click.option("--force", is_flag=True,
              help="End it even though its holder is measured alive (recorded).")
@click.pass_context
def runs_finalize(ctx: click.Context, run_id: str, reason: str, force: bool) -> None:
    """End a live run's row by hand (recorded). Use when a holder is stuck or
    its machine is gone; a holder measured alive needs --force."""
    record = _engine(ctx).finalize(run_id, reason=reason, force=force)
    click.echo(f"finalised run {record.id} (outcome {record.outcome}; record signature "
               f"{record.signature})")


@runs.command("cancel")
@click.argument("run_id", metavar="ID")
@click.option("--signal", "sig", default="SIGTERM", show_default=True, metavar="S",
              help="What the run's command gets first: SIGTERM, SIGINT, SIGHUP or SIGKILL "
                   "(or TERM, 15, ...).")
@click.option("--grace", type=click.FloatRange(0, 600), default=10.0, show_default=True,
              metavar="SECS", help="How long the command has before SIGKILL (0..600).")
@click.option("--json", "as_json", is_flag=True, help="Print the final record as JSON.")
@click.pass_context
def runs_cancel(ctx: click.Context, run_id: str, sig: str, grace: float,
                as_json: bool) -> None:
    """End a live run's whole process tree, here or on its far machine, and
    record it `cancelled`.

    The saphan process driving the run records it when it is alive (it gets
    the request, passes the signal on, waits for its tree); when it is gone,
    runs cancel ends what still runs and records it. After --grace seconds
    what is left gets SIGKILL. Exit 0 when the run is ended (cancelled, or it
    had ended on its own: said so); 1 when something of it could not be
    ended (its row then stays live, its seat held); 2 when it is not live.
    """
    from saphan.run.end import signal_text

    try:
        done = _engine(ctx).cancel(run_id, signal=sig, grace=grace)
    except RuntimeError as e:
        _fail(EXIT_FAILED, f"error: cancel: {e}")
    rec = done.record
    if as_json:
        click.echo(rec.to_json())
    who = {"driver": "by its own saphan process", "cancel": "by runs cancel (its driver was "
           "gone)", "itself": "on its own, before the cancel took effect"}[done.recorded_by]
    click.echo(f"run {rec.id} {rec.outcome} (exit {signal_text(rec.exit_code)}), recorded "
               f"{who}, after {done.waited:.1f} s; record: saphan runs show {rec.id}",
               err=as_json)
    for step in done.steps:
        click.echo(f"  {step}", err=as_json)


# -- batches ------------------------------------------------------------------------

@cli.group()
def batch() -> None:
    """Many tasks, cast on the fleet as seats free up (docs/fleet.md#batches).

    A batch file is JSONL, one task per line: {"command": ["make", "test"],
    "workdir": "/src/a"} or {"tool": "claude", "prompt": "...", "repo": "/src/b",
    "base": "main", "labels": {"zone": "eu"}, "max_seconds": 900, "id": "b1"}.
    The batch, its tasks and their runs are rows in the store: Ctrl-C gives
    the running tasks back, and `saphan batch resume ID` runs the rest.
    """


_PARALLEL = click.option(
    "--parallel", type=click.IntRange(1, 10_000), default=None, metavar="N",
    help="At most N tasks at once (default: as many as the fleet has free seats).")
_BATCH_JSON = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the batch's report as JSON on stdout (progress lines go to stderr).")


@batch.command("run")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@_PARALLEL
@_BATCH_JSON
@click.pass_context
def batch_run(ctx: click.Context, path: str, parallel: int | None, as_json: bool) -> None:
    """Check FILE, store it as a batch, and work it until every task is done.

    Each task is a cast (`saphan run --tool T --wait`): it waits for a free
    seat of its tool (matching its labels and image). Exit status: 0 every
    task exited 0; 1 some did not; 128+N stopped by a signal (resume it).
    """
    engine = _engine(ctx)
    from saphan.confine.protected import printable

    b = engine.batches.create(path)
    click.echo(printable(f"batch {b.id}: {b.tasks} task{'s' if b.tasks != 1 else ''} from "
                         f"{b.source}"), err=True)
    _work_batch(ctx, engine, b.id, parallel, as_json)


@batch.command("work")
@click.argument("batch_id", metavar="ID")
@_PARALLEL
@_BATCH_JSON
@click.pass_context
def batch_work(ctx: click.Context, batch_id: str, parallel: int | None, as_json: bool) -> None:
    """Work a stored batch with the others working it: on PostgreSQL, run this
    on several control-plane hosts; tasks are claimed once each, and a dead
    worker's claims are recovered. On SQLite one process works a batch."""
    _work_batch(ctx, _engine(ctx), batch_id, parallel, as_json)


@batch.command("resume")
@click.argument("batch_id", metavar="ID")
@_PARALLEL
@_BATCH_JSON
@click.pass_context
def batch_resume(ctx: click.Context, batch_id: str, parallel: int | None,
                 as_json: bool) -> None:
    """Run what is left of a batch: its pending tasks, and those whose worker
    died (done tasks are never run again)."""
    _work_batch(ctx, _engine(ctx), batch_id, parallel, as_json)


def _work_batch(ctx: click.Context, engine: Engine, batch_id: str, parallel: int | None,
                as_json: bool) -> None:
    from saphan.batch.progress import Display, summary

    b = engine.batches.find(batch_id)
    live = not as_json and sys.stdout.isatty()
    with Display(engine.ctx, b.id, live=live) as display:
        worked = engine.batches.work(b.id, parallel=parallel, on_event=display.event)
    report = engine.batches.report(b.id)
    if as_json:
        _emit_json(report)
    elif not live or worked.signum is None:
        summary(report)
    if worked.signum is not None:
        import signal

        left = len([t for t in report["tasks"] if t["state"] != "done"])
        click.echo(f"batch {b.id}: stopped by {signal.Signals(worked.signum).name}; {left} "
                   f"task{'s' if left != 1 else ''} left: saphan batch resume {b.id}", err=True)
        ctx.exit(128 + worked.signum)
    if not report["all_exited"]:  # a task not exited 0, or whose record does not verify
        ctx.exit(EXIT_FAILED)


@batch.command("show")
@click.argument("batch_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@click.pass_context
def batch_show(ctx: click.Context, batch_id: str, as_json: bool) -> None:
    """A batch's tasks as the store has them: state, machine/slot, outcome, run."""
    report = _engine(ctx).batches.report(batch_id)
    if as_json:
        _emit_json(report)
        return
    from saphan.batch.progress import summary

    summary(report)


@batch.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.pass_context
def batch_list(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The newest batches."""
    found = _engine(ctx).batches.list(limit)
    if as_json:
        _emit_json([b._asdict() for b in found])
        return
    from saphan.confine.protected import printable

    _table(["batch", "created", "tasks", "source"],
           [[b.id, printable(b.created_at), b.tasks, printable(b.source)] for b in found])


# -- worktrees ----------------------------------------------------------------------

@cli.group()
def worktrees() -> None:
    """What `saphan run --repo` leaves: worktrees and saphan/* branches."""


@worktrees.command("prune")
@click.option("--older-than", "older_than", default="0", metavar="D",
              help="Only runs that ended at least D ago: 30m, 12h, 7d, 2w (default: any "
                   "ended run).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output: a list of {action, kind, run, repo, target, why}.")
@click.pass_context
def worktrees_prune(ctx: click.Context, older_than: str, dry_run: bool, as_json: bool) -> None:
    """Remove the kept worktrees of ENDED runs (only <workspace>/worktrees/<run-id>,
    as the run's signed record names it; a link there is left alone) and
    delete their saphan/<run-id> branches that have no commits beyond their
    base (a branch with commits is always kept; a branch checked out anywhere
    too). Live runs are never touched. Exit 0; 1 when something could not be
    removed (said why)."""
    from saphan import prune
    from saphan.confine.protected import printable
    from saphan.timefmt import parse_duration

    seconds = parse_duration(older_than, "--older-than")
    done = prune.prune(_engine(ctx).ctx, older_than=seconds, dry_run=dry_run)
    if as_json:
        _emit_json(done)
    else:
        for a in done:
            click.echo(printable(f"{a['action']} {a['kind']} {a['target']} (run {a['run']}; "
                                 f"{a['why']})"))
        if not done:
            click.echo("nothing to prune")
    if any(a["action"] == "kept" and a["why"].startswith("git ") for a in done):
        ctx.exit(EXIT_FAILED)


# -- permission classes -----------------------------------------------------------

@cli.group()
def policy() -> None:
    """Permission classes: what an agent is permitted to do."""


@policy.command("check")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def policy_check(path: str, as_json: bool) -> None:
    """Validate a permission class file and print what it allows."""
    from saphan.tools import permission_class

    pc = permission_class.load(path)
    if as_json:
        _emit_json(pc.as_record())
        return
    for line in permission_class.describe(pc):
        click.echo(line)


# -- egress policies ------------------------------------------------------------

@cli.group()
def egress() -> None:
    """Egress policies: a run's network cut and its per-run door (docs/egress.md).

    A run with `saphan run --egress-policy FILE` (or a permission class naming
    one) gets a network namespace holding only loopback; its one way out is a
    door in saphan's own process, which answers CONNECT to the policy's
    allowed hosts and ports only, and serves its credential routes, adding
    the real secret outside the jail.
    """


@egress.command("check")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def egress_check(path: str, as_json: bool) -> None:
    """Validate an egress policy file and print what it allows (reads no secret)."""
    from saphan.egress import policy as egress_policy

    pol = egress_policy.load(path)
    if as_json:
        _emit_json(pol.as_record())
        return
    for line in egress_policy.describe(pol):
        click.echo(line)


# -- launcher -------------------------------------------------------------------

@cli.group()
def launcher() -> None:
    """saphan-launcher, the static binary that applies Landlock on runners."""


@launcher.command("path")
def launcher_path() -> None:
    """Print where saphan-launcher is."""
    from saphan import launcher as lmod

    p = lmod.path()
    if p is None:
        raise click.ClickException("saphan-launcher not found; run ci/setup (it builds and "
                                   "packages it) or set SAPHAN_LAUNCHER")
    click.echo(p)


# -- the dashboard ------------------------------------------------------------------

@cli.command("serve")
@click.option("--bind", "bind_text", default="127.0.0.1:8470", show_default=True,
              metavar="HOST:PORT", help="Where to listen; port 0 picks a free one.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --bind that is not loopback (other machines can then reach it, "
                   "with the token, over plain HTTP).")
@click.option("--json", "as_json", is_flag=True,
              help='Print the start as one JSON line: {"url", "name", "port", "token", '
                   '"store", "reachable"}.')
@click.pass_context
def serve_cmd(ctx: click.Context, bind_text: str, allow_remote: bool, as_json: bool) -> None:
    """A read-only web view of this workspace's store: the fleet (machines,
    signed facts, every slot's ordinals and who holds them), runs (filters,
    pages, updated live), each run's record, output and diff, and batches.

    It prints, once, the URL to open: it carries a token made anew at every
    start, which every request needs (403 without it). It binds to loopback
    unless --allow-remote; it never writes to the store and never serves a
    file by path. Needs the optional extra: pip install 'saphan[serve]'.
    Stop it with Ctrl-C. See docs/dashboard.md.
    """
    from saphan.serve.server import serve

    serve(ctx.find_root().obj.get("home"), bind_text, allow_remote=allow_remote,
          echo=lambda line: click.echo(line), as_json=as_json)


# -- diagnostics: doctor, config --------------------------------------------------

@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output: a list of {check, status, detail, fix}.")
@click.pass_context
def doctor_cmd(ctx: click.Context, as_json: bool) -> None:
    """Check that this control plane can confine and record runs.

    One line per check, `PASS|WARN|FAIL CHECK: what was measured`, and under
    anything short of PASS the fix: bubblewrap (the trial every run makes, and
    again with --unshare-net, as `network: off` runs get it), user namespaces,
    the Landlock ABI, the custody of saphan's files and of saphan-launcher,
    config.toml, the record key, the store (reached, a write
    rolled back, migrations), the agent CLIs against the pinned versions,
    and each machine's signed rows (an SSH machine reached and its launcher's
    probe run there, bounded). The store keeps nothing of it; its session waits
    at most 3 s for a lock and 10 s for a statement. Each line is printed as
    it is measured (--json: once all are). Exit 0 when nothing FAILs, 1 otherwise.
    """
    from saphan import doctor

    results = []
    for r in doctor.checks(ctx.find_root().obj.get("home")):
        results.append(r)
        if not as_json:  # click.echo flushes: a slow check shows where it is
            click.echo(f"{r.status} {r.check}: {r.detail}")
            if r.fix:
                click.echo(f"  fix: {r.fix}")
    if as_json:
        _emit_json([r.as_dict() for r in results])
    if any(r.status == doctor.FAIL for r in results):
        ctx.exit(EXIT_FAILED)


@cli.group("config")
def config_group() -> None:
    """The workspace's config.toml."""


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def config_show(ctx: click.Context, as_json: bool) -> None:
    """Show the effective configuration: where the workspace and its files
    are, the store it opens, and every setting with its source (the file or
    the default). Passwords in URLs are masked."""
    from saphan.config import effective

    engine = _engine(ctx)
    ws = engine.workspace
    value = effective(engine.config, workspace=ws.home, key_path=ws.key_path,
                      sqlite_path=ws.sqlite_path)
    if as_json:
        _emit_json(value)
        return
    for k in ("workspace", "config_file", "record_key", "store"):
        click.echo(f"{k} {value[k]}")
    for row in value["settings"]:
        shown = "-" if row["value"] is None else _emit_compact(row["value"])
        click.echo(f"{row['key']} {shown} ({row['source']})")


@config_group.command("check")
@click.pass_context
def config_check(ctx: click.Context) -> None:
    """Validate config.toml: every section and key known, every value of its
    type and range, run.confinement "engine" or "vendor". Exit 0 when it is
    valid; 2 with one line naming the key and the fix when it is not."""
    from saphan.config import check

    conf = _engine(ctx).config
    mode = check(conf)
    click.echo(f"{conf.path}: valid (confinement {mode}; {len(conf.given)} setting(s) from "
               "the file, the rest defaults)")


def _fail(code: int, text: str) -> NoReturn:
    from contextlib import suppress

    from saphan.confine.protected import printable

    # what a far machine, a run or an option put in a message reaches the
    # terminal escaped, one line per line
    with suppress(OSError):  # the terminal is gone (SIGHUP): the exit status says it
        click.echo("\n".join(printable(line) for line in text.split("\n")), err=True)
    sys.exit(code)


def main() -> None:
    from saphan.errors import EXIT_CODE as USER_EXIT
    from saphan.errors import UserError
    from saphan.refusals import EXIT_CODE as REFUSAL_EXIT
    from saphan.refusals import Refusal

    try:
        # standalone_mode=False: click returns ctx.exit()'s code instead of exiting.
        code = cli.main(prog_name="saphan", standalone_mode=False)
        if isinstance(code, int) and code != 0:
            sys.exit(code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        _fail(130, "aborted")
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except Refusal as r:
        _fail(REFUSAL_EXIT, r.render() + (f"\nrun: {r.run_id}" if r.run_id else ""))
    except UserError as e:
        _fail(USER_EXIT, f"error: {e}")
    except KeyboardInterrupt:
        _fail(130, "interrupted")
    except Exception as e:
        from saphan.errors import Interrupted
        from saphan.store import StoreError

        if isinstance(e, StoreError):
            _fail(EXIT_FAILED, f"error: store: {e}")
        from saphan.errors import TransportError

        if isinstance(e, TransportError):
            _fail(EXIT_FAILED, f"error: ssh: {e}")
        if isinstance(e, Interrupted):
            _fail(128 + e.signum, f"saphan: {e}; " + (
                "the run was finalised" if e.recorded else
                "it held no seat, and nothing was recorded"))
        raise
