"""CLI conventions: a version, help on every option, the exit codes in --help (checked on the click objects,
without running a command)."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from orchestration.cli import EXIT_FAILURE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED, EXIT_USAGE, main


def _commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")


def test_every_visible_option_and_command_says_what_it_does():
    missing = [f"docqueue {name} {param.opts[0]}" for name, command in _commands(main)
               for param in command.params
               if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()]
    assert not missing, f"options without help text: {missing}"
    assert all((command.help or "").strip() for _, command in _commands(main))


def test_help_lists_every_exit_code_and_version_answers():
    runner = CliRunner()
    text = runner.invoke(main, ["--help"]).output
    for code in (0, EXIT_FAILURE, EXIT_USAGE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED):
        assert f"  {code}  " in text, text
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("docqueue ")


def test_progress_bars_count_less_often_as_counting_grows():
    from orchestration.cli import PROGRESS_REFRESH_S, progress_refresh_s

    assert progress_refresh_s(0.002) == PROGRESS_REFRESH_S  # a small queue: the usual refresh
    assert progress_refresh_s(0.3) == pytest.approx(6.0)  # counting takes at most 5 % of the time
    assert progress_refresh_s(0.6) == pytest.approx(2 * progress_refresh_s(0.3))


def test_waiting_for_the_next_count_ends_when_the_workers_do():
    import time

    from orchestration.cli import _wait_for_children

    class Finished:
        def poll(self):
            return 0

    started = time.monotonic()
    _wait_for_children([Finished()], 30)
    assert time.monotonic() - started < 1
