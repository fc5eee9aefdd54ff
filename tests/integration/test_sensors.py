"""The sensors' ticks against a real queue database and a real Dagster instance (`docqueue_env`), evaluated the
way the daemon does: partitions registered, ranged run requests batched and tagged, nothing requested twice while
a run is in flight, the phase gates respected, the inbox read safely, and a tick bounded on 1,000,000 chunks."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from orchestration.planning import (
    KIND_TAG,
    PHASE_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SPAN_TAG,
    in_flight_positions,
    parse_span,
)
from queue_db.keys import chunk_partition_key
from queue_db.partition_keys import rows_for_keys
from queue_db.phases import VECTOR_CHUNK, Level
from tests import pdf_factory as pf
from tests.queue_support import build_document, chunk_all, expand, ocr_all, register

RUN_KEY_TAG = "dagster/run_key"


@pytest.fixture
def env(docqueue_env):
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    yield loaded(), instance, open_queue(Settings.from_env())
    instance.dispose()


def loaded() -> dg.Definitions:
    """The code location as it loads with the environment of the moment (its settings are built once, at load)."""
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings

    return build_definitions(Settings.from_env())


def tick(defs, instance, sensor_name: str):
    """One evaluation of a sensor as the daemon does it (the context is built from the instance's ref: a context
    built with `instance=` cannot load dynamic partitions)."""
    from orchestration.code_location import build_resources
    from queue_db.config import Settings

    sensor = defs.get_sensor_def(sensor_name)
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=sensor_name,
        resources=build_resources(Settings.from_env()),
    ) as ctx:
        return sensor.evaluate_tick(ctx)


def output_metadata(result: dg.ExecuteInProcessResult, node: str) -> dict:
    """The metadata an op reported on its output (maintenance ops store no output, they report)."""
    [event] = [e for e in result.events_for_node(node) if e.is_successful_output]
    return {k: v.value for k, v in event.step_output_data.metadata.items()}


def queue_run(defs, instance, request: dg.RunRequest, job: str) -> dg.DagsterRun:
    """The run record the daemon creates for a request before the coordinator starts it: QUEUED, with its tags."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="orchestration.definitions"), location_name="docqueue"
    )
    tags = {**request.tags, **({RUN_KEY_TAG: request.run_key} if request.run_key else {})}
    return instance.create_run_for_job(
        job_def=defs.resolve_job_def(job),
        tags=tags,
        status=dg.DagsterRunStatus.QUEUED,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job),
    )


def keys_in_range(instance, partitions_name: str, start: str, end: str) -> list[str]:
    partitions = dg.DynamicPartitionsDefinition(name=partitions_name)
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return list(partitions.get_partition_keys_in_range(dg.PartitionKeyRange(start, end)))


def chunk_keys(queue, where: str = "TRUE", args: dict | None = None) -> list[str]:
    """Partition keys of chunk rows, in registration order (or block position order, when filtered by block)."""
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"""SELECT d.document_key, p.page_number, c.chunk_index FROM task_queue_chunk c
                JOIN task_queue_page p ON p.id = c.page_id JOIN documents d ON d.id = c.document_id
                WHERE {where} ORDER BY c.partition_block, c.partition_pos, d.created_at, d.id, p.page_number,
                                       c.chunk_index""",
            args or {},
        ).all()
    return [chunk_partition_key(*r) for r in rows]


def span(request: dg.RunRequest) -> tuple[int, int]:
    _, start, end = parse_span(request.tags)
    return start, end


def block(request: dg.RunRequest) -> int:
    return parse_span(request.tags)[0]


