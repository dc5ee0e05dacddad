"""Model API endpoints and model names: what saphan accepts, and how an
endpoint may be printed.

A leaf module (stdlib and saphan.errors only): a slot's run defaults
(fleet/slots.py), the workspace's ``[codex] base_url`` (config.py) and the
Codex provider built for a run (tools/codex.py) are all held to
:func:`check_endpoint` — at ``slot add/set``, when config.toml is read, and
again at run time (the store's slot row is not signed).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from saphan.errors import UserError

#: printable ASCII, no space: what an endpoint URL and a model name may hold
_PRINTABLE = re.compile(r"[\x21-\x7e]+")


def _loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address — never a name that merely
    starts like one (``127.attacker.example``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(url: str) -> str:
    """An ``http(s)://host[:port][/path]`` URL in printable ASCII (an
    internationalised host in its ``xn--`` form), with nothing a record must
    not hold (credentials), no query or fragment, and plain http only to
    this machine's loopback (anywhere else the key would cross the network
    in the clear)."""
    bad = (f"--endpoint {url!r} is not an http(s) URL of a model API; give "
           "http(s)://HOST[:PORT][/PATH] in printable ASCII (no spaces, '?' or '#'; an "
           "internationalised host in its xn-- form)")
    if not _PRINTABLE.fullmatch(url) or "?" in url or "#" in url or len(url) > 2048:
        raise UserError(bad)
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise UserError(bad) from None
    if parts.scheme not in ("http", "https") or not host or "\\" in url or port == 0:
        raise UserError(bad)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UserError("--endpoint carries credentials in the URL, which would be stored and "
                        "recorded; give the URL without them and the key in the tool's variable")
    if parts.scheme == "http" and not _loopback(host):
        raise UserError(f"--endpoint {url!r}: plain http to {host} would send the API key in "
                        "the clear; use https (http is for this machine's loopback only)")
    return url


def check_model(name: str) -> str:
    """A model name: printable ASCII without spaces, not an option, bounded."""
    if not _PRINTABLE.fullmatch(name) or name.startswith("-") or len(name) > 200:
        raise UserError(f"--model {name!r} is not a model name (printable ASCII, no spaces, "
                        "not starting with '-', at most 200 characters)")
    return name


def check_endpoint_masked(url: str, what: str) -> str:
    """:func:`check_endpoint`, its refusal naming ``what``
    and the URL with its password and query values masked."""
    try:
        return check_endpoint(url)
    except UserError as e:
        shown = redact_endpoint(url)
        why = str(e).replace(repr(url), repr(shown)).replace(url, shown)
        raise UserError(why.replace("--endpoint", what, 1)) from None


def redact_endpoint(url: str) -> str:
    """An HTTP endpoint as it may be printed: the password of its userinfo
    and every query value masked (a token may ride there); not a URL: masked."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        user, sep, password = parts.netloc.rpartition("@")[0].partition(":")
        host = parts.netloc.rpartition("@")[2]
        query = urlencode([(k, "***") for k, _ in parse_qsl(parts.query, keep_blank_values=True)],
                          safe="*")
    except ValueError:
        return "***"
    if not parts.scheme or not host:
        return "***"
    netloc = (f"{user}{':***' if sep and password else ''}@" if "@" in parts.netloc
              else "") + host
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
