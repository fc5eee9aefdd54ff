"""Fault-matrix row 6, a damaged vector store: while nothing runs, one segment file of a shard of the embedded store
is cut to nothing or deleted. `docqueue verify` names the shard in one sentence and exits 3; `docqueue repair
--vectors` keeps the shard renamed, opens a fresh one and re-queues exactly the chunks whose points went with it;
`docqueue run --until-idle` rewrites them from the stored chunk text. The other shard's points and the graph's
nodes and edges stay as they were, and verify is clean again (bench/faults.py row 6 measures it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests import pdf_factory as pf
from tests.cli_runner import docqueue
from tests.reliability.support import Stores, document_statuses, figures_line, store_figures

ALL_COMPLETED = ("completed", "completed", "completed")
# (the shard damaged, the segment file, what is done to it): the engine refuses to open a shard whose payload
# page is gone, and refuses to read the vectors of one whose vector file is cut
DAMAGES = {
    "truncated": ("main", "vector_storage/vectors/chunk_0.mmap", "truncate"),
    "deleted": ("tail", "payload_storage/page_0.dat", "delete"),
}


def shard_points(store) -> dict[str, set[str]]:
    """The chunk ids each shard holds ("tail", "main")."""
    from resources.qdrant_edge_shard import pages

    held: dict[str, set[str]] = {"tail": set(), "main": set()}
    with store._both() as (tail, main):
        for side, shard in (("tail", tail), ("main", main)):
            if shard is not None:
                for records in pages(shard, None, 256, ["chunk_id"]):
                    held[side].update(r.payload["chunk_id"] for r in records)
    return held


def damage(folder: Path, file: str, how: str) -> Path:
    """Cut or delete `file` in the shard's first segment that has it."""
    target = next(p / file for p in sorted((folder / "segments").iterdir()) if (p / file).is_file())
    if how == "truncate":
        os.truncate(target, 0)
    else:
        target.unlink()
    return target


def close_everything(stores: Stores | None = None) -> None:
    """Nothing runs when the damage happens: this process lets go of every shard it keeps open."""
    from resources.folder_lock import release_lingering

    if stores is not None:
        stores.close()
    release_lingering()


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_vector_shard_is_named_set_aside_and_rebuilt_from_the_queue(pipeline, tmp_path, say, case):
    side, file, how = DAMAGES[case]
    topics = list(pf.TWO_TOPICS.values())
    first = [pf.text_pdf(tmp_path, f"first-{i}.pdf", [topics[i % 2], pf.DEMO_PAGE]) for i in (0, 1)]
    pipeline.ingest(first)
    pipeline.run_until_idle(max_seconds=120)
    stores = Stores.open()
    stores.vector.optimize()  # the first documents' points move to the main shard, as the nightly job does
    close_everything()
    pipeline.ingest([pf.text_pdf(tmp_path, "second.pdf", [topics[1], topics[0]])])
    started = time.monotonic()
    pipeline.run_until_idle(max_seconds=120)
    clean_run_s = time.monotonic() - started
    assert set(document_statuses(pipeline.queue).values()) == {ALL_COMPLETED}, document_statuses(pipeline.queue)
    held = shard_points(stores.vector)
    assert held["main"] and held["tail"] and not held["main"] & held["tail"], held
    before = store_figures(pipeline.queue, stores)
    folder = stores.vector.folder if side == "main" else stores.vector.tail_folder
    healthy = "tail" if side == "main" else "main"
    close_everything(stores)

    damage(folder, file, how)
    # the nightly job's verification fails its run with the same one sentence, and sets nothing aside
    nightly = pipeline.defs.resolve_job_def("nightly_reconciliation_job").execute_in_process(
        instance=pipeline.instance, raise_on_error=False
    )
    close_everything()
    failures = [e.step_failure_data.user_failure_data for e in nightly.get_step_failure_events()]
    assert not nightly.success and len(failures) == 1 and failures[0] is not None, failures
    said = failures[0].description or ""
    assert said.startswith(f"the vector store's shard {folder} is damaged (") and "\n" not in said, said
    assert folder.is_dir() and not list(folder.parent.glob("*.damaged-*"))
    started = time.monotonic()
    verify = docqueue("verify", "--json")
    detect_s = time.monotonic() - started
    assert verify.returncode == 3, (verify.returncode, verify.stdout[-2000:], verify.stderr[-2000:])
    sentence = verify.stderr.strip()
    assert sentence.startswith(f"docqueue: the vector store's shard {folder} is damaged ("), sentence
    assert "\n" not in sentence and "Traceback" not in sentence, sentence
    assert json.loads(verify.stdout) == {
        "consistent": False,
        "damaged": sentence[len("docqueue: ") :],
        "shard": str(folder),
    }

    started = time.monotonic()
    repaired = docqueue("repair", "--vectors", "--json")
    assert repaired.returncode == 0, (repaired.stdout[-2000:], repaired.stderr[-2000:])
    result = json.loads(repaired.stdout)
    assert [d["shard"] for d in result["damaged_shards"]] == [str(folder)], result
    kept = Path(result["damaged_shards"][0]["kept_as"])
    assert kept.name.startswith(f"{folder.name}.damaged-") and (kept / "edge_config.json").is_file(), result
    # exactly the chunks the damaged shard held: the healthy shard's are not touched
    assert result["requeued_vector_chunks"] == len(held[side]), (result, len(held[side]))
    again = docqueue("repair", "--vectors", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["damaged_shards"] == [] and json.loads(again.stdout)["requeued_vector_chunks"] == 0
    with pipeline.queue.engine.connect() as conn:
        requeued = {
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT chunk_id FROM task_queue_chunk WHERE vector_status <> 'completed'"
            ).all()
        }
    assert requeued == held[side], (len(requeued), len(held[side]))

    run = docqueue("run", "--until-idle", "--max-seconds", "150", timeout=240)
    rebuild_s = time.monotonic() - started
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert set(document_statuses(pipeline.queue).values()) == {ALL_COMPLETED}, document_statuses(pipeline.queue)
    stores = Stores.open()
    try:
        after = store_figures(pipeline.queue, stores)
        stored = stores.vector.chunk_ids()
        held_after = shard_points(stores.vector)
    finally:
        close_everything(stores)
    assert after["points"] == after["chunks"] == before["chunks"] == len(stored), after  # one point per chunk
    assert stored == held["main"] | held["tail"]
    assert held[healthy] <= held_after[healthy], "the healthy shard lost points"
    assert after["graph"] == before["graph"], (before["graph"], after["graph"])  # the graph as it was
    assert set(after["duplicates"].values()) == {0}, after["duplicates"]
    assert after["verify"]["consistent"], after["verify"]
    final = docqueue("verify", "--json")
    assert final.returncode == 0 and json.loads(final.stdout)["consistent"], (final.stdout, final.stderr)
    say(
        figures_line(
            f"damaged vector store: {case} {side} shard",
            {
                "faults": 1,
                "tasks_lost": 0,
                "duplicates": sum(after["duplicates"].values()),
                "rebuilt_chunks": len(held[side]),
                "detect_s": round(detect_s, 1),
                "rebuild_s": round(rebuild_s, 1),
                "clean_run_s": round(clean_run_s, 1),
            },
        )
    )
