"""serve/html.py: every value escaped; no inline script or style anywhere."""

from __future__ import annotations

from html.parser import HTMLParser

from saphan.run.diff import BranchDiff
from saphan.serve import html

EVIL = '<script>alert(1)</script>"\'><img src=x onerror=alert(2)>'


def _row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": "01" + "A" * 24, "machine": EVIL, "slot": "s1", "ordinal": 0, "tool": "command",
        "state": "ended", "started_at": "t", "finished_at": "t", "outcome": "exited",
        "exit": "0", "refusal_class": None, "enforced": "bubblewrap", "signature": "valid",
        "flagged": False, "cost": None, "live": False}
    row.update(over)
    return row


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _no_markup_from(page: str) -> None:
    """Parsed as a browser would: no tag or attribute came from a value, and no
    inline script, handler or style (the CSP forbids them; the page needs none)."""
    parser = _Tags()
    parser.feed(page)
    names = {t for t, _ in parser.tags}
    assert "img" not in names
    for tag, attrs in parser.tags:
        assert not any(a.startswith("on") or a == "style" for a in attrs), (tag, attrs)
        if tag == "script":
            assert attrs.get("src") == "/static/saphan.js"
    assert "<script>alert" not in page


def test_esc() -> None:
    assert html.esc(None) == "-" and html.esc("") == "-"
    assert html.esc(EVIL).startswith("&lt;script&gt;")
    assert "&quot;" in html.esc('"') and "&#x27;" in html.esc("'")


def test_runs_page_escapes_and_flags() -> None:
    data = {"rows": [_row(), _row(id="01" + "B" * 24, signature="invalid", flagged=True)],
            "next": "MjAyNi0xMi0wMVQwMDowMDowMFo~01" + "C" * 24}
    page = html.runs_page(data, {"machine": "m"}, {"state": ["live"], "machine": [EVIL],
                                                   "slot": [], "tool": [], "outcome": []}, "db")
    _no_markup_from(page)
    assert page.count("flagged") == 1 and 'data-signature="invalid"' in page
    assert 'rel="next" href="/runs?machine=m&amp;before=MjAyNi0xMi0wMVQwMDowMDowMFo~01' in page
    assert 'data-poll="/runs/rows?machine=m"' in page


def test_fleet_body_escapes_names_and_facts() -> None:
    data = {"live": 1, "machines": [{
        "name": EVIL, "transport": "local", "address": "local", "labels": {EVIL: EVIL},
        "facts": [{"kind": EVIL, "status": "invalid", "measured_at": "t", "age": "1s ago",
                   "summary": EVIL, "message": EVIL, "remediation": EVIL}],
        "slots": [{"name": EVIL, "tool": "command", "capacity": 1, "labels": {},
                   "agent_pin": None, "ordinals": [
                       {"ordinal": 0, "last": 0, "held": True, "over_capacity": False,
                        "backed": False,
                        "run": "01" + "A" * 24, "tool": "command", "state": "running",
                        "pid": 5, "host": EVIL, "since": "t", "liveness": EVIL,
                        "evidence": EVIL}]}]}]}
    _no_markup_from(html.fleet_page(data, "db"))


def test_record_and_diff_are_text() -> None:
    data = {"row": _row(signature="invalid", flagged=True), "lines": [EVIL], "shaped": True,
            "refusal": {"class": EVIL, "message": EVIL, "remediation": EVIL}, "usage": None,
            "signature": {"class": "record-signature-invalid", "message": EVIL,
                          "remediation": EVIL}, "live": True,
            "diff": BranchDiff("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n+" + EVIL
                               + "\n-\x1b[2Jgone\u202e\n+++ b/looks-like-a-header\n", False,
                               "a" * 40, "b" * 40, "1 file")}
    page = html.run_page("01" + "A" * 24, data, "db")
    _no_markup_from(page)
    assert "\x1b" not in page and "\u202e" not in page and "\\x1b[2J" in page
    assert '<span class="add">+&lt;script&gt;' in page and 'class="flag"' in page
    # a changed line that starts like git's header is still a change; the header is not
    assert '<span class="add">+++ b/looks-like-a-header</span>' in page
    assert "\n+++ b/x\n" in page and '<span class="del">-\\x1b[2J' in page
    assert 'data-poll="/run/01' in page  # live: the record refreshes


def test_script_only_writes_text_and_server_html() -> None:
    assert "createTextNode" in html.SCRIPT and "eval(" not in html.SCRIPT
    assert "%(poll)d" not in html.SCRIPT and str(html.POLL_MS) in html.SCRIPT
    assert "document.write" not in html.SCRIPT
