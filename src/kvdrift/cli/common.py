"""What every command shares: the consoles, one-line user errors, strict JSON, progress."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from kvdrift.run import UnitFailed
from kvdrift.text import printable

console = Console()
err_console = Console(stderr=True)


def _os_error_line(exc: OSError) -> str:
    """One line for a file-system error (read-only or full disk, no permission, ...)."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    reason = exc.strerror or str(exc) or type(exc).__name__
    code = f" (errno {exc.errno})" if exc.errno else ""
    return f"{where}: {reason}{code}" if where else f"{reason}{code}"


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a user's mistake (ValueError, missing file), a file-system error (read-only or
    full disk) or a unit whose workers kept dying into one clear line and exit code 2.

    The message is printed literally (user text such as ``[study]`` or a document id is never
    read as console markup) with control characters escaped (:func:`kvdrift.text.printable`).
    Set ``KVDRIFT_DEBUG=1`` to see the traceback instead.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, OSError, KeyError, UnitFailed) as exc:
            if os.environ.get("KVDRIFT_DEBUG"):
                raise
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                message = _os_error_line(exc)
            err_console.print(f"[bold red]error:[/] {escape(printable(message))}", highlight=False,
                              markup=True, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def strict_json(obj: Any) -> str:
    """JSON that strict parsers accept: NaN and infinities (undefined quantities) become null."""
    from kvdrift.json_values import to_json_safe

    return json.dumps(to_json_safe(obj), indent=2, allow_nan=False)


def say(text: str) -> None:
    """Print a line of plain text (user text inside it is never read as markup, and its
    control characters are escaped)."""
    console.print(printable(text), markup=False, highlight=False, soft_wrap=True)


def progress_bar():
    """The progress bar of long work: description, bar, done/total, elapsed, remaining."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                    transient=False)


def notice(message: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(printable(message))}", highlight=False,
                      soft_wrap=True)


def interrupted(store_dir: Path) -> typer.Exit:
    err_console.print(f"[yellow]interrupted:[/] finished units are saved in "
                      f"{escape(printable(store_dir))}; run the same command again to resume.")
    return typer.Exit(130)


def split_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(part.strip() for part in text.split(",") if part.strip())
