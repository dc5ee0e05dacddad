"""The dashboard as a person sees it: Debian's chromium, headless, driven
through chromium-driver by Selenium, over a workspace populated by real runs
made through the real CLI (no hand-written rows):

    done     a finished run (it wrote out.txt in its working directory)
    live     a run that holds the one seat of slot ``one`` while it runs: it
             prints ``first-line``, then waits for a file the test creates
             (after the page is open) before it prints ``second-line-appeared``
    refused  a second run on slot ``one`` meanwhile: refused ``seat-full``
             (exit 3), recorded as a run
    repo     a ``--repo`` run that commits a line; its branch is imported into
             the main repository, where the run page's diff is read
    hostile  a run printing ``<script>``, an ``<img onerror>`` and terminal
             escapes, which the browser must show as inert text

One workspace, one server and one browser serve the whole module (each test
asserts its own page); the live run is ended with SIGINT at the end, and
nothing it started may be left running. Selenium Manager is never consulted:
the driver and the browser are named by path (no network in CI).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import Saphan, require, saphan_exe
from serve.served import Served, pid_alive, serving, stop

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PNG = b"\x89PNG\r\n\x1a\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
           "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid"}
DIFF_LINE = "a line the run committed"
HOSTILE_HTML = ("<script>document.title=\"pwned\";alert(\"pwned\")</script>"
                "<img src=x onerror=\"document.title='pwned';alert('pwned')\">")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def _run_id(err: str) -> str:
    """The run a `saphan run` names last on stderr (a refusal names its holders first)."""
    found = re.findall(r"\brun:? ([0-9A-HJKMNP-TV-Z]{26})\b", err)
    assert found, err
    return str(found[-1])


def _runs(s: Saphan) -> list[dict[str, Any]]:
    got = s.ok("runs", "list", "--json").json()
    assert isinstance(got, list)
    return got


def _left_running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd:
            found.append(int(d.name))
    return found


@dataclass
class Workspace:
    s: Saphan
    done: str
    live: str
    live_proc: subprocess.Popen[bytes]
    live_go: Path  # created by the test: the live run then prints its second line
    refused: str
    repo: str
    hostile: str
    workdir: Path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory,
              bwrap_available: None) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("browser")
    s = Saphan(root / "saphan")
    s.ok("init")
    s.ok("machine", "add", "here", "--local")
    s.ok("slot", "add", "here", "s1", "--tool", "command", "--max-sessions", "2")
    s.ok("slot", "add", "here", "one", "--tool", "command", "--max-sessions", "1")
    wd = root / "wd"
    wd.mkdir()
    run = ("run", "--machine", "here")

    # 1. a finished run
    r = s.ok(*run, "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c", "echo hi > out.txt")
    done = _run_id(r.err)
    assert (wd / "out.txt").read_text() == "hi\n"

    # 2. a live run holding slot one's only seat; its second line waits for live_go
    live_wd = root / "live-wd"
    live_wd.mkdir()
    marker = f"saphan-browser-{uuid.uuid4().hex}"
    script = (f": {marker}; echo first-line; while [ ! -e go ]; do sleep 0.2; done; "
              "echo second-line-appeared; exec sleep 600")
    proc = subprocess.Popen([saphan_exe(), *run, "--slot", "one", "--workdir", str(live_wd),
                             "--", "sh", "-c", script], env=s.env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        live = None
        while live is None:
            assert proc.poll() is None, f"the live run ended early: {proc.returncode}"
            assert time.monotonic() < deadline, "the live run never held its seat"
            live = next((x["id"] for x in _runs(s)
                         if x["slot"] == "one" and x["state"] == "running"), None)
            if live is None:
                time.sleep(0.2)
        out = s.home / "runs" / live / "stdout.log"
        while b"first-line" not in (out.read_bytes() if out.exists() else b""):
            assert proc.poll() is None and time.monotonic() < deadline, "no first-line"
            time.sleep(0.1)

        # 3. a refusal recorded as a run: the seat is held
        r = s(*run, "--slot", "one", "--workdir", str(wd), "--", "true")
        assert r.code == 3 and "refused [seat-full]" in r.err, r
        refused = _run_id(r.err)
        row = next(x for x in _runs(s) if x["id"] == refused)
        assert row["outcome"] == "refused" and row["refusal"]["class"] == "seat-full"

        # 4. a --repo run that commits; its branch is imported into the main repository
        repo = root / "repo"
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
        (repo / "README").write_text("hello\n")
        _git(repo, "add", "README")
        _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "base")
        r = s(*run, "--slot", "s1", "--repo", str(repo), "--", "sh", "-c",
              f"echo '{DIFF_LINE}' >> README && git commit -q -am 'from the run'",
              env=s.env(**GIT_ENV))
        assert r.code == 0, r.err
        repo_run = _run_id(r.err)
        assert DIFF_LINE in _git(repo, "show", f"saphan/{repo_run}")

        # 5. output a browser must not interpret
        r = s.ok(*run, "--slot", "s1", "--workdir", str(wd), "--", "sh", "-c",
                 f"printf '%s\\n' {shlex.quote(HOSTILE_HTML)}; "
                 "printf 'osc52 \\033]52;c;aGk=\\007 red \\033[31mRED\\033[0m end\\n'")
        hostile = _run_id(r.err)

        yield Workspace(s, done, live, proc, live_wd / "go", refused, repo_run, hostile, wd)
    finally:
        stop(proc, timeout=30)
        deadline = time.monotonic() + 10
        while _left_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert _left_running(marker) == [], "the live run left processes behind"
    assert not pid_alive(proc.pid)
    ended = next(x for x in _runs(s) if x["id"] == live)
    assert (ended["state"], ended["outcome"]) == ("ended", "interrupted"), ended


@pytest.fixture(scope="module")
def server(workspace: Workspace) -> Iterator[Served]:
    with serving(workspace.s) as got:
        yield got


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require(importlib.util.find_spec("selenium") is not None,
            "selenium (pip install 'selenium>=4.20')")
    require(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (apt-get install chromium)")
    require(os.access(CHROMEDRIVER, os.X_OK), f"{CHROMEDRIVER} (apt-get install chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", f"--user-data-dir={profile}", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"):
        options.add_argument(arg)
    # Named by path: Selenium Manager is never asked (it would download).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any, server: Served) -> Any:
    """The browser signed in: the startup URL opened (the token becomes a cookie)."""
    browser.get(server.url)
    assert "token" not in browser.current_url
    return browser


def _wait(driver: Any, what: Any, timeout: float = 20.0, message: str = "") -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(what, message)


def _shot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == PNG
    print(f"screenshot: {path}")


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


# -- the tests ------------------------------------------------------------------------------------

def test_no_token_is_403_and_the_startup_url_drops_its_token(browser: Any, server: Served,
                                                           tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.base + "/runs")  # on the origin, so its cookies can be cleared
    browser.delete_all_cookies()
    browser.get(server.base + "/")
    body = _text(browser, "body")
    assert body.startswith("403: this dashboard needs the token"), body
    assert not browser.find_elements(By.CSS_SELECTOR, "h1")
    _shot(browser, tmp_path, "no-token")
    assert server.token not in browser.page_source

    browser.get(server.url)
    assert browser.current_url == server.base + "/", browser.current_url
    assert "token" not in browser.current_url
    assert _text(browser, "main h1") == "Fleet"
    assert browser.title == "fleet · saphan"
    # the cookie is not readable by a script (HttpOnly)
    assert browser.execute_script("return document.cookie") == ""
    # the page has a name of its own (the browser resolves *.localhost itself), and the
    # token opened on 127.0.0.1 is sent on to it: no cookie is ever set on 127.0.0.1
    assert server.name.endswith(".localhost") and server.name.startswith("s-")
    browser.get(f"http://127.0.0.1:{server.port}/runs?token={server.token}")
    assert browser.current_url == server.base + "/runs", browser.current_url
    assert _text(browser, "main h1") == "Runs"
    browser.get(f"http://127.0.0.1:{server.port}/runs")
    assert _text(browser, "body").startswith("403"), "a cookie reached 127.0.0.1"
    _shot(browser, tmp_path, "signed-in")


def test_fleet_shows_the_held_ordinal_and_its_holder(page: Any, workspace: Workspace,
                                                     tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    slot = page.find_element(By.ID, "machine-here")
    held = slot.find_elements(By.CSS_SELECTOR, "tr.seat.held")
    assert len(held) == 1, [h.text for h in held]
    seat = held[0]
    assert seat.get_attribute("data-ordinal") == "0"
    cells = [c.text for c in seat.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == "0" and cells[1].startswith("held")
    link = seat.find_element(By.CSS_SELECTOR, "td a")
    assert link.text == workspace.live
    assert link.get_attribute("href").endswith(f"/run/{workspace.live}")
    assert cells[3] == str(workspace.live_proc.pid)
    assert cells[4] == socket.gethostname()
    assert seat.find_element(By.CSS_SELECTOR, ".life").text == "alive"
    # the live run's seat is backed by its live record (not a row alone)
    assert "row only" not in seat.text and "flagged" not in seat.get_attribute("class")
    # the other slot's two ordinals are free: one row for the run of free seats
    free = slot.find_elements(By.CSS_SELECTOR, "tr.seat.free")
    assert [[c.text for c in r.find_elements(By.TAG_NAME, "td")][:2] for r in free] == [
        ["0..1", "free (2 seats)"]]
    assert "1 live run(s)" in _text(page, "main")
    _shot(page, tmp_path, "fleet")


def test_refusal_page_shows_class_and_remediation(page: Any, server: Served,
                                                  workspace: Workspace, tmp_path: Path) -> None:
    page.get(f"{server.base}/run/{workspace.refused}")
    assert _text(page, ".refusal .class") == "seat-full"
    fix = _text(page, ".refusal .remediation")
    assert "saphan run --wait" in fix and "saphan slot set here one --max-sessions N" in fix
    assert workspace.live in _text(page, ".refusal")  # the holder is named
    assert "outcome refused" in _text(page, "main > p")
    _shot(page, tmp_path, "refusal")


def test_repo_run_page_shows_the_committed_line(page: Any, server: Served,
                                                workspace: Workspace, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page.get(f"{server.base}/run/{workspace.repo}")
    diff = _text(page, "pre.diff")
    assert f"+{DIFF_LINE}" in diff.splitlines(), diff
    added = [e.text for e in page.find_elements(By.CSS_SELECTOR, "pre.diff span.add")]
    assert added == [f"+{DIFF_LINE}"]
    assert diff.startswith("diff --git a/README b/README")
    assert "read from the main repository" in _text(page, "main")
    page.execute_script("arguments[0].scrollIntoView()",
                        page.find_element(By.CSS_SELECTOR, "main h2:last-of-type"))
    _shot(page, tmp_path, "repo-diff")


def test_live_output_appears_while_the_run_runs(page: Any, server: Served,
                                                workspace: Workspace, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    assert not workspace.live_go.exists(), "the second line is written after the page loads"
    page.get(f"{server.base}/run/{workspace.live}")
    _wait(page, lambda d: "first-line" in _text(d, "pre#stdout"), 20,
          "first-line never shown")
    assert "second-line-appeared" not in _text(page, "pre#stdout")
    loaded = page.execute_script("return performance.timeOrigin")
    workspace.live_go.touch()  # now the run prints its second line
    _wait(page, lambda d: "second-line-appeared" in _text(d, "pre#stdout"), 20,
          "the second line never appeared")
    # the same document: the text came in while the page stayed open
    assert page.execute_script("return performance.timeOrigin") == loaded
    assert _text(page, "pre#stdout").splitlines() == ["first-line", "second-line-appeared"]
    assert page.find_element(By.ID, "stdout").get_attribute("data-done") is None  # still live
    _shot(page, tmp_path, "live-output")


def test_runs_list_lists_the_runs_and_updates_live(page: Any, server: Served,
                                                   workspace: Workspace, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page.get(f"{server.base}/runs")
    body = page.find_element(By.CSS_SELECTOR, "tbody#runs")
    shown = {r.get_attribute("data-run"): r for r in body.find_elements(By.CSS_SELECTOR, "tr.run")}
    for rid in (workspace.done, workspace.live, workspace.refused, workspace.repo,
                workspace.hostile):
        assert rid in shown, rid
    assert "seat-full" in shown[workspace.refused].text
    assert "refused" in shown[workspace.refused].text
    assert "running" in shown[workspace.live].text
    loaded = page.execute_script("return performance.timeOrigin")

    r = workspace.s.ok("run", "--machine", "here", "--slot", "s1", "--workdir",
                       str(workspace.workdir), "--", "true")
    new = _run_id(r.err)
    assert new not in shown
    _wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, f'tbody#runs tr[data-run="{new}"]'),
          10, "the new run never appeared")
    assert page.execute_script("return performance.timeOrigin") == loaded  # not reloaded
    first = page.find_element(By.CSS_SELECTOR, "tbody#runs tr.run")
    assert first.get_attribute("data-run") == new  # newest first
    _shot(page, tmp_path, "runs")


def test_hostile_output_is_inert_text(page: Any, server: Served, workspace: Workspace,
                                      tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    page.get(f"{server.base}/run/{workspace.hostile}")
    _wait(page, lambda d: d.find_element(By.ID, "stdout").get_attribute("data-done") == "1",
          20, "the output was never read whole")
    time.sleep(0.5)  # an onerror, had it been parsed, would have fired by now
    with pytest.raises(NoAlertPresentException):
        page.switch_to.alert.text  # noqa: B018
    assert page.title == f"run {workspace.hostile} · saphan"
    assert page.execute_script("return document.title") != "pwned"
    out = page.find_element(By.ID, "stdout")
    assert out.find_elements(By.CSS_SELECTOR, "*") == []  # text only: no img, no script
    assert not page.find_elements(By.CSS_SELECTOR, "main img")
    text = out.text
    assert HOSTILE_HTML in text, text
    assert "osc52 \\x1b]52;c;aGk=\\x07 red \\x1b[31mRED\\x1b[0m end" in text, text
    assert "\x1b" not in text and "\x07" not in text
    # the record shows the command as text too
    assert "<script>document.title" in _text(page, "pre.record")
    assert not page.find_elements(By.CSS_SELECTOR, "pre.record *")
    _shot(page, tmp_path, "hostile")
