"""Bad input, processed once for the module through the whole pipeline: every file of the shared corpus (when
present) and generated hostile files. Each one either completes or ends with a clear reason, within bounds, and
none of them affects the others. Prints a table file -> outcome."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pdf_factory as pf
from tests.conftest import CORPUS_DIR
from tests.reliability.support import REPO_ROOT, announce

ALL_COMPLETED = ("completed", "completed", "completed")
CORPUS_LIMITS = {
    "DOCQUEUE_OCR_DPI": "72",  # OCR quality is test_corpus_ocr's subject; here only outcomes and bounds
    "DOCQUEUE_PAGE_TIMEOUT": "60",
    "DOCQUEUE_MAX_PAGES": "2000",
    "DOCQUEUE_WORKER_MEMORY_MB": "2048",
    "DOCQUEUE_MAX_RENDER_PIXELS": "4000000",
    "MAX_TASK_RETRIES": "2",
}


@dataclass
class Outcome:
    name: str
    category: str
    status: str  # "rejected" at intake, else "ocr/vector/graphrag" statuses
    reason: str = ""
    pages: int | None = None
    seconds: float | None = None

    @property
    def completed(self) -> bool:
        return self.status == "/".join(ALL_COMPLETED)


def _manifest() -> list[dict]:
    with open(CORPUS_DIR / "MANIFEST.tsv", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def _password(notes: str) -> str | None:
    match = re.search(r"password (\w+)", notes)
    return match.group(1) if match and match.group(1) != "unknown" else None


def _ingest_with_password_file(path: Path, password: str, folder: Path) -> None:
    """As a user would: `docqueue ingest --password-file` (the file's path is stored, never the password)."""
    secret = folder / f"{path.stem}.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", "ingest", "--password-file", str(secret), "--json", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert password not in done.stdout + done.stderr


def _generated(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    return {
        "zero-byte": pf.zero_byte_pdf(folder),
        "not a PDF (PNG named .pdf)": pf.not_a_pdf(folder),
        "truncated": pf.truncated_pdf(folder),
        "10,000 blank pages": pf.blank_pages_pdf(folder, 10_000),
        "huge embedded image": pf.huge_image_pdf(folder),
        "giant page (250 x 500 inches)": pf.poster_pdf(folder),
        "deeply nested objects": pf.nested_objects_pdf(folder),
        "good neighbour": pf.text_pdf(folder, "neighbour.pdf", [pf.DEMO_PAGE]),
    }


@pytest.fixture(scope="module")
def processed(module_env, zygote, tmp_path_factory, request):
    env, patch = module_env
    for name, value in CORPUS_LIMITS.items():
        patch.setenv(name, value)
    from tests.reliability.conftest import Pipeline

    work = tmp_path_factory.mktemp("bad-input")
    pipeline = Pipeline(work)
    inputs: dict[str, tuple[str, Path]] = {
        f"generated: {label}": ("generated", path) for label, path in _generated(work / "generated").items()
    }
    passwords = {}
    if CORPUS_DIR.is_dir():
        for row in _manifest():
            inputs[row["filename"]] = (row["category"], CORPUS_DIR / row["filename"])
            if row["category"] == "encrypted" and _password(row["notes"]):
                passwords[row["filename"]] = _password(row["notes"])
    # one intake call for all the others: one registration block, so a handful of ranged runs per phase
    plain = [label for label in inputs if label not in passwords]
    results = dict(zip(plain, pipeline.ingest([inputs[label][1] for label in plain])))
    for number, (label, password) in enumerate(passwords.items()):
        path = inputs[label][1]
        if number == 0:
            _ingest_with_password_file(path, password, work)
            results[label] = pipeline.ingest([path])[0]  # a duplicate now: gives its id
        else:  # what `ingest --password-file` stores, without another CLI start-up
            secret = work / f"{path.stem}.password"
            secret.write_text(password + "\n")
            results[label] = pipeline.ingest([path], password_ref=f"file:{secret.resolve()}")[0]
    started = time.monotonic()
    helper = zygote.spawn("corpus", work)  # a second worker beside this process's: two ranged runs at a time
    report = pipeline.run_until_idle(max_seconds=900)
    helper_report = helper.finish(900)
    report.runs += helper_report["runs"]
    seconds = time.monotonic() - started
    outcomes = {
        label: _outcome(pipeline.queue, label, category, results[label]) for label, (category, _) in inputs.items()
    }
    _print_table(request, outcomes, seconds, report, _phase_seconds(pipeline.queue))
    assert report.seconds < 900, "the run did not settle"
    yield pipeline, outcomes
    pipeline.instance.dispose()


def _outcome(queue, label: str, category: str, result) -> Outcome:
    if result.status == "rejected":
        return Outcome(label, category, "rejected", result.reason or "")
    document = queue.document(result.document_id)
    status = "/".join(document[c] or "-" for c in ("ocr_status", "vector_index_status", "graphrag_index_status"))
    reason = document["ocr_error"] or document["vector_error"] or document["graphrag_error"] or ""
    with queue.engine.connect() as conn:
        seconds = conn.exec_driver_sql(
            "SELECT max(ocr_seconds) FROM task_queue_page WHERE document_id = %(d)s", {"d": result.document_id}
        ).scalar()
    return Outcome(label, category, status, reason, document["page_count"], seconds)


def _phase_seconds(queue) -> str:
    with queue.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT (SELECT count(*) FROM task_queue_page), (SELECT sum(ocr_seconds) FROM task_queue_page),"
            " (SELECT count(*) FROM task_queue_page WHERE ocr_method LIKE 'ocr:%%'),"
            " (SELECT count(*) FROM task_queue_chunk), (SELECT sum(vector_seconds) FROM task_queue_chunk),"
            " (SELECT sum(graphrag_seconds) FROM task_queue_chunk)"
        ).one()
    return (
        f"{row[0]} pages ({row[2]} OCR'd) converted in {row[1] or 0:.0f} s, {row[3]} chunks embedded in "
        f"{row[4] or 0:.0f} s and extracted in {row[5] or 0:.0f} s"
    )


def _print_table(request, outcomes: dict[str, Outcome], seconds: float, report, phases: str) -> None:
    lines = [
        f"[reliability] bad input: {len(outcomes)} files in {seconds:.0f} s ({report.runs} runs): {phases}",
        f"{'file':44} {'category':10} {'pages':>5} {'max page s':>10}  outcome",
    ]
    for o in outcomes.values():
        pages = "" if o.pages is None else str(o.pages)
        slowest = "" if o.seconds is None else f"{o.seconds:.1f}"
        lines.append(
            f"{o.name[:44]:44} {o.category:10} {pages:>5} {slowest:>10}  {o.status}"
            + (f"  ({o.reason[:90]})" if o.reason else "")
        )
    counts = {}
    for o in outcomes.values():
        kind = "completed" if o.completed else ("rejected" if o.status == "rejected" else "failed")
        counts[kind] = counts.get(kind, 0) + 1
    lines.append("[reliability] bad input outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    announce(request, "\n".join(lines))


def _by_category(outcomes, category):
    return {name: o for name, o in outcomes.items() if o.category == category}


# ------------------------------------------------------------------------------------------ generated files
def test_generated_hostile_files_fail_clearly_within_bounds(processed):
    _, outcomes = processed
    get = lambda label: outcomes[f"generated: {label}"]  # noqa: E731
    assert get("zero-byte").status == "rejected" and get("zero-byte").reason == "empty: zero-byte file"
    png = get("not a PDF (PNG named .pdf)")  # the content decides: refused, or read as the image it is
    assert (png.status == "rejected" and png.reason.startswith("unsupported:")) or png.completed, png
    blank = get("10,000 blank pages")
    assert blank.status.startswith("failed") and blank.reason == "too many pages: 10000 > limit 2000"
    nested = get("deeply nested objects")
    assert nested.completed or (nested.status.startswith("failed") and nested.reason.startswith("page 1: corrupt:")), (
        nested
    )
    truncated = get("truncated")
    assert truncated.completed or truncated.reason.startswith(("corrupt:", "page ")), truncated
    giant = get("giant page (250 x 500 inches)")  # rendered within DOCQUEUE_MAX_RENDER_PIXELS
    assert giant.completed or re.search(r"resource limit|timeout|too large", giant.reason), giant
    huge = get("huge embedded image")
    assert huge.completed or re.search(r"resource limit|timeout|too large", huge.reason), huge
    assert huge.seconds is None or huge.seconds < float(CORPUS_LIMITS["DOCQUEUE_PAGE_TIMEOUT"])
    assert get("good neighbour").completed  # hostile files next to it changed nothing


def test_nothing_is_left_in_flight_and_the_stores_agree(processed):
    from orchestration.verify import verify_stores
    from tests.reliability.support import Stores, graph_duplicates

    pipeline, outcomes = processed
    for o in outcomes.values():
        phases = o.status.split("/")
        assert "processing" not in phases, o
        assert o.status == "rejected" or o.completed or "failed" in phases, o
        if "pending" in phases:  # a later phase only waits behind a failed earlier one
            assert "failed" in phases[: phases.index("pending")], o
        assert o.completed or o.reason, f"{o.name}: not completed and no reason given"
    assert not any(pipeline.queue.ready_counts().values())
    stores = Stores.open()
    try:
        report = verify_stores(pipeline.queue, stores.vector, stores.graph)
        assert report.consistent, report.as_dict()
        assert set(graph_duplicates(stores.graph).values()) == {0}
    finally:
        stores.close()


# ------------------------------------------------------------------------------------------ the shared corpus
@pytest.mark.corpus
def test_corpus_text_and_scanned_files_complete(processed):
    _, outcomes = processed
    for category in ("text", "scanned"):
        files = _by_category(outcomes, category)
        assert files and all(o.completed for o in files.values()), {n: (o.status, o.reason) for n, o in files.items()}


@pytest.mark.corpus
def test_corpus_encrypted_files_open_with_their_password_or_say_it_is_required(processed):
    _, outcomes = processed
    rows = {row["filename"]: row for row in _manifest()}
    for name, o in _by_category(outcomes, "encrypted").items():
        if _password(rows[name]["notes"]):
            assert o.completed, (name, o.status, o.reason)
        else:
            assert o.status.startswith("failed") and o.reason == "encrypted: password required", (name, o)


@pytest.mark.corpus
def test_corpus_corrupt_files_repair_and_complete_or_fail_with_the_reason(processed):
    _, outcomes = processed
    for name, o in _by_category(outcomes, "corrupt").items():
        if o.status == "rejected":
            assert o.reason.startswith("unsupported:"), (name, o.reason)
        elif not o.completed:
            assert o.status.startswith("failed") and "corrupt" in o.reason, (name, o.status, o.reason)
    assert outcomes["pdfjs__helloworld-bad.pdf"].completed  # repairable -> one page with text


@pytest.mark.corpus
def test_corpus_bomb_and_odd_files_stay_within_bounds(processed):
    _, outcomes = processed
    for name, o in _by_category(outcomes, "other").items():
        assert o.completed or re.search(r"resource limit|timeout|too large|too many", o.reason), (name, o)
        assert o.seconds is None or o.seconds < float(CORPUS_LIMITS["DOCQUEUE_PAGE_TIMEOUT"]), (name, o.seconds)