# ------------------------------------------------------------------------------------------------ skip reasons
def test_every_sensor_says_in_one_sentence_why_its_tick_requested_nothing(env, monkeypatch):
    """On an empty queue every sensor's tick is skipped with a reason: the daemon stores it on the tick, and the
    sensor page's tick list shows it (a tick without one shows only "0 requested")."""
    from queue_db.phases import PHASES

    _, instance, _ = env
    monkeypatch.delenv("DOCQUEUE_INBOX", raising=False)
    monkeypatch.delenv("DOCQUEUE_S3_BUCKET", raising=False)
    defs = loaded()
    expected = {
        "inbox_sensor": "DOCQUEUE_INBOX is not set",
        "s3_intake_sensor": "DOCQUEUE_S3_BUCKET is not set",
        **{f"{kind.name}_sensor": f"no ready {kind.name} tasks" for kind in PHASES.kinds},
        **{f"rollup_{spec.name}_sensor": f"no document finished its {spec.name} phase" for spec in PHASES},
        "recovery_sensor": "nothing to recover: no held task's heartbeat is older than STALE_TASK_TIMEOUT=120 s",
    }
    assert {sensor.name for sensor in defs.sensors} == set(expected)
    for name, reason in expected.items():
        result = tick(defs, instance, name)
        assert not result.run_requests, name
        assert result.skip_message and result.skip_message.startswith(reason), (name, result.skip_message)
        assert "\n" not in result.skip_message, name

    # an inbox folder that is missing, then an empty one: each tick says what it saw
    inbox = Path(os.environ["DOCQUEUE_HOME"]) / "inbox"
    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    assert tick(loaded(), instance, "inbox_sensor").skip_message == f"inbox {inbox} does not exist"
    inbox.mkdir()
    assert tick(loaded(), instance, "inbox_sensor").skip_message == (
        "inbox: 0 file(s), 0 unchanged, 0 new, 0 new version(s), 0 duplicate, 0 rejected; 0 partition(s) registered"
    )


# ------------------------------------------------------------------------------------------------ run requests
def test_ready_chunks_are_registered_and_requested_as_batched_ranges(env, monkeypatch):
    defs, instance, queue = env
    monkeypatch.setenv("DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK", "5")
    defs = loaded()  # the code location as it loads with this environment
    for name in ("alpha.pdf", "beta.pdf"):
        build_document(queue, pages=2, chunks_per_page=3, name=name)
    expected = chunk_keys(queue)
    assert len(expected) == 12

    result = tick(defs, instance, "vector_chunk_sensor")

    assert instance.get_dynamic_partitions("chunks") == expected
    requests = result.run_requests
    assert [span(r) for r in requests] == [(0, 4), (5, 9), (10, 11)]
    covered = []
    for request in requests:
        assert request.tags[KIND_TAG] == "vector_chunk" and request.tags[PHASE_TAG] == "vector"
        assert request.tags["dagster/sensor_name"] == "vector_chunk_sensor"
        keys = keys_in_range(instance, "chunks", request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG])
        start, end = span(request)
        assert keys == expected[start : end + 1]  # the Dagster range is exactly the planned positions
        covered += keys
    assert covered == expected
    assert {block(r) for r in requests} == {block(requests[0])}  # registered as one block
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk WHERE partition_block IS NULL").scalar() == 0


def test_nothing_is_requested_twice_while_a_run_is_in_flight(env):
    defs, instance, queue = env
    build_document(queue, pages=2, chunks_per_page=3, name="first.pdf")
    first = tick(defs, instance, "vector_chunk_sensor").run_requests
    assert len(first) == 1
    queued = queue_run(defs, instance, first[0], "vector_chunk_job")

    second = tick(defs, instance, "vector_chunk_sensor")
    assert not second.run_requests and second.skip_message

    # new work next to an in-flight run: only the new keys are requested
    build_document(queue, pages=1, chunks_per_page=2, name="second.pdf")
    third = tick(defs, instance, "vector_chunk_sensor").run_requests
    assert len(third) == 1
    new_keys = keys_in_range(instance, "chunks", third[0].tags[RANGE_START_TAG], third[0].tags[RANGE_END_TAG])
    assert new_keys == chunk_keys(queue)[6:]
    queue_run(defs, instance, third[0], "vector_chunk_job")
    assert not tick(defs, instance, "vector_chunk_sensor").run_requests

    # the queued run is canceled before it claimed anything: its range must be requested again, under a run key
    # the daemon has not seen (it never launches a run key twice)
    instance.report_run_canceled(queued)
    again = tick(defs, instance, "vector_chunk_sensor").run_requests
    assert [r.tags[SPAN_TAG] for r in again] == [first[0].tags[SPAN_TAG]]
    assert again[0].run_key is None or not instance.get_runs(
        filters=dg.RunsFilter(tags={RUN_KEY_TAG: again[0].run_key, "dagster/sensor_name": "vector_chunk_sensor"})
    )


