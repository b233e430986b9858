"""Where a run's time goes: every statement timed, per op, with the device's work included.

``exe.run(profile=RunProfile())`` wraps each statement of the loop program with a clock;
after an op runs, its outputs at that point are waited for (JAX dispatches asynchronously,
so without waiting a kernel's time would show up in whichever later statement first
touches its result). The waiting serializes host and device work, so a profiled run is
slower than a plain one; the split between ops is what it is for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tempo.schedule.scheduler import Statement

if TYPE_CHECKING:
    from tempo.runtime.backends import Backend


@dataclass
class OpTime:
    seconds: float = 0.0
    calls: int = 0


@dataclass
class RunProfile:
    """Seconds and calls per statement kind and op (``("exec" | "free", op name)``)."""

    ops: dict[tuple[str, str], OpTime] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(t.seconds for t in self.ops.values())

    def instrument(self, table: dict[str, Callable], statements: dict[str, Statement],
                   stores: dict, backend: Backend) -> dict[str, Callable]:
        """``table``'s launchers, each timed into this profile."""
        return {name: self._timed(launch, statements[name], stores, backend)
                for name, launch in table.items()}

    def _timed(self, launch: Callable, stmt: Statement, stores: dict, backend: Backend) -> Callable:
        entry = self.ops.setdefault((stmt.kind, stmt.op.name), OpTime())
        outputs = [stores[(stmt.op.id, k)] for k in range(len(stmt.op.outputs))] \
            if stmt.kind == "exec" else []
        clock, synchronize = time.perf_counter, backend.synchronize

        def timed(point: tuple[int, ...]) -> None:
            start = clock()
            launch(point)
            for store in outputs:
                value = getattr(store, "data", {}).get(point)
                if value is not None:
                    synchronize(value)
            entry.seconds += clock() - start
            entry.calls += 1
        return timed

    def instrument_loop(self, name: str, launch: Callable) -> Callable:
        """A lowerable loop's launcher (``tempo.runtime.lowering``): the entries that ran
        as one scan or batched on the host are timed whole, as ``("loop", name)``, waiting
        for the scan's outputs (the point ops it computes are in that row too), and so are
        the scans of a loop lowered in spans (a call per scan); interpreted iterations are
        already timed statement by statement."""
        entry = self.ops.setdefault(("loop", name), OpTime())
        clock = time.perf_counter
        launch.wait_for_outputs = True

        def timed(point: tuple[int, ...]) -> None:
            start, scans, spans = clock(), launch.choice.scans, launch.span_seconds
            launch(point)
            if launch.last_form in ("lowered", "batched"):
                entry.seconds += clock() - start
                entry.calls += 1
            elif launch.last_form == "spans":  # its scans; the rest is timed by statement
                entry.seconds += launch.span_seconds - spans
                entry.calls += launch.choice.scans - scans
        return timed

    def table(self, top: int | None = None) -> str:
        """The ops by time spent, most first: total and mean milliseconds, share, calls."""
        total = self.total or 1.0
        rows = sorted(self.ops.items(), key=lambda kv: -kv[1].seconds)[:top]
        lines = [f"{'ms':>10} {'share':>6} {'calls':>8} {'ms/call':>9}  op"]
        for (kind, name), t in rows:
            if t.calls:
                prefix = {"free": "free ", "loop": "loop "}.get(kind, "")
                lines.append(f"{t.seconds * 1e3:10.1f} {t.seconds / total:6.1%} {t.calls:8d} "
                             f"{t.seconds * 1e3 / t.calls:9.3f}  {prefix}{name}")
        return "\n".join([*lines, f"{total * 1e3:10.1f} total"])

    __str__ = table


XLA_EVENTS = {"/jax/core/compile/backend_compile_duration": "compiling",
              "/jax/core/compile/jaxpr_trace_duration": "tracing",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
              "/jax/compilation_cache/cache_retrieval_time_sec": "loading"}
"""JAX's monitoring events for the stages of making a program, by what they time."""


@dataclass
class XlaCompiles:
    """What making XLA programs cost during an executable's runs (JAX's monitoring
    events): per stage (tracing, lowering to MLIR, XLA's compiling, loading from JAX's
    persistent cache) the programs and seconds, and the seconds spent on other threads
    than the run's (kernels compiled ahead, ``Executable``)."""

    programs: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Per stage. JAX times a program loaded from its cache as compiled too: ``compiling``
    includes ``loading``."""
    elsewhere: float = 0.0
    """Seconds of tracing, lowering and compiling spent on other threads (in the
    background); JAX's listeners are process-wide, so other executables' programs made
    meanwhile count too."""

    @contextmanager
    def recording(self) -> Iterator[XlaCompiles]:
        """Count the events while the block runs."""
        import threading

        from jax import monitoring
        here, lock = threading.current_thread(), threading.Lock()

        def listener(event: str, seconds: float, **_: object) -> None:
            stage = XLA_EVENTS.get(event)
            if stage is None:
                return
            with lock:  # (background compiles report from their own threads)
                self.programs[stage] = self.programs.get(stage, 0) + 1
                self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
                if stage != "loading" and threading.current_thread() is not here:
                    self.elsewhere += seconds
        monitoring.register_event_duration_secs_listener(listener)
        try:
            yield self
        finally:
            monitoring.unregister_event_duration_listener(listener)

    def __str__(self) -> str:
        if not self.programs:
            return "XLA: no program made in the runs"
        programs, seconds = dict(self.programs), dict(self.seconds)
        if "loading" in programs:  # loaded programs count as compiled too
            programs["compiling"] = programs.get("compiling", 0) - programs["loading"]
            seconds["compiling"] = seconds.get("compiling", 0.0) - seconds["loading"]
        stages = ", ".join(f"{stage} {programs[stage]} in {seconds[stage]:.2f} s"
                           for stage in XLA_EVENTS.values() if stage in programs)
        return (f"XLA programs made in the runs: {stages} ({self.elsewhere:.2f} s of it on background "
                f"threads, compiling ahead)")
