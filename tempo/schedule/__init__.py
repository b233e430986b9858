"""Polyhedral scheduling of SDGs (isl), memory statements, and the loop-program AST."""

from tempo.schedule.scheduler import Schedule, build_schedule

__all__ = ["Schedule", "build_schedule"]