def test_a_failed_attempt_is_requested_again_after_its_back_off(env):
    defs, instance, queue = env
    build_document(queue, pages=1, chunks_per_page=2)
    request = tick(defs, instance, "vector_chunk_sensor").run_requests[0]
    run = queue_run(defs, instance, request, "vector_chunk_job")
    worker = f"run:{run.run_id}:test"
    claimed = queue.claim(VECTOR_CHUNK, worker, 10)
    queue.fail(
        VECTOR_CHUNK,
        worker,
        [{"id": c["id"], "error": "ConnectionError: refused", "error_class": "connection"} for c in claimed],
    )
    instance.report_run_failed(run)
    assert not tick(defs, instance, "vector_chunk_sensor").run_requests  # backing off (DOCQUEUE_RETRY_BACKOFF_BASE)
    with queue.engine.begin() as conn:  # the back-off elapses
        conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_next_attempt_at = now() - interval '1 second'")
    retry = tick(defs, instance, "vector_chunk_sensor").run_requests
    assert [r.tags[SPAN_TAG] for r in retry] == [request.tags[SPAN_TAG]]

    # out of retries: a sensor never requests it again (a person can, with a backfill)
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_retry_count = max_retries")
    assert not tick(defs, instance, "vector_chunk_sensor").run_requests


def test_a_runner_with_nothing_of_its_own_helps_a_siblings_run_in_flight(env):
    """`run --workers 2`: the runner whose share holds nothing plans a run over the second half of the tasks a
    sibling's run in flight has not claimed yet, when a core is idle for it and that half is worth a run's fixed
    cost."""
    from orchestration.runner import plan_next
    from queue_db.config import DagsterConfig
    from queue_db.partition_keys import BlockShare, mark_rolled_up
    from queue_db.run_costs import record_run_cost

    defs, instance, queue = env
    doc = build_document(queue, pages=1, chunks_per_page=8)
    mark_rolled_up(queue.engine, "ocr", [str(doc["id"])])  # the document's own roll-up is not the point here
    request = tick(defs, instance, "vector_chunk_sensor").run_requests[0]
    start, end = span(request)
    assert end - start + 1 == 8  # one block, too small to split: it is one runner's share, whole
    queue_run(defs, instance, request, "vector_chunk_job")  # that runner's run, in flight
    helper = BlockShare(2, (block(request) + 1) % 2)
    # no core idle for it (the sibling's work keeps them busy): it leaves the sibling alone
    assert plan_next(queue, instance, helper, dagster=DagsterConfig(), may_help=lambda: False) == []
    [helping] = plan_next(queue, instance, helper, dagster=DagsterConfig(), may_help=lambda: True)
    assert (helping.name, helping.block, helping.start_pos, helping.end_pos) == (
        VECTOR_CHUNK.name,
        block(request),
        start + 4,
        end,
    )
    assert helping.size == 4 and helping.tags[SPAN_TAG] == f"{block(request)}:{start + 4}-{end}"
    # a measured kind whose four keys of work are less than a run's fixed cost is left to the sibling
    record_run_cost(queue.engine, VECTOR_CHUNK.name, keys=100, work_s=1.0, overhead_s=0.3)
    assert plan_next(queue, instance, helper, dagster=DagsterConfig(), may_help=lambda: True) == []


# ------------------------------------------------------------------------------------------------ gating
def _requested(defs, instance, sensor_name: str) -> int:
    return sum(span(r)[1] - span(r)[0] + 1 for r in tick(defs, instance, sensor_name).run_requests)


