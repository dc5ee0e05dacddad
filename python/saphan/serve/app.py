"""The dashboard's Starlette application: the gate, the routes, the headers.

Every request passes :class:`Gate` first (serve/access.py): a Host that does
not name this dashboard, or a missing or wrong token, is a 403 before any
route runs; only GET and HEAD are answered. Every response carries a
Content-Security-Policy allowing only this origin's script and style (no
inline script, no frames, no form posts elsewhere), ``nosniff``,
``no-referrer`` and ``no-store``.

Routes (every parameter checked by serve/params.py first; 400 names it):

    /                         the fleet: machines, signed facts, slots, ordinals
    /fleet/body               the same, the region the page refreshes
    /runs                     runs, newest first; ?state machine slot tool
                              outcome limit before (a page cursor)
    /runs/rows                the table's rows (the first page refreshes them)
    /run/ID                   one run: its record, output, diff
    /run/ID/record            the record region (refreshed while the run is live)
    /run/ID/output            ?stream=stdout|stderr [&offset=N]: a window of its
                              output as JSON text (escaped; never HTML)
    /batches, /batch/ID, /batch/ID/body
    /static/saphan.js, /static/saphan.css   constants (serve/html.py)

The store is read on worker threads, each with its own Engine opened
without reconciliation (nothing is written; serve/reader.py), because a
SQLite connection belongs to the thread that opened it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode

from saphan.serve import access, html, params, reader

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Message, Receive, Scope, Send

    from saphan.engine import Engine

T = TypeVar("T")
#: threads reading the store (each with its own Engine and connection)
WORKERS = 4
#: seconds a run's diff, once read, is shown again without running git
DIFF_KEEP = 30.0
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


@dataclass
class Settings:
    home: str | None
    bind: access.Bind
    token: str
    remote: bool  # --allow-remote on a bind that is not loopback: any Host is this one
    store: str  # the store's description, for the header
    name: str = ""  # the page's own host name (a loopback bind; access.new_name)
    port: int = 0  # the port bound (the cookie is named for it)
    engines: list[Engine] = field(default_factory=list)


class Readers:
    """The worker threads and their Engines."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="saphan-serve")
        self._diff_turn = threading.Lock()
        self._diffs: dict[tuple[str, str], tuple[float, Any]] = {}
        self._reading: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def engine(self) -> Engine:
        got: Engine | None = getattr(self._local, "engine", None)
        if got is None:
            from saphan.engine import Engine

            got = Engine(self.settings.home, reconcile=False)
            got.ctx.verb = "saphan serve"
            self._local.engine = got
            with self._lock:
                self.settings.engines.append(got)
        return got

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: self._call(fn, *args))

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        from saphan.errors import StoreError

        engine = self.engine()
        try:
            return fn(engine, *args)
        except StoreError:
            # The connection may be what failed (a PostgreSQL restart): this
            # thread opens a new one for its next request.
            self._local.engine = None
            with self._lock:
                if engine in self.settings.engines:
                    self.settings.engines.remove(engine)
            engine.close()
            raise

    async def diff(self, run_id: str, record: dict[str, Any], signature: str) -> Any:
        """The run's diff (run/diff.py). Only a verified ``--repo`` record runs
        git, on a thread of its own: a run decides what its diff costs (up to
        its time limit), so diffs wait for each other, never for the pages (nor
        a page without a diff for them); a read in progress is shared by every
        page asking for it, and a read is kept :data:`DIFF_KEEP` seconds."""
        import time

        from saphan.run.diff import branch_diff

        if signature != "valid" or not isinstance(record.get("worktree"), dict):
            return branch_diff(record, signature=signature)  # no git: at once
        key = (run_id, signature)
        kept = self._diffs.get(key)
        if kept is not None and time.monotonic() - kept[0] < DIFF_KEEP:
            return kept[1]
        reading = self._reading.get(key)
        if reading is None:
            loop = asyncio.get_running_loop()
            reading = loop.create_future()

            def kept_once_read(f: asyncio.Future[Any]) -> None:
                self._reading.pop(key, None)
                if f.cancelled() or f.exception() is not None:
                    return
                if len(self._diffs) >= 64:
                    self._diffs.pop(next(iter(self._diffs)))
                self._diffs[key] = (time.monotonic(), f.result())

            reading.add_done_callback(kept_once_read)
            threading.Thread(target=self._read_diff, args=(loop, reading, record, signature),
                             name="saphan-diff", daemon=True).start()
            self._reading[key] = reading  # shared once its reader runs
        # shielded: a page that goes away does not cancel the read others wait for
        return await asyncio.shield(reading)

    def _read_diff(self, loop: asyncio.AbstractEventLoop, into: asyncio.Future[Any],
                   record: dict[str, Any], signature: str) -> None:
        """One diff at a time (``_diff_turn``), on a daemon thread: Ctrl-C does
        not wait for a git a run made slow (git's own pipe closes with us)."""
        from contextlib import suppress

        from saphan.run.diff import branch_diff

        got: Any = None
        error: Exception | None = RuntimeError("the diff read did not finish")
        try:
            with self._diff_turn:
                got = branch_diff(record, signature=signature)
                error = None
        except Exception as e:  # handed to the page that waits for it
            error = e
        finally:
            with suppress(RuntimeError):  # the loop closed meanwhile (Ctrl-C): nobody waits
                loop.call_soon_threadsafe(_settle, into, got, error)

    def close(self) -> None:
        from contextlib import suppress

        self.pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for e in self.settings.engines:
                # a SQLite connection may be closed only by the thread that opened
                # it (sqlite3.ProgrammingError here); the process's end closes it
                with suppress(Exception):
                    e.close()
            self.settings.engines.clear()


