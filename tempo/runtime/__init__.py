"""Executing scheduled programs: executables, launchers, tensor stores and backends."""

from tempo.runtime.executable import Executable, Results

__all__ = ["Executable", "Results"]
