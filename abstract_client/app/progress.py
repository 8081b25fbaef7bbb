"""The one progress bar of the applications (downloads, conversions, engine builds): ``rich``
on stderr when it is installed (the ``cli`` extra), else one plain line per task."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Bar", "progress"]


class Bar:
    """A task on the bar: ``advance(n)``, or ``update(completed=, description=)``."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def update(self, *, completed: float | None = None, description: str | None = None) -> None:
        if self._bar is None:
            return
        fields: dict[str, Any] = {}
        if completed is not None:
            fields["completed"] = completed
        if description is not None:
            fields["description"] = description
        self._bar.update(self._task, **fields)


@contextmanager
def progress(description: str, total: int | None, *, percent: bool = False) -> Iterator[Bar]:
    """A bar for ``total`` units (bytes above 1 MiB show as a download); ``percent``: a build
    whose progress is reported in percent, with a spinner and the elapsed time."""
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
    except ImportError:  # rich comes with the cli extra
        sys.stderr.write(f"{description}...\n")
        yield Bar()
        return
    columns: list[ProgressColumn | str]
    if percent:
        columns = [
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
        ]
    else:
        columns = [TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn()]
        if total and total > 1 << 20:
            columns.insert(2, DownloadColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        yield Bar(bar, bar.add_task(description, total=total))
