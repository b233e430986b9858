"""Exceptions raised for bad programs. Each names the user's tensor and source line."""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceSite:
    """Where in the user's code a tensor was defined."""

    filename: str
    lineno: int
    line: str = ""

    def __str__(self) -> str:
        text = f"{self.filename}:{self.lineno}"
        return f"{text}: {self.line.strip()}" if self.line else text


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_site() -> SourceSite:
    """The innermost stack frame outside the ``tempo`` package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep):
            return SourceSite(filename, frame.f_lineno, linecache.getline(filename, frame.f_lineno))
        frame = frame.f_back
    return SourceSite("<unknown>", 0)


class TempoError(Exception):
    """Base class of every error Tempo raises for a bad program."""

    def __init__(self, message: str, site: SourceSite | None = None):
        self.site = site
        super().__init__(f"{message}\n  defined at {site}" if site else message)


class ShapeError(TempoError):
    """Spatial shapes or dtypes that do not fit together."""


class DomainError(TempoError):
    """A temporal index or domain that is not allowed."""


class OutOfRangeError(TempoError):
    """A read of a point outside a temporal dimension's range."""


class UndefinedPointError(TempoError):
    """A point of a placeholder that no branch defines."""


class UnschedulableError(TempoError):
    """Dependences that no execution order can satisfy (a zero-distance cycle)."""


class BoundsError(TempoError):
    """A bound that is missing or invalid at compile time."""


class UnsupportedExpressionError(TempoError):
    """A symbolic expression outside what Tempo can analyse (e.g. not quasi-affine)."""


class UDFError(TempoError):
    """A user function returned something other than what it declared."""


class MemoryBudgetError(TempoError):
    """No schedule the compiler can choose fits the memory budget (``MemoryPolicy.budget_mb``)."""


class StopRun(Exception):  # noqa: N818 - control flow, not an error
    """Raised by the op ``tp.stop_when`` adds, where its condition holds: the run ends
    there (``Executable.run`` catches it)."""

    def __init__(self, point: dict[str, int]):
        super().__init__(f"stop at {point}")
        self.point = point


class CheckpointError(TempoError):
    """A checkpoint file that cannot be read: missing, damaged, not a checkpoint, or
    holding anything but numeric arrays (pickled objects are never loaded)."""


class GradientError(TempoError):
    """A gradient was asked for that cannot be computed (through a UDF, of an int)."""


class GraphError(TempoError):
    """The SDG breaks one of its invariants (a bug in Tempo or in a pass, not user input)."""


class Unlowerable(Exception):  # noqa: N818 - control flow inside the runtime, never raised to users
    """A loop entry's reads do not fit a scan (``tempo.runtime.plan``); the message says
    why, and the loop runs interpreted instead."""


class Uncapturable(Exception):  # noqa: N818 - control flow inside the runtime, never raised to users
    """An iteration of a training loop cannot run as one program (``tempo.runtime.capture``);
    the message says why, and its iterations run statement by statement instead."""
