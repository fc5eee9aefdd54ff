"""The warm search session (resources/search_session.py) on real parts: the real model, the embedded vector store,
a real queue. Its results are `docqueue search --json`'s, and it keeps answering while a run writes to the store it
holds open, without keeping the run from finishing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queue_db.config import Settings
from resources.search_session import SearchSession
from tests.cli_runner import docqueue as run_docqueue

RUN_TIMEOUT_S = 600
TOPICS = {
    "bees": "Honey bees pollinate the clover in the meadow while the beekeeper counts the hives at dawn.",
    "volcano": "The volcano erupted at night and the lava flowed past the observatory, covering the road in ash.",
    "harbour": "Storm waves broke over the harbour wall and three fishing boats were torn from their moorings.",
}
LATER = {
    "glacier": "The glacier retreated forty metres in one summer, and meltwater flooded the valley below it.",
    "orchard": "Apple trees in the orchard were pruned in February and grafted with an older local variety.",
}


def docqueue(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return run_docqueue(*args, timeout=timeout, env={"COLUMNS": "200"})


def write_documents(folder: Path, topics: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    for name, sentence in topics.items():
        paragraphs = [f"{sentence} Note {n} on the {name} adds a detail of its own." for n in range(6)]
        (folder / f"{name}.md").write_text(f"# {name.title()}\n\n" + "\n\n".join(paragraphs) + "\n")
    return folder


def ingested_and_run(folder: Path) -> None:
    ingest = docqueue("ingest", str(folder), "--json")
    assert ingest.returncode == 0, ingest.stderr
    run = docqueue("run", "--until-idle", "--json")
    assert run.returncode == 0, run.stderr


@pytest.fixture
def processed(docqueue_env, tmp_path):
    ingested_and_run(write_documents(tmp_path / "first", TOPICS))
    return docqueue_env


def test_a_session_returns_what_docqueue_search_prints(processed):
    queries = ["bees pollinate clover", "lava and ash at night", "boats torn from moorings", "detail"]
    with SearchSession(Settings.from_env()) as session:
        for query in queries:
            for flags, mode in (([], "hybrid"), (["--sparse"], "sparse"), (["--dense"], "dense")):
                # the command runs while the session holds the store open: it asks for its turn and gets it
                printed = docqueue("search", query, "--limit", "3", "--json", *flags, timeout=120)
                assert printed.returncode == 0, printed.stderr
                assert session.search(query, 3, mode=mode).as_dict() == json.loads(printed.stdout), (query, mode)
        best = session.search("bees pollinate clover", 1)
        assert best.mode == "hybrid" and best.hits[0].document == "bees.md"
        assert session.search("bees", 3, tenant="someone-else").hits == []


def test_a_session_searches_while_a_run_writes_and_the_run_completes(processed, tmp_path):
    ingest = docqueue("ingest", str(write_documents(tmp_path / "later", LATER)), "--json")
    assert ingest.returncode == 0, ingest.stderr
    searches, errors = 0, []
    with SearchSession(Settings.from_env()) as session:
        run = subprocess.Popen(
            [sys.executable, "-m", "orchestration.cli", "run", "--until-idle", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run.poll() is None and time.monotonic() < deadline:
            try:
                result = session.search("bees pollinate clover", 3)
                assert result.hits and result.hits[0].document == "bees.md"
                searches += 1
            except Exception as exc:  # noqa: BLE001  (every failure is reported below, not just the first)
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)
        out, err = run.communicate(timeout=60)
        assert not errors, errors[:3]
        assert run.returncode == 0, err
        assert searches > 0
        summary = json.loads(out)["summary"]
        assert summary["failed"] == 0 and summary["open"] == 0, summary
        # what the run wrote is found by the same session once the run let go of the store
        assert session.search("glacier meltwater flooded the valley", 1).hits[0].document == "glacier.md"