def _settle(into: asyncio.Future[Any], got: Any, error: BaseException | None) -> None:
    if into.done():
        return
    if error is not None:
        into.set_exception(error)
    else:
        into.set_result(got)


class Gate:
    """The token and Host check, and the headers, around the application."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets: the connection is closed unanswered
        from starlette.datastructures import Headers

        s = self.settings
        headers = Headers(scope=scope)
        host = access.host_of(headers.get("host"))
        # own: the page's own name (loopback), or any name (--allow-remote on a
        # non-loopback bind); the cookie and ?token= count only there
        own = host is not None and (s.remote or host[0] == s.name)
        if host is None or not (own or access.is_loopback_name(host[0])):
            await _plain(send, 403, "403: this dashboard answers only to its own address")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _plain(send, 405, "405: the dashboard is read-only (GET only)")
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        from starlette.requests import cookie_parser

        jar = cookie_parser(headers.get("cookie", "")).get(access.cookie_name(s.port))
        if given:
            if len(given) != 1 or not access.token_ok(given[0], s.token):
                await _plain(send, 403, _NO_TOKEN)
                return
            rest = [(k, v) for k, v in query if k != "token"]
            where = _safe_path(scope.get("raw_path", b"/"))
            if not own:
                # 127.0.0.1 or localhost: a cookie set here would go to every
                # server on that name; on to the page's own name (same port)
                port = host[1] or str(s.port)
                await _redirect(send, f"http://{s.name}:{port}{where}?"
                                      f"{urlencode([*rest, ('token', given[0])])}", None)
                return
            # The token is swapped for the cookie, and the address bar keeps no token.
            await _redirect(send, where + (f"?{urlencode(rest)}" if rest else ""),
                            f"{access.cookie_name(s.port)}={s.token}; HttpOnly; "
                            "SameSite=Strict; Path=/")
            return
        if not (access.token_ok(bearer, s.token)
                or (own and access.token_ok(jar, s.token))):
            await _plain(send, 403, _NO_TOKEN)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((k.encode(), v.encode()) for k, v in HEADERS.items()
                                        if k.encode() not in have)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


_NO_TOKEN = ("403: this dashboard needs the token `saphan serve` printed when it started "
             "(open the URL it printed)")


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            *((k.encode(), v.encode()) for k, v in HEADERS.items())]})
    await send({"type": "http.response.body", "body": body})


def _safe_path(raw: bytes) -> str:
    """The request's path for a redirect to this same dashboard: one of its
    own routes' characters only, never ``//host`` or ``/\\host`` (which a
    browser reads as another host); anything else is ``/``."""
    path = raw.decode("latin-1").split("?", 1)[0]
    parts = path.split("/")[1:]
    if not _PATH.fullmatch(path) or any(p in ("", ".", "..") for p in parts[:-1]) \
            or parts[-1] in (".", ".."):
        return "/"  # no empty, . or .. segment: nothing a browser resolves elsewhere
    return path


_PATH = re.compile(r"/[A-Za-z0-9._~/-]*")


async def _redirect(send: Send, location: str, cookie: str | None) -> None:
    extra = [(b"set-cookie", cookie.encode())] if cookie else []
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode("latin-1")), *extra,
                            (b"content-length", b"0"),
                            *((k.encode(), v.encode()) for k, v in HEADERS.items())]})
    await send({"type": "http.response.body", "body": b""})


def build(settings: Settings) -> tuple[Callable[[Scope, Receive, Send], Awaitable[None]], Readers]:
    """The gated application and its readers (closed by the caller)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    readers = Readers(settings)
    store = settings.store

    def q(request: Request) -> dict[str, str]:
        items = list(request.query_params.multi_items())
        names = [k for k, _ in items]
        for k in names:
            if names.count(k) > 1:
                raise params.BadParameter(k, "given more than once")
        return dict(items)

    async def fleet_page(request: Request) -> Response:
        params.only(q(request), ())
        data = await readers.read(reader.fleet)
        return HTMLResponse(html.fleet_page(data, store))

    async def fleet_body(request: Request) -> Response:
        params.only(q(request), ())
        return HTMLResponse(html.fleet_body(await readers.read(reader.fleet)))

    async def runs_page(request: Request) -> Response:
        query = q(request)
        f = params.run_filters(query)
        data, choices = await readers.read(_runs_and_choices, f)
        return HTMLResponse(html.runs_page(data, f.query(), choices, store))

    async def runs_rows(request: Request) -> Response:
        f = params.run_filters(q(request))
        return HTMLResponse(html.run_rows(await readers.read(reader.runs, f)))

    async def run_page(request: Request) -> Response:
        params.only(q(request), ())
        rid = params.run_id(request.path_params["run_id"])
        data = await readers.read(reader.run, rid, False)
        data["diff"] = await readers.diff(rid, data["record"], data["signature_status"])
        return HTMLResponse(html.run_page(rid, data, store))

    async def run_record(request: Request) -> Response:
        params.only(q(request), ())
        rid = params.run_id(request.path_params["run_id"])
        return HTMLResponse(html.record_body(await readers.read(reader.run, rid, False)))

    async def run_output(request: Request) -> Response:
        query = q(request)
        params.only(query, ("stream", "offset"))
        rid = params.run_id(request.path_params["run_id"])
        stream = params.one_of(query.get("stream", ""), ("stdout", "stderr"), "stream")
        start = params.offset(query["offset"]) if "offset" in query else None
        return JSONResponse(await readers.read(reader.output, rid, stream, start))

    async def batches_page(request: Request) -> Response:
        params.only(q(request), ())
        return HTMLResponse(html.batches_page(await readers.read(reader.batches), store))

    async def batch_page(request: Request) -> Response:
        params.only(q(request), ())
        bid = params.run_id(request.path_params["batch_id"], "batch")
        return HTMLResponse(html.batch_page(bid, await readers.read(reader.batch, bid), store))

    async def batch_body(request: Request) -> Response:
        params.only(q(request), ())
        bid = params.run_id(request.path_params["batch_id"], "batch")
        return HTMLResponse(html.batch_body(await readers.read(reader.batch, bid)))

    async def script(request: Request) -> Response:
        params.only(q(request), ())
        return Response(html.SCRIPT, media_type="text/javascript; charset=utf-8")

    async def style(request: Request) -> Response:
        params.only(q(request), ())
        return Response(html.STYLE, media_type="text/css; charset=utf-8")

    routes = [
        Route("/", fleet_page), Route("/fleet/body", fleet_body),
        Route("/runs", runs_page), Route("/runs/rows", runs_rows),
        Route("/run/{run_id}", run_page), Route("/run/{run_id}/record", run_record),
        Route("/run/{run_id}/output", run_output),
        Route("/batches", batches_page), Route("/batch/{batch_id}", batch_page),
        Route("/batch/{batch_id}/body", batch_body),
        Route("/static/saphan.js", script), Route("/static/saphan.css", style),
    ]
    app: Starlette = Starlette(routes=routes, exception_handlers=_handlers())
    return Gate(app, settings), readers


