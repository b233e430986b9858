"""Executing scheduled programs: executables, launchers, tensor stores and backends."""

from tempo.runtime.executable import Executable, Results, compile_program

__all__ = ["Executable", "Results", "compile_program"]
