"""A PDF whose page tree PyMuPDF cannot read goes through every phase on pdfium's reading of it: its text page by
the text layer, its scanned page by OCR. The engine shows in the document's metadata, the OCR asset's
materialization and `docqueue status`; a PDF no engine opens fails with one sentence beside it."""

from __future__ import annotations

from pathlib import Path

from queue_db.phases import Level
from tests import pdf_factory as factory
from tests.acceptance.test_input_types import pipeline_env  # noqa: F401 - a fixture, used by name

TEXT_PAGE = ["# Lighthouse Log", "The keeper trimmed the wick and wrote the weather in a leather journal."]


def test_a_page_tree_only_pdfium_reads_completes_every_phase(pipeline_env):  # noqa: F811
    import dagster as dg
    from click.testing import CliRunner

    from orchestration.cli import main
    from orchestration.intake import IntakeRules, ingest_paths
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings
    from queue_db.readmodels import document_progress_rows

    defs, instance, queue, storage, tmp = pipeline_env
    sources, folder = tmp / "sources", tmp / "in"
    sources.mkdir()
    folder.mkdir()
    text = factory.text_pdf(sources, "text.pdf", [TEXT_PAGE], footer_page_numbers=False)
    scan, scanned_words = factory.scanned_pdf(sources, "scan.pdf", dpi=150)
    factory.broken_page_tree_pdf(folder, "logbook.pdf", [text, scan], flaw="count")
    factory.unreadable_pdf(folder, "noise.pdf")
    rules = IntakeRules.from_settings(Settings.from_env())
    results = {Path(r.path).name: r for r in ingest_paths(queue, storage, [folder], rules=rules)}
    assert {n: r.status for n, r in results.items()} == {"logbook.pdf": "new", "noise.pdf": "new"}
    register_partitions(instance, queue.engine, Level.DOCUMENT)

    run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, max_seconds=300)

    logbook = queue.document(results["logbook.pdf"].document_id)
    statuses = (logbook["ocr_status"], logbook["vector_index_status"], logbook["graphrag_index_status"])
    assert statuses == ("completed",) * 3, logbook["ocr_error"]
    assert (logbook["page_count"], logbook["metadata"]["engine"], logbook["metadata"]["repaired"]) == (
        2,
        "pdfium",
        True,
    )
    pages = queue.pages(logbook["id"])
    assert [p["ocr_method"] for p in pages] == ["text-layer", "ocr:rapidocr"]
    first, second = (storage.get_text(p["page_file_path"]) for p in pages)
    assert "Lighthouse Log" in first and "leather journal" in first
    assert factory.word_recall(scanned_words, second) >= 0.9, second
    chunks = queue.chunks(document_id=str(logbook["id"]))
    assert chunks and {(c["vector_status"], c["graphrag_status"]) for c in chunks} == {("completed", "completed")}
    materialized = instance.fetch_materializations(dg.AssetKey("ocr_document"), limit=10).records
    engines = {r.asset_materialization.metadata["engine"].value for r in materialized if r.asset_materialization}
    assert engines == {"pdfium"}

    noise = queue.document(results["noise.pdf"].document_id)
    assert (noise["ocr_status"], noise["ocr_error_class"]) == ("failed", "corrupt")
    assert noise["ocr_error"].startswith("corrupt: cannot open as PDF (")
    assert noise["ocr_error"].endswith("; pdfium cannot open it either (data format error)")
    assert "\n" not in noise["ocr_error"] and "Traceback" not in noise["ocr_error"]
    assert not any(queue.ready_counts().values())  # nothing is left waiting: the failure is final

    (row,) = document_progress_rows(queue.engine, str(logbook["id"]))
    assert row["engine"] == "pdfium"
    shown = CliRunner().invoke(
        main, ["status", logbook["document_key"]], env={"COLUMNS": "300"}, catch_exceptions=False
    )
    assert shown.exit_code == 0 and "pages read by pdfium" in shown.output, shown.output