def test_each_phase_waits_for_the_one_before(env):
    defs, instance, queue = env
    doc = register(queue, "gated.pdf")
    from orchestration.partitions import register_partitions

    register_partitions(instance, queue.engine, Level.DOCUMENT)
    later = ("ocr_page_sensor", "vector_page_sensor", "vector_chunk_sensor", "graphrag_chunk_sensor")
    assert _requested(defs, instance, "ocr_document_sensor") == 1
    assert all(_requested(defs, instance, name) == 0 for name in later)

    expand(queue, doc, 2)
    assert _requested(defs, instance, "ocr_page_sensor") == 2
    assert _requested(defs, instance, "vector_page_sensor") == 0  # OCR not completed yet

    ocr_all(queue, doc)
    chunk_all(queue, doc, 3)
    assert _requested(defs, instance, "vector_chunk_sensor") == 6
    assert _requested(defs, instance, "graphrag_chunk_sensor") == 0  # vectors not completed yet

    # a page sent back to OCR (an operator re-runs it): its chunks are not embedded meanwhile
    page = queue.pages(doc["id"])[0]
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE task_queue_page SET ocr_status = 'pending' WHERE id = %(id)s", {"id": page["id"]})
    assert _requested(defs, instance, "vector_chunk_sensor") == 3

    worker = "test-embedder"
    claimed = queue.claim(VECTOR_CHUNK, worker, 10)
    queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in claimed])
    assert _requested(defs, instance, "graphrag_chunk_sensor") == 3


# ------------------------------------------------------------------------------------------------ inbox
def test_inbox_registers_new_files_once_and_never_follows_links_out(env, tmp_path, monkeypatch):
    defs, instance, queue = env
    inbox, outside = tmp_path / "inbox", tmp_path / "outside"
    (inbox / "sub").mkdir(parents=True)
    outside.mkdir()
    first = pf.text_pdf(inbox, "first.pdf", ["Ada Lovelace wrote the first program."])
    shutil.copyfile(first, inbox / "sub" / "same-bytes-again.pdf")
    secret = pf.text_pdf(outside, "secret.pdf", ["Not for the inbox."])
    (inbox / "link.pdf").symlink_to(secret)
    (inbox / "linked-dir").symlink_to(outside, target_is_directory=True)
    pf.zero_byte_pdf(inbox)
    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    defs = loaded()  # the code location as it loads with this environment

    message = tick(defs, instance, "inbox_sensor").skip_message
    assert "0 unchanged, 1 new, 0 new version(s), 1 duplicate, 1 rejected" in message
    with queue.engine.connect() as conn:
        documents = conn.exec_driver_sql("SELECT document_key, source_path FROM documents").all()
    assert len(documents) == 1 and documents[0][1] == os.fsdecode(first.resolve())
    assert instance.get_dynamic_partitions("documents") == [documents[0][0]]

    message = tick(defs, instance, "inbox_sensor").skip_message
    # nothing changed: not even the duplicate at a second path or the rejected file is read again
    assert "3 unchanged, 0 new, 0 new version(s), 0 duplicate, 0 rejected" in message, message
    assert "0 partition(s) registered" in message
    pf.text_pdf(inbox, "second.pdf", ["Charles Babbage designed the engine."])
    assert "1 new" in tick(defs, instance, "inbox_sensor").skip_message
    assert len(instance.get_dynamic_partitions("documents")) == 2
    with queue.engine.connect() as conn:
        paths = [r[0] for r in conn.exec_driver_sql("SELECT source_path FROM documents").all()]
    assert all(p.startswith(os.fsdecode(inbox.resolve())) for p in paths)


