"""A docqueue worker process for the fault tests: `orchestration.runner.run_until_idle`, the same loop as
`docqueue run`, in a process the test can SIGKILL / SIGSTOP.

    python -m tests.reliability.worker [--wait] [--warm] [--max-seconds S] [--crash-on TEXT]

--wait      import everything, print "ready", then wait for a line on stdin before working (start-up costs
            seconds on a loaded machine; a test warms the next worker while the current one works)
--warm      load the embedding model and the extractor before "ready" (so work starts at once on "go")
--crash-on  fault injection: SIGKILL this process whenever it is about to OCR a page of a document whose
            filename contains TEXT (a native crash that recurs on every attempt: poison input)

Prints one JSON line at the end: runs, failed runs, seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings


def _inject_crash(marker: str) -> None:
    from orchestration.work import Pipeline

    original = Pipeline.ocr_pages

    def ocr_pages(self, worker_id, tasks):
        for task in tasks:
            document = self.queue.document(task["document_id"])
            if marker in (document or {}).get("filename", ""):
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, worker_id, tasks)

    Pipeline.ocr_pages = ocr_pages


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--poll", type=float, default=0.3)
    parser.add_argument("--crash-on", default="")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    from orchestration.definitions import defs
    from orchestration.environment import dagster_instance
    from orchestration.runner import run_until_idle
    from resources.database import get_queue

    instance = dagster_instance()
    queue = get_queue()
    if args.warm:
        from resources.embeddings import EmbeddingResource
        from resources.extraction import ExtractionResource

        EmbeddingResource().get_embedder().embed(["warm up"])
        ExtractionResource().get_extractor().extract(["Ada Lovelace lived in London."])
    if args.crash_on:
        _inject_crash(args.crash_on)
    print("ready", flush=True)
    if args.wait and not sys.stdin.readline():
        return  # the test ended without needing this worker
    report = run_until_idle(defs, instance, queue, until_idle=True, poll_s=args.poll, max_seconds=args.max_seconds)
    print(json.dumps({"runs": report.runs, "failed_runs": report.failed_runs, "seconds": round(report.seconds, 2)}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
