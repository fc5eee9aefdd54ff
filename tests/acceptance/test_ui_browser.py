"""The Dagster UI seen in a real browser: after `docqueue run --until-idle`, `docqueue ui` serves the asset graph and
the partitions of each asset with exactly the statuses the queue holds.

Headless Chromium from the distribution (`apt-get install chromium`), driven by Playwright without its own browser
download. Screenshots land in test-artifacts/ (gitignored).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests import pdf_factory as pf
from tests.integration.bolt_fixture import free_port

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
DOCQUEUE = str(Path(sys.executable).with_name("docqueue"))
CHROMIUM = Path(os.environ.get("DOCQUEUE_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SERVER_START_S = 240  # webserver + daemon + code server on a shared 2-core machine
UI_WAIT_MS = 90_000
STOP_S = 90
# the code server leaves on dagster dev's shutdown call, or at the latest once its 45 s heartbeat lapses
LEFTOVER_GRACE_S = 60


def checkout_env() -> dict[str, str]:
    """The environment of the moment, with this checkout first on the path: the `docqueue` script (and every
    process it starts) then runs this tree's code even where the virtualenv was installed from another one."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else "")}


def _docqueue_json(*args: str, timeout: float = 600, code: int = 0):
    proc = subprocess.run(
        [DOCQUEUE, *args, "--json"], capture_output=True, text=True, timeout=timeout, env=checkout_env()
    )
    assert proc.returncode == code, f"docqueue {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def _page_statuses(queue_url: str) -> dict[str, str]:
    """Partition key of every page -> its OCR status in the queue (the truth the UI must show)."""
    engine = sa.create_engine(queue_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("""SELECT d.document_key, p.page_number, p.ocr_status::text AS status
                                           FROM task_queue_page p JOIN documents d ON d.id = p.document_id""")
            ).all()
    finally:
        engine.dispose()
    return {f"{r.document_key}/p{r.page_number:04d}": r.status for r in rows}


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        todo += [int(c) for c in children]
    return found


class UiServer:
    """`docqueue ui` as a subprocess in a process group of its own, stopped the way a person stops it."""

    def __init__(self, port: int, log: Path):
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen(
            [DOCQUEUE, "ui", "--port", str(port), "--json"],
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
            text=True,
            start_new_session=True,
            env=checkout_env(),
        )

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"docqueue ui exited {self.proc.returncode}:\n{self.log_tail()}"
            try:
                if httpx.get(f"{self.url}/server_info", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"the Dagster webserver did not answer within {SERVER_START_S} s:\n{self.log_tail()}")

    def stop(self, how: signal.Signals = signal.SIGTERM) -> dict[int, str]:
        """`how` to the group: SIGTERM (docqueue asks `dagster dev` to shut down in order) or SIGKILL (the kernel
        tells `dagster dev` its parent died); returns processes left over, which are then killed so a failing test
        leaves nothing behind."""
        family = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, how)
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while time.monotonic() < deadline and any(_alive(pid) for pid in family):
            time.sleep(0.5)
        left = {pid: _command(pid) for pid in [self.proc.pid, *family] if _alive(pid)}
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        return left

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's `chromium` package (apt-get install chromium) "
            "or point DOCQUEUE_TEST_CHROMIUM at one"
        )
    return CHROMIUM


def test_ui_shows_the_asset_graph_and_partitions_of_a_processed_corpus(docqueue_env, chromium_path, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    pf.text_pdf(
        inbox,
        "handbook.pdf",
        [
            ["# Staff Handbook", "Grace Hopper joined the Navy in New York."],
            ["## Leave", "Holidays are agreed with the Boston office."],
        ],
    )
    pf.truncated_pdf(inbox, "broken.pdf")
    ingested = _docqueue_json("ingest", str(inbox))
    assert ingested["counts"]["new"] == 2
    _docqueue_json("run", "--until-idle", code=4)  # broken.pdf fails
    pages = _page_statuses(docqueue_env.queue_url)
    materialized = sorted(k for k, v in pages.items() if v == "completed")
    failed = sorted(k for k, v in pages.items() if v == "failed")
    assert len(materialized) >= 2 and set(pages.values()) <= {"completed", "failed"}, pages

    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    server = UiServer(port, tmp_path / "ui.log")
    try:
        server.wait_until_serving()
        announced = json.loads(server.proc.stdout.readline())
        assert announced["url"] == server.url and announced["dagster_home"] == str(docqueue_env.home / "dagster")

        location = httpx.post(
            f"{server.url}/graphql",
            timeout=30,
            json={"query": "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"},
        ).json()
        (location_name,) = [e["name"] for e in location["data"]["workspaceOrError"]["locationEntries"]]

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),
                executable_path=str(chromium_path),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1600, "height": 1000},
            )
            try:
                page = browser.new_page()
                page.set_default_timeout(UI_WAIT_MS)
                expect.set_options(timeout=UI_WAIT_MS)  # assertions wait as long as actions

                page.goto(f"{server.url}/asset-groups")
                expect(page.get_by_text("Global asset lineage")).to_be_visible()
                for group in ("ocr", "vector", "graphrag"):
                    expect(page.get_by_text(group, exact=True).first).to_be_visible()
                expect(page.get_by_text("fetching statuses")).to_have_count(0)  # the groups' statuses arrived
                page.screenshot(path=ARTIFACTS / "ui_asset_lineage.png")

                page.goto(f"{server.url}/locations/{location_name}/asset-groups/ocr")
                for asset in ("ocr_document", "ocr_page", "ocr_document_rollup"):
                    expect(page.get_by_text(asset, exact=True).first).to_be_visible()
                expect(page.get_by_text(f"{len(pages)} partitions", exact=True).first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_ocr_group.png")

                page.goto(f"{server.url}/assets/ocr_page?view=partitions")
                expect(page.get_by_text(f"{len(pages)} Partitions Selected")).to_be_visible()
                expect(page.get_by_text(f"Materialized ({len(materialized)})")).to_be_visible()
                expect(page.get_by_text(f"Failed ({len(failed)})")).to_be_visible()
                expect(page.get_by_text("Missing (0)")).to_be_visible()
                for key in materialized + failed:
                    expect(page.get_by_text(key, exact=True).first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_ocr_page_partitions.png")
            finally:
                browser.close()
    finally:
        left = server.stop()
    assert not left, f"processes still running after the UI was stopped: {left}\n{server.log_tail()}"
    assert server.proc.returncode == 0, server.log_tail()
