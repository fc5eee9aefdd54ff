"""What the commands print: one JSON document with --json, tables for a person otherwise."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click


def emit(as_json: bool, payload: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(payload, default=str, ensure_ascii=False))
    else:
        human()


def console():
    # rich is imported here, not at the top: --json output never needs its tenth of a second
    from rich.console import Console

    # COLUMNS is the terminal's width, not a docqueue setting
    return Console(highlight=False, soft_wrap=False, width=max(100, int(os.environ.get("COLUMNS", "120"))))


def table(title: str, columns: list[str], rows: list[list[Any]]):
    from rich.table import Table  # as in console(): only human output needs rich

    shown = Table(title=title, show_lines=False, title_justify="left")
    for column in columns:
        shown.add_column(column, overflow="fold")
    for row in rows:
        shown.add_row(*["" if v is None else str(v) for v in row])
    return shown
