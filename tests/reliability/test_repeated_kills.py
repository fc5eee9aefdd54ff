"""Fault-matrix row 4 on documents, at a small size: `docqueue run --until-idle` SIGKILLed (its whole process group)
again and again, each time after it has claimed work, over a mixed corpus (text PDFs, a scanned page, Markdown, a
truncated PDF, an encrypted one without its password, a PNG named .pdf). Every document must end as it ends in a
clean run of the same corpus: the same statuses, error classes and messages, pages and chunks; the same points and
graph counts with nothing twice; `docqueue verify` clean (bench/faults.py row 4 runs it with 50 kills)."""

from __future__ import annotations

from tests.reliability.support import figures_line


class _Databases:
    def __init__(self, create_database):
        self.create_database = create_database

    def create(self, prefix: str) -> str:
        return self.create_database(prefix=prefix)


def test_a_run_killed_again_and_again_ends_every_document_as_a_clean_run(create_database, bolt_server, tmp_path, say):
    from bench import _document_kills, faults

    args = faults.parse_args(["--rows", "4", "--quick"])
    args.document_kills, args.document_kill_gap_s, args.drain_timeout_s = 3, 1.0, 180.0
    bolt = {
        "uri": bolt_server.uri,
        "user": bolt_server.user,
        "password": bolt_server.password,
        "database": bolt_server.database,
    }
    figures = _document_kills.row(args, (bolt, _Databases(create_database)), tmp_path)

    assert figures["errors"] == [], figures
    assert figures["faults_injected"] == 3, figures
    assert figures["documents_as_clean"] == figures["documents"] == 7, figures
    assert figures["tasks_lost"] == 0 and figures["completed_twice"] == 0, figures
    assert figures["duplicate_nodes_edges"] == 0, figures
    outcomes = figures["outcomes"]
    assert outcomes["scanned.pdf"].startswith("completed") and outcomes["notes.md"].startswith("completed"), outcomes
    assert outcomes["locked.pdf"].startswith("ocr failed: encrypted"), outcomes
    say(
        figures_line(
            "docqueue run sigkilled over mixed documents",
            {
                "faults": figures["faults_injected"],
                "tasks_recovered": figures["tasks_released"],
                "most_attempts": figures["most_attempts"],
                "documents_as_clean": figures["documents_as_clean"],
                "duplicates": figures["duplicate_nodes_edges"] + figures["completed_twice"],
                "tasks_lost": figures["tasks_lost"],
            },
        )
    )
