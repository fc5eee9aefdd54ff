"""The embedded folder's lock between processes: a waiter gets its turn from a holder that operates back to back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from resources.folder_lock import QdrantStorageBusy, local_folder

REPO = Path(__file__).resolve().parents[2]
# a process that uses the folder back to back: each operation holds it 50 ms, the next begins at once
BUSY = """
import sys, time
from resources.folder_lock import local_folder
gate = local_folder(sys.argv[1], lambda folder, deadline, timeout: open(folder / "handle", "a"))
print("busy", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    with gate.open(10):
        time.sleep(0.05)
"""


def test_a_waiter_gets_the_folder_from_a_holder_that_operates_back_to_back(tmp_path):
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY, str(tmp_path), "6"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert busy.stdout.readline().strip() == "busy"
        gate = local_folder(tmp_path, lambda folder, deadline, timeout: open(folder / "handle", "a"))
        started = time.monotonic()
        try:
            with gate.open(3):
                waited = time.monotonic() - started
        except QdrantStorageBusy:
            waited = None
        assert busy.poll() is None, "the busy process ended before the waiter was done"
        assert waited is not None and waited < 3, "the waiter never got the folder between the holder's operations"
    finally:
        busy.kill()
        busy.wait(10)