def _runs_and_choices(engine: Engine, f: params.RunFilters) -> tuple[dict[str, Any],
                                                                     dict[str, Any]]:
    from saphan.run.listing import OUTCOMES, STATES
    from saphan.serve.params import PAGE_SIZES
    from saphan.tools import TOOLS

    slots = engine.slots()
    choices = {"state": STATES, "machine": sorted({m.name for m in engine.machines()}),
               "slot": sorted({s.name for s in slots}), "tool": TOOLS,
               "outcome": sorted({*OUTCOMES, *([f.outcome] if f.outcome else [])}),
               "limit": PAGE_SIZES}
    return reader.runs(engine, f), choices


def _handlers() -> dict[Any, Callable[..., Any]]:
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse

    from saphan.errors import StoreError, UserError
    from saphan.refusals import Refusal

    def page(status: int, text: str) -> HTMLResponse:
        return HTMLResponse(html.error_page(status, text), status_code=status)

    async def bad(request: Request, exc: Exception) -> HTMLResponse:
        return page(400, f"400: {exc}")

    async def missing(request: Request, exc: Exception) -> HTMLResponse:
        return page(404, f"404: {exc}")

    async def http(request: Request, exc: Exception) -> HTMLResponse:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        return page(code, f"{code}: no such page" if code == 404 else f"{code}")

    async def refused(request: Request, exc: Exception) -> HTMLResponse:
        if isinstance(exc, Refusal):
            return page(503, f"503: refused [{exc.cls}]: {exc.message} — fix: {exc.remediation}")
        return page(503, f"503: {exc}")

    async def failed(request: Request, exc: Exception) -> HTMLResponse:
        return page(500, "500: the dashboard failed to read this page; see its terminal")

    return {params.BadParameter: bad, reader.NotFound: missing, HTTPException: http,
            Refusal: refused, StoreError: refused, UserError: refused, Exception: failed}
