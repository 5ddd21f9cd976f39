"""How a job fails: one line on stderr that says why, and a non-zero exit, never a traceback alone.

An exception raised inside a Spark task reaches the driver as Spark's wrapper (``PythonException``,
or ``Py4JJavaError`` from the JVM) whose text is the worker's whole Python traceback, often inside a
JVM stack trace. :func:`root_cause` digs out the last exception line of that traceback, the one that
says what went wrong (``IndexFileError: cannot infer ...``). Spark's own logging of the failed task
is switched off in ``log4j2.properties`` so that line is the job's only output about it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from pipeline.fs import LocationError
from services.store.formats.commitlog_walk import CommitLogError
from services.store.formats.geometry import GeometryError
from services.store.formats.index_file import IndexFileError
from services.store.formats.store_layout import StoreLayoutError

EXIT_FAILED = 1  # the job ran and failed (verify also uses it for an inconsistent store)
EXIT_BAD_INPUT = 2  # the store, its geometry or an argument is wrong: nothing was done

_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*): (.+)$")
#: Errors whose message alone says what to fix (the class name would add nothing).
_SELF_EXPLAINING = {"CommitLogError", "GeometryError", "IndexFileError", "StoreLayoutError", "ExportError",
                    "FileExistsError", "FileNotFoundError", "ConfigError", "LocationError"}
_BAD_INPUT = (CommitLogError, GeometryError, IndexFileError, StoreLayoutError, FileExistsError, FileNotFoundError,
              LocationError)


class JobError(Exception):
    """A job's own check failed (its output would be wrong): the message says what was found."""


def root_cause(exc: BaseException) -> str:
    """One line: the innermost Python exception in ``exc``'s text (a Spark task's traceback), else
    ``exc`` itself."""
    text = str(exc)
    marker = text.rfind("Traceback (most recent call last):")
    if marker >= 0:
        found = None
        for line in text[marker:].splitlines()[1:]:
            if line.startswith((" ", "\t")) or not line.strip():
                continue  # a frame or its source line
            found = _EXCEPTION_LINE.match(line)
            if found is not None:
                break  # the last traceback's exception: the JVM's lines after it only wrap it
        if found is not None:
            name, message = found.group(1), found.group(2).strip()
            return message if name in _SELF_EXPLAINING else f"{name}: {message}"
    name = type(exc).__name__
    message = (text.strip().splitlines() or [""])[0]
    if not message:
        return name
    return message if name in _SELF_EXPLAINING or isinstance(exc, JobError) else f"{name}: {message}"


def run_job(prog: str, job: Callable[[argparse.Namespace], int], args: argparse.Namespace,
            on_error: Callable[[str, int], None] | None = None) -> int:
    """Run ``job(args)``; any exception becomes ``prog: error: <root cause>`` on stderr and an exit code:
    2 for bad input (nothing was done), 1 for a failure while running. ``on_error(cause, code)`` is told
    too (``--json`` puts it in the result)."""
    try:
        return job(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        if on_error is not None:
            on_error("interrupted", 130)
        return 130
    except Exception as exc:  # noqa: BLE001 (every failure ends in one line, whatever raised it)
        cause = root_cause(exc)
        code = EXIT_BAD_INPUT if isinstance(exc, _BAD_INPUT) else EXIT_FAILED
        print(f"{prog}: error: {cause}", file=sys.stderr)
        if on_error is not None:
            on_error(cause, code)
        return code