def test_inbox_sees_an_edit_that_keeps_the_size_and_follows_a_rename(env, tmp_path, monkeypatch):
    defs, instance, queue = env
    inbox = tmp_path / "inbox"
    (inbox / "moved").mkdir(parents=True)
    note = inbox / "note.txt"
    note.write_text("alpha bravo charlie\n")
    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    defs = loaded()  # the code location as it loads with this environment
    assert "1 new," in tick(defs, instance, "inbox_sensor").skip_message

    note.write_text("delta bravo charlie\n")  # same size, other bytes
    stat = note.stat()
    os.utime(note, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert "1 new version(s)" in tick(defs, instance, "inbox_sensor").skip_message

    renamed = inbox / "moved" / "renamed-note.txt"
    note.rename(renamed)
    message = tick(defs, instance, "inbox_sensor").skip_message
    assert "0 new, 0 new version(s), 1 duplicate" in message, message
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT source_path FROM documents ORDER BY created_at").all()
    assert len(rows) == 2, "a rename registers nothing new"
    assert rows[-1][0] == os.fsdecode(renamed.resolve())
    assert "1 unchanged, 0 new" in tick(defs, instance, "inbox_sensor").skip_message


def test_inbox_sensor_skips_without_an_inbox(env, monkeypatch, tmp_path):
    defs, instance, _ = env
    monkeypatch.delenv("DOCQUEUE_INBOX", raising=False)
    defs = loaded()  # the code location as it loads with this environment
    assert "not set" in tick(defs, instance, "inbox_sensor").skip_message
    monkeypatch.setenv("DOCQUEUE_INBOX", str(tmp_path / "missing"))
    defs = loaded()  # the code location as it loads with this environment
    assert "does not exist" in tick(defs, instance, "inbox_sensor").skip_message


def test_a_disabled_queue_is_left_alone_by_every_sensor_and_schedule(env, monkeypatch, tmp_path):
    """TASK_QUEUE_ENABLED=false: ready tasks and a new inbox file stay as they are, no run is requested and no
    partition registered; set back to true, the same ticks request runs and register the file."""
    defs, instance, queue = env
    build_document(queue, pages=1, chunks_per_page=3)  # ready chunks: the VECTOR_CHUNK sensor would request a run
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "note.txt").write_text("a new document in the inbox")
    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    monkeypatch.setenv("DOCQUEUE_S3_BUCKET", "never-contacted")
    defs = loaded()  # the code location as it loads with this environment
    partitions, documents = instance.get_dynamic_partitions("chunks"), _documents(queue)
    monkeypatch.setenv("TASK_QUEUE_ENABLED", "false")
    defs = loaded()
    for sensor in defs.sensors:
        result = tick(defs, instance, sensor.name)
        assert not result.run_requests, sensor.name
        assert result.skip_message == "TASK_QUEUE_ENABLED is false: the queue is left alone", sensor.name
    assert instance.get_dynamic_partitions("chunks") == partitions and _documents(queue) == documents
    for schedule in defs.schedules:
        with dg.build_schedule_context(instance=instance) as ctx:
            data = schedule.evaluate_tick(ctx)
        assert not data.run_requests and "TASK_QUEUE_ENABLED is false" in data.skip_message, schedule.name
    monkeypatch.setenv("TASK_QUEUE_ENABLED", "true")
    defs = loaded()  # the code location as it loads with this environment
    assert tick(defs, instance, "vector_chunk_sensor").run_requests
    assert "1 new" in tick(defs, instance, "inbox_sensor").skip_message
    assert _documents(queue) == documents + 1


def _documents(queue) -> int:
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM documents").scalar()


# ------------------------------------------------------------------------------------------------ scale
DOCS, PAGES, CHUNKS, BLOCK = 1000, 10, 100, 10_000


