"""The Dagster UI as the operator's console, in a real browser against one running `docqueue ui` (webserver and
daemon), on a corpus with a file that can never succeed (an encrypted PDF without its password):

- the failed partition's reason is on its partition panel, behind "View all historical events";
- the checks show as evaluated after the run (no "Not evaluated");
- a backfill of the unfixable partition fails once, with its reason and the docqueue tags, and nothing is
  launched after it;
- the recovery sensor, ticking every 2 s, launches no run while nothing needs recovering;
- a second `docqueue ui` on the same port says in one sentence that a Dagster webserver holds it;
- SIGKILL of `docqueue ui`'s group leaves no process of it and a free port.

Screenshots land in test-artifacts/ (gitignored); see test_ui_browser for the browser set-up.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import dagster as dg
import httpx
import pytest

from tests import pdf_factory as pf
from tests.acceptance.test_ui_browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    DOCQUEUE,
    UI_WAIT_MS,
    UiServer,
    _docqueue_json,
    checkout_env,
    chromium_path,  # noqa: F401 - the fixture
)
from tests.integration.bolt_fixture import free_port

pytestmark = pytest.mark.slow

SENSOR_INTERVAL_S = 3
# every check of the code location: each roll-up evaluates its phase's for its documents
CHECKS = [
    dg.AssetCheckKey(dg.AssetKey(asset), name)
    for asset, name in (
        ("ocr_document", "has_pages_or_stated_failure"),
        ("ocr_page", "no_task_stuck_in_processing"),
        ("ocr_document_rollup", "parents_agree_with_children"),
        ("vector_chunk", "vectors_agree_with_queue"),
        ("graphrag_chunk", "graph_agrees_with_queue"),
    )
]
BACKFILL_WAIT_S = 120
LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""


def _graphql(url: str, query: str, variables: dict | None = None) -> dict:
    answer = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60).json()
    assert "errors" not in answer, answer
    return answer["data"]


def _backfill_runs(instance, backfill_id: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id})))


def _wait_for_backfill_run(instance, backfill_id: str) -> dg.DagsterRun:
    deadline = time.monotonic() + BACKFILL_WAIT_S
    while time.monotonic() < deadline:
        runs = _backfill_runs(instance, backfill_id)
        if runs and all(r.is_finished for r in runs):
            [run] = runs
            return run
        time.sleep(1)
    raise AssertionError(f"the backfill's run did not finish within {BACKFILL_WAIT_S} s")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_ui_shows_reasons_checks_and_no_clutter_and_stops_entirely(
    docqueue_env, chromium_path, tmp_path, monkeypatch
):
    from playwright.sync_api import expect, sync_playwright

    from orchestration.environment import dagster_instance
    from queue_db.config import Settings

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    pf.text_pdf(inbox, "handbook.pdf", [["# Staff Handbook", "Grace Hopper joined the Navy in New York."]])
    pf.encrypted_pdf(inbox, "locked.pdf", "secret")
    ingested = _docqueue_json("ingest", str(inbox))
    [locked] = [d["document_key"] for d in ingested["results"] if d["path"].endswith("locked.pdf")]
    _docqueue_json("run", "--until-idle", code=4)  # locked.pdf fails: encrypted

    monkeypatch.setenv("DOCQUEUE_SENSOR_INTERVAL", str(SENSOR_INTERVAL_S))
    monkeypatch.setenv("TASK_QUEUE_CHECK_INTERVAL", "2")
    instance = dagster_instance(Settings.from_env())
    first_runs = instance.get_runs()
    runs_before = {r.run_id for r in first_runs}
    for run in first_runs:  # tags a person reads, beside the ones the code reads
        assert run.tags["docqueue/process"].endswith(f"pid {run.tags['docqueue/runner'].split(':')[1]}")
        assert run.tags["docqueue/range"].endswith(("document)", "documents)", "page)", "pages)", "chunk)", "chunks)"))
    failed_rollups = [r for r in first_runs if r.tags["docqueue/kind"] == "rollup_ocr" and r.is_failure]
    assert len(failed_rollups) == 1, "the encrypted file's roll-up fails once"
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(CHECKS))
    assert set(latest) == set(CHECKS), f"never evaluated: {set(CHECKS) - set(latest)}"
    assert all(r.event.dagster_event.asset_check_evaluation_data.passed for r in latest.values())
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    server = UiServer(port, tmp_path / "ui.log")
    left: dict[int, str] = {}
    try:
        server.wait_until_serving()
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
                expect.set_options(timeout=UI_WAIT_MS)

                # the failed partition's panel: its failed run, and its own event with the reason one click away
                # (the panel's metadata table shows the latest materialization's only, and this one has none)
                page.goto(f"{server.url}/assets/ocr_document?view=partitions&partition={locked}")
                expect(page.get_by_text("failed, and did not materialize this asset.").first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_failed_partition_panel.png")
                page.get_by_text("View all historical events").first.click()
                expect(page.get_by_text(f"Historical events for {locked}")).to_be_visible()
                expect(page.get_by_text("Observation").first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_failed_partition_events.png")
                page.keyboard.press("Escape")

                # every check evaluated by the roll-ups of the run
                for asset, check in (
                    ("ocr_document", "has_pages_or_stated_failure"),
                    ("ocr_document_rollup", "parents_agree_with_children"),
                    ("vector_chunk", "vectors_agree_with_queue"),
                ):
                    page.goto(f"{server.url}/assets/{asset}?view=checks")
                    expect(page.get_by_text(check).first).to_be_visible()
                    expect(page.get_by_text("Passed").first).to_be_visible()
                    expect(page.get_by_text("Not evaluated")).to_have_count(0)
                page.screenshot(path=ARTIFACTS / "ui_checks_evaluated.png")

                # a backfill of the unfixable partition: one failed run, tagged, with its reason
                launched = _graphql(
                    server.url,
                    LAUNCH_BACKFILL,
                    {"params": {"partitionNames": [locked], "assetSelection": [{"path": ["ocr_document"]}]}},
                )["launchPartitionBackfill"]
                assert launched["__typename"] == "LaunchBackfillSuccess", launched
                run = _wait_for_backfill_run(instance, launched["backfillId"])
                assert run.status == dg.DagsterRunStatus.FAILURE
                run = instance.get_run_by_id(run.run_id)
                assert run.tags["docqueue/kind"] == "ocr_document" and run.tags["docqueue/phase"] == "ocr"
                assert run.tags["docqueue/range"] == f"{locked} (1 document)"
                time.sleep(3 * SENSOR_INTERVAL_S)  # the roll-up sensors tick after it
                page.goto(f"{server.url}/runs/{run.run_id}")
                expect(page.get_by_text(f"{locked}: encrypted: password required").first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_backfill_failed_once.png")
                new_runs = [r for r in instance.get_runs() if r.run_id not in runs_before]
                assert [r.run_id for r in new_runs] == [run.run_id], [(r.job_name, r.status) for r in new_runs]
                observed = [
                    e.asset_observation.partition
                    for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)
                    if e.asset_observation is not None
                ]
                assert observed == [locked], "the failed batch logs its partition's reason and no summary"
                skipped = [t.skip_reason or "" for t in _sensor_ticks(instance, "rollup_ocr_sensor")]
                assert any("failed the ocr phase again" in reason for reason in skipped), skipped[:3]

                # a quiet period: the recovery sensor ticked every 2 s and requested nothing
                page.goto(f"{server.url}/automation")
                page.get_by_role("link", name="recovery_sensor").first.click()
                # the tick list says "0 runs requested"; its status tag shows the skip reason on hover. The tags
                # are the tooltip triggers (the "Latest tick" line's first, then one per row, beside each row's
                # button of the same text); a row's tag is hovered, as the latest tick may still be evaluating.
                tags = page.locator("tr span[data-state]").filter(has_text="0 runs requested")
                expect(tags.nth(2)).to_be_visible()
                tags.nth(2).hover()
                expect(page.get_by_text("nothing to recover").first).to_be_visible()
                page.screenshot(path=ARTIFACTS / "ui_quiet_recovery_sensor.png")
                assert not instance.get_runs(filters=dg.RunsFilter(job_name="recovery_job"))
                # the daemon may be evaluating a tick right now (status STARTED): the finished ones are judged
                ticks = [t for t in _sensor_ticks(instance, "recovery_sensor") if t.status.value != "STARTED"]
                assert len(ticks) >= 5 and all(t.status.value == "SKIPPED" for t in ticks), [
                    (t.status.value, t.skip_reason) for t in ticks if t.status.value != "SKIPPED"
                ]
                assert ticks[0].skip_reason.startswith("nothing to recover")
            finally:
                browser.close()

        # a second `docqueue ui` on the same port names what holds it
        second = subprocess.run(
            [DOCQUEUE, "ui", "--port", str(port)], capture_output=True, text=True, timeout=120, env=checkout_env()
        )
        assert second.returncode == 2, second.stderr
        assert f"port {port} on 127.0.0.1 is in use: a Dagster webserver" in second.stderr, second.stderr
    finally:
        left = server.stop(signal.SIGKILL)
        instance.dispose()
    assert not left, f"processes still running after SIGKILL of docqueue ui's group: {left}\n{server.log_tail()}"
    assert _port_free(port), f"port {port} is still taken after docqueue ui was stopped"


def _sensor_ticks(instance, name: str) -> list:
    """The sensor's latest ticks, newest first, as its page lists them."""
    [state] = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return list(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50))
