"""CLI conventions: a version, help on every option, the exit codes in --help (checked on the click objects,
without running a command), commands loaded only when named, and one error mapping."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from orchestration.cli import COMMANDS, EXIT_FAILURE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED, EXIT_USAGE, main
from orchestration.cli.errors import SERVICE_FAILURES, CliError, known_failure
from orchestration.cli.running import PROGRESS_REFRESH_S, progress_refresh_s, wait_for_children

REPO_ROOT = Path(__file__).resolve().parents[2]


def _commands(group: click.Group, prefix: str = ""):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"docqueue {prefix}{name} is listed but does not load"
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")


def test_every_visible_option_and_command_says_what_it_does():
    missing = [
        f"docqueue {name} {param.opts[0]}"
        for name, command in _commands(main)
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert not missing, f"options without help text: {missing}"
    assert all((command.help or "").strip() for _, command in _commands(main))


def test_the_lazy_table_names_each_command_with_its_own_help():
    ctx = click.Context(main)
    for name, (module, short) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name in (name, name.replace("-", "_")), name
        assert command.callback.__module__ == f"orchestration.cli.{module}", name
        first_paragraph = " ".join((command.help or "").split("\n\n")[0].split())
        assert short == first_paragraph, f"COMMANDS[{name!r}] says {short!r}, the command {first_paragraph!r}"


def test_help_lists_every_exit_code_and_version_answers():
    runner = CliRunner()
    text = runner.invoke(main, ["--help"]).output
    for code in (0, EXIT_FAILURE, EXIT_USAGE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED):
        assert f"  {code}  " in text, text
    for name in COMMANDS:
        assert f"  {name} " in text, text
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("docqueue ")


def test_help_and_version_load_no_command_and_no_settings():
    # a fresh interpreter: this one has loaded the commands already
    probe = (
        "import sys; from orchestration.cli import main\n"
        "for args in (['--help'], ['--version']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('orchestration.cli.', 'queue_db', 'sqlalchemy',\n"
        "               'pydantic', 'dagster', 'rich'))\n"
        "        and m not in ('orchestration.cli.errors', 'orchestration.cli.startup'))\n"
        "print(heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


def test_the_collector_pauses_for_a_command_lines_start_up_only():
    # started as a command line (arguments from sys.argv): the collector is paused while the process starts, and
    # runs again afterwards with the start-up's objects frozen; a caller's own invocation leaves it alone
    probe = (
        "import gc, sys; from orchestration.cli import main\n"
        "def ran(argv, args):\n"
        "    sys.argv = argv\n"
        "    seen = []\n"
        "    gc.callbacks.append(lambda phase, info: seen.append(phase))\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    gc.callbacks.clear()\n"
        "    return gc.isenabled(), gc.get_freeze_count() > 0, len(seen)\n"
        "from orchestration.cli import startup\n"
        "with startup.collector_paused():\n"  # what `search` pauses for its session: a command line's only
        "    aside = gc.isenabled()\n"
        "gc.collect(); gc.set_threshold(1)\n"
        "print([ran(['docqueue'], ['--help']), ran(['docqueue', '--help'], None), aside], file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    given, command_line, aside = ast.literal_eval(done.stderr.strip().splitlines()[-1])
    assert given[:2] == (True, False) and command_line[:2] == (True, True) and aside, done.stderr
    # collecting after every allocation, the given invocation collects thousands of times; the command line only
    # in the few lines after its start-up
    assert command_line[2] * 20 < given[2], done.stderr


def test_a_command_line_ends_without_teardown_yet_as_the_interpreter_would():
    # the executable's entry point ends the process with os._exit: its threads are still waited for, its exit
    # handlers still run, its output is all there, and its exit code is the command's
    probe = (
        "import atexit, sys, threading, time\n"
        "from orchestration.cli import command_line\n"
        "atexit.register(lambda: print('exit handler ran', file=sys.stderr))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread ended', file=sys.stderr))).start()\n"
        "sys.argv = ['docqueue'] + sys.argv[1:]\n"
        "command_line()\n"
        "print('never here', file=sys.stderr)\n"
    )
    for args, code in ((["--version"], 0), (["run", "--workers", "0"], 2)):
        done = subprocess.run(
            [sys.executable, "-c", probe, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == code, done.stderr
        assert "thread ended" in done.stderr and "exit handler ran" in done.stderr, done.stderr
        assert "never here" not in done.stderr
        assert done.stdout.startswith("docqueue ") == (code == 0)  # the version, flushed before the end
    assert done.stderr.index("thread ended") < done.stderr.index("exit handler ran")
    assert "Invalid value for '--workers'" in done.stderr


def test_a_command_lines_start_up_looks_for_no_pydantic_plugins():
    # the settings' model classes are built while the process starts, without reading every installed
    # distribution's metadata for plugins; once the command begins, pydantic looks as usual, and a value the user
    # gave is theirs throughout
    probe = (
        "import os, sys, pydantic, pydantic.plugin._loader as loader\n"
        "looked = []\n"
        "real = loader.entry_points\n"
        "loader.entry_points = lambda **kw: looked.append(kw.get('group')) or real(**kw)\n"
        "from orchestration.cli import main\n"
        "sys.argv = ['docqueue', 'stats', '--help']\n"  # loads the command's module: the settings' classes
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'queue_db.config' in sys.modules\n"
        "during, after_start = list(looked), os.environ.get('PYDANTIC_DISABLE_PLUGINS')\n"
        "class Later(pydantic.BaseModel):\n"
        "    x: int = 0\n"
        "print([during, after_start, looked], file=sys.stderr)\n"
    )
    for given in (None, "some_plugin"):
        env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
        if given:
            env["PYDANTIC_DISABLE_PLUGINS"] = given
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env
        )
        during, after_start, looked = ast.literal_eval(done.stderr.strip().splitlines()[-1])
        if given is None:
            assert during == [] and after_start is None and looked == ["pydantic"], done.stderr
        else:
            assert during == ["pydantic"] and after_start == given, done.stderr


def test_a_service_failure_is_one_sentence_and_every_mapped_class_exists():
    for kind, classes in SERVICE_FAILURES.items():
        for module, name in classes:
            assert isinstance(getattr(importlib.import_module(module), name), type), f"{kind}: {module}.{name}"
    from orchestration.dagster_database import DagsterStorageError

    mapped = known_failure(DagsterStorageError("Dagster's storage is out of reach"))
    assert isinstance(mapped, CliError) and mapped.message == "Dagster's storage is out of reach"
    assert known_failure(ValueError("anything else")) is None


def test_progress_bars_count_less_often_as_counting_grows():
    assert progress_refresh_s(0.002) == PROGRESS_REFRESH_S  # a small queue: the usual refresh
    assert progress_refresh_s(0.3) == pytest.approx(6.0)  # counting takes at most 5 % of the time
    assert progress_refresh_s(0.6) == pytest.approx(2 * progress_refresh_s(0.3))


def test_waiting_for_the_next_count_ends_when_the_workers_do():
    class Finished:
        def poll(self):
            return 0

    started = time.monotonic()
    wait_for_children([Finished()], 30)
    assert time.monotonic() - started < 1
