"""User errors, told apart from bugs.

A `UsageError` says that what was asked for cannot be done as asked: an unknown precision, an
unreadable or malformed input file, a bad flag value, an incompatible combination of flags, a
checkpoint of another run. The `snip` command line prints it as one line, ``snip: error: <message>``,
and exits with status 2 (``snip --debug`` shows the traceback instead). Every other exception is a
bug and keeps its traceback.

Library functions raise plain `ValueError` / `OSError` for bad arguments; `user_input` turns those
into `UsageError` where the arguments come straight from the user, so that the same exception types
deeper inside a run (a bug) are not mistaken for the user's.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["UsageError", "user_input"]


class UsageError(ValueError):
    """The user's input cannot be used; the message says what was wrong and what is accepted."""


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        return f"{error.filename}: {error.strerror}"  # not "[Errno 2] No such file or directory: 'x'"
    return str(error)


@contextlib.contextmanager
def user_input(what: str | None = None) -> Iterator[None]:
    """Re-raise a `ValueError`, `TypeError` or `OSError` raised inside as a `UsageError` (its message
    prefixed with ``what: ``): use it around code that only checks or reads what the user gave."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, TypeError, OSError) as e:
        raise UsageError(f"{what}: {_describe(e)}" if what else _describe(e)) from e
