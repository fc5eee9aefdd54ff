"""The embedded folder's lock between processes: a waiter gets its turn from a holder that operates back to back, and
a process that ends with its folder kept open lets go of the lock with its end, without closing the handle."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# a process that opens the folder (its handle notes its own closing), lingers, and ends as `docqueue` does
ENDING = """
import os, sys
from pathlib import Path
from resources import folder_lock
from orchestration.cli.startup import exit_at_once

class Handle:
    def close(self):
        (Path(sys.argv[1]) / "closed").touch()

gate = folder_lock.local_folder(sys.argv[1], lambda folder, deadline, timeout: Handle(), linger_s=60)
with gate.open(10):
    pass
if sys.argv[2] != "close":
    folder_lock.keep_open_until_exit()
gate.release()  # what a store's close() calls
if sys.argv[2] == "slow":  # its end held up (output into a full pipe) while another process wants the folder
    print("kept", flush=True)
    sys.stdin.readline()
exit_at_once(0)
"""


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "closed"])
def test_a_folder_kept_until_exit_is_never_closed_and_its_lock_goes_with_the_process(tmp_path, keep):
    ended = subprocess.run(
        [sys.executable, "-c", ENDING, str(tmp_path), "keep" if keep else "close"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ended.returncode == 0, ended.stderr
    # kept: neither the store's close() nor the exit handlers closed it; otherwise closed as before
    assert (tmp_path / "closed").exists() is not keep
    with open(tmp_path / ".docqueue.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: the process's end let go of it


def test_a_folder_kept_until_exit_goes_to_a_process_that_asks_for_it(tmp_path):
    ending = subprocess.Popen(
        [sys.executable, "-c", ENDING, str(tmp_path), "slow"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert ending.stdout.readline().strip() == "kept"
        gate = local_folder(tmp_path, lambda folder, deadline, timeout: open(folder / "handle", "a"))
        started = time.monotonic()
        with gate.open(5):
            waited = time.monotonic() - started
            assert (tmp_path / "closed").exists()  # let go of as any holder does: closed, then the lock released
        assert waited < 2, waited
        assert ending.poll() is None, "the kept process ended before the waiter was done"
    finally:
        ending.communicate("\n", timeout=30)
    assert ending.returncode == 0
