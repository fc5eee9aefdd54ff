"""`python -m orchestration.cli`: the worker processes of `docqueue run --workers N` start so."""

from orchestration.cli import command_line

command_line()