def _seed_registered_chunks(engine) -> int:
    """1,000,000 chunk rows (1,000 documents x 10 pages x 100 chunks) as the API leaves them after chunking, already
    registered: blocks of 10,000 positions in key order, written by the same INSERT (registering 1M keys into
    Dagster is not what this test measures). Set-based; the chunk table's indexes and unique constraints are
    rebuilt from their own definitions afterwards (a sorted build is much faster than 1M incremental inserts)."""
    tag = f"scale{uuid.uuid4().hex[:6]}"
    args = {"docs": DOCS, "pages": PAGES, "chunks": CHUNKS, "tag": tag, "block": BLOCK}
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
        if conn.exec_driver_sql("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").scalar():
            # the rows reference each other correctly by construction: skip 2,000,000 foreign-key lookups
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        constraints = conn.exec_driver_sql(
            """SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
               WHERE conrelid = 'task_queue_chunk'::regclass AND contype IN ('p', 'u')"""
        ).all()
        indexes = conn.exec_driver_sql(
            """SELECT indexname, indexdef FROM pg_indexes i WHERE tablename = 'task_queue_chunk'
               AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"""
        ).all()
        for name, _ in indexes:
            conn.exec_driver_sql(f'DROP INDEX "{name}"')
        for name, _ in constraints:
            conn.exec_driver_sql(f'ALTER TABLE task_queue_chunk DROP CONSTRAINT "{name}"')
        args["first"] = conn.exec_driver_sql("SELECT nextval('docqueue_partition_block_seq')").scalar()
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, document_key, content_hash, size_bytes, page_count, pages_created_at,
                                      ocr_status, ocr_completed_at, vector_index_status, created_at)
               SELECT %(tag)s || '-' || n || '.pdf', %(tag)s || '-' || lpad(n::text, 6, '0'),
                      encode(sha256(convert_to(%(tag)s || n, 'UTF8')), 'hex'), 1000, %(pages)s, now(), 'completed',
                      now(), 'pending', now() - make_interval(secs => %(docs)s - n)
               FROM generate_series(1, %(docs)s) n""",
            args,
        )
        conn.exec_driver_sql(
            """INSERT INTO task_queue_page (document_id, page_number, page_file_path, ocr_status, ocr_completed_at,
                                            chunked_at, chunk_count, vector_status, created_at)
               SELECT d.id, n, 'x/page_' || n || '_nohf.md', 'completed', now(), now(), %(chunks)s, 'pending',
                      d.created_at
               FROM documents d, generate_series(1, %(pages)s) n WHERE d.filename LIKE %(tag)s || '-%%'""",
            args,
        )
        # documents are created one second apart, so key order is document number, page, chunk: position arithmetic
        conn.exec_driver_sql(
            """INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash,
                                             vector_status, created_at, partition_block, partition_pos)
               SELECT p.id, p.document_id, md5(p.id::text || n), n, md5(n::text), 'pending',
                      p.created_at, %(first)s + (s.i / %(block)s), s.i %% %(block)s
               FROM documents d JOIN task_queue_page p ON p.document_id = d.id, generate_series(0, %(chunks)s - 1) n,
                    LATERAL (SELECT ((right(d.document_key, 6)::int - 1) * %(pages)s + p.page_number - 1) * %(chunks)s
                                    + n AS i) s
               WHERE d.filename LIKE %(tag)s || '-%%'""",
            args,
        )
        conn.exec_driver_sql(
            "SELECT setval('docqueue_partition_block_seq', %(last)s)",
            {"last": args["first"] + DOCS * PAGES * CHUNKS // BLOCK},
        )
        for name, definition in constraints:
            conn.exec_driver_sql(f'ALTER TABLE task_queue_chunk ADD CONSTRAINT "{name}" {definition}')
        for _, definition in indexes:
            conn.exec_driver_sql(definition)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
    return int(args["first"])


@pytest.mark.scale
def test_a_tick_stays_bounded_on_a_million_chunks(env):
    defs, instance, queue = env
    started = time.perf_counter()
    first_block = _seed_registered_chunks(queue.engine)
    seeded = time.perf_counter() - started
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk").scalar() == DOCS * PAGES * CHUNKS

    started = time.perf_counter()
    first = tick(defs, instance, "vector_chunk_sensor").run_requests
    first_tick = time.perf_counter() - started
    assert len(first) == int(os.environ.get("DOCQUEUE_SENSOR_MAX_RUNS", "10"))
    # the daemon creates their runs, now in flight. Without Dagster's range tags: the lookup reads only the docqueue
    # tags, and creating a ranged run writes one planned event per key (10,000 here), which is not the tick's cost
    for request in first:
        queue_run(
            defs,
            instance,
            dg.RunRequest(tags={k: v for k, v in request.tags.items() if k not in (RANGE_START_TAG, RANGE_END_TAG)}),
            "vector_chunk_job",
        )
    assert len(in_flight_positions(instance, "vector_chunk")[block(first[0])]) >= 1

    started = time.perf_counter()
    second = tick(defs, instance, "vector_chunk_sensor").run_requests
    second_tick = time.perf_counter() - started

    def spans(requests):
        return {(block(r), *span(r)) for r in requests}

    in_flight = spans(first)
    assert all(block >= first_block for block, _, _ in in_flight)
    assert second and all(
        not (b == b2 and s <= e2 and s2 <= e) for b, s, e in spans(second) for b2, s2, e2 in in_flight
    ), "a range in flight was requested again"
    sizes = [span(r)[1] - span(r)[0] + 1 for r in first]
    print(
        f"\n1M chunks: seeded in {seeded:.1f} s; tick {first_tick:.2f} s (empty instance), "
        f"{second_tick:.2f} s with {len(first)} runs in flight; run sizes {sizes}"
    )
    assert first_tick < 20 and second_tick < 20, "a sensor tick must stay well under the 60 s daemon timeout"
    # what one of those runs would process maps back to exactly its rows
    keys = _keys_at(queue, second[0])
    assert keys[0] == second[0].tags[RANGE_START_TAG] and keys[-1] == second[0].tags[RANGE_END_TAG]
    assert len(rows_for_keys(queue.engine, VECTOR_CHUNK, keys)) == len(keys)


def _keys_at(queue, request: dg.RunRequest) -> list[str]:
    start, end = span(request)
    return chunk_keys(
        queue,
        "c.partition_block = %(b)s AND c.partition_pos BETWEEN %(s)s AND %(e)s",
        {"b": block(request), "s": start, "e": end},
    )


def test_a_busy_phases_rollups_wait_for_more_documents_up_to_the_hold(env, monkeypatch):
    """While runs of a phase's own kinds are in flight, its roll-ups wait (DOCQUEUE_ROLLUP_HOLD_S), so that one
    roll-up run writes many documents; a quiet phase, a hold of 0 or a document that waited the hold out
    releases them, and the skipped tick says why nothing was requested."""
    from orchestration.partitions import register_partitions
    from queue_db.partition_keys import rollup_columns

    _, instance, queue = env
    monkeypatch.setenv("DOCQUEUE_ROLLUP_HOLD_S", "600")
    defs = loaded()
    build_document(queue, pages=2, name="finished.pdf")  # its OCR phase completed: due an OCR roll-up
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    assert len(tick(defs, instance, "rollup_ocr_sensor").run_requests) == 1  # nothing else of the phase runs

    register(queue, "arriving.pdf")
    [split] = tick(defs, instance, "ocr_document_sensor").run_requests
    queue_run(defs, instance, split, "ocr_document_job")  # an OCR run in flight: the phase is busy
    held = tick(defs, instance, "rollup_ocr_sensor")
    assert not held.run_requests
    assert "roll-up waits up to 600 s" in held.skip_message and "DOCQUEUE_ROLLUP_HOLD_S" in held.skip_message
    assert not tick(defs, instance, "rollup_vector_sensor").run_requests  # no vector phase finished: nothing due

    monkeypatch.setenv("DOCQUEUE_ROLLUP_HOLD_S", "0")
    assert len(tick(loaded(), instance, "rollup_ocr_sensor").run_requests) == 1

    _, completed_at, _ = rollup_columns("ocr")
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE documents SET {completed_at} = now() - interval '601 seconds'")
    [released] = tick(defs, instance, "rollup_ocr_sensor").run_requests  # waited the hold out, phase still busy
    assert released.tags[KIND_TAG] == "rollup_ocr"
