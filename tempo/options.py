"""User-facing policies: how a program is compiled and run, separate from what it computes.

``MemoryPolicy``: which schedule to compile and where stored points wait
(``tempo.schedule.memory``, ``tempo.compiler``); ``LoopPolicy``: how loops of device ops
run on JAX (``tempo.runtime.lowering``). Both are frozen dataclasses that check their
fields when made, so a bad value fails where the user wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("vectorized", "incremental")
"""The schedules a memory policy chooses from, fastest first."""
SMALLEST = "smallest"
"""``MemoryPolicy.schedule``: whichever of ``SCHEDULES`` is predicted to need the least."""
SMALLEST_SLACK = 1.05
"""``smallest`` keeps a faster schedule predicted within this factor of the smallest peak."""


@dataclass(frozen=True)
class MemoryPolicy:
    """Where stored points wait between production and use (``conf/memory/*.yaml``)."""

    swap: bool = False
    """Keep points that outlive the loop producing them in host memory (JAX backend)."""
    swap_min_bytes: int = 1 << 20
    """Only tensors at least this large (bytes per point) are swapped."""
    donate: bool = True
    """Let a kernel reuse the buffer of an input it reads last (JAX backend)."""
    donate_min_bytes: int = 1 << 18
    """Only inputs at least this large are donated. Below it XLA's allocator is as fast as
    reuse and the check costs more than it saves (``benchmarks/donation.py``, 2-core CPU:
    a recurrent state of 16K floats steps 8% slower donated, 64K floats (256 KiB) 6%
    faster, 256K floats 2.6x faster)."""
    schedule: str = "vectorized"
    """Which schedule to compile: ``vectorized`` (the innermost dim laid out where it can
    be: fast, and a rollout's per-step values wait for the learner), ``incremental``
    (no vectorization of the innermost dim: work that can trail acting does, with
    gradients accumulated step by step; memory bounded where the program allows it) or
    ``smallest`` (both compiled, the one with the smaller predicted peak of stored points
    kept; the faster one unless the other is more than 5% smaller)."""
    budget_mb: float | None = None
    """When given, the fastest schedule (vectorized, else incremental) whose predicted
    peak of stored points (device and host, ``Executable.predicted_footprint``) fits;
    ``schedule`` is then ignored."""

    def __post_init__(self) -> None:
        for name in ("swap_min_bytes", "donate_min_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.schedule not in (*SCHEDULES, SMALLEST):
            raise ValueError(f"schedule must be one of {', '.join((*SCHEDULES, SMALLEST))}, "
                             f"got {self.schedule!r}")
        if self.budget_mb is not None and not self.budget_mb > 0:
            raise ValueError(f"budget_mb must be a positive number of MiB, got {self.budget_mb}")


MODES = ("timed", "lowered", "interpreted")
@dataclass(frozen=True)
class LoopPolicy:
    """How loops and loop nests of device ops run on the JAX backend."""

    mode: str = "lowered"
    """``lowered``: one ``lax.scan`` wherever the loop allows it (the same in every run);
    ``timed``: time both forms on the loop's first six entries (three each, the first of
    each compiles) and keep the lowered form if it was clearly faster; ``interpreted``:
    never."""
    min_trips: int = 4
    """Entries with fewer iterations than this are interpreted (a scan would not pay)."""
    nests: bool = True
    """Lower a whole loop nest (flattened into one scan, ``tempo.runtime.nest``) where its
    loops allow it; its interpreted form still runs its inner loop in that loop's own
    form. False: innermost loops only."""
    margin: float = 0.1
    """``timed`` keeps the lowered form only when it is at least this much faster (a
    share of the interpreted time): close calls, which timing noise could decide either
    way from one run to the next, stay interpreted. (Timings of the same entry vary by
    about 5% between runs on a 2-core CPU; PPO's update loop at the paper's size measures
    25% faster lowered, which a margin of 20% left to chance.)"""

    max_stacked_mb: float | None = None
    """A loop whose outputs, stacked over its iterations, would hold more than this (MiB)
    stays interpreted, writing each iteration's values to their stores as it goes: a
    scan holds its stacked outputs whole, and XLA copies them besides (n-step's acting
    loop over 3x64x64 observations at T=1000 on a CPU, lowered: 1.62 GB peak RSS against
    0.87 GB interpreted, for 10% less time per iteration). None: 64 MiB on a CPU, on an
    accelerator a sixteenth of the memory JAX's allocator may use there
    (``lowering.stacked_cap_mb``)."""

    late_sinks: bool | None = None
    """On the JAX backend, run the host ops that only feed sinks (a training loop's
    metrics and checkpoint sinks, an env's record of its episodes) one occurrence late,
    after the next iteration's device work was dispatched, instead of waiting for the
    device where the program reaches them (``tempo.runtime.tail``). Host ops still run in
    the program's order among themselves. False: each where the program reaches it. None
    (default): late on an accelerator, where the device works beside the host (PPO on an
    H200: 11-26% less time an iteration), not on a CPU, where the device's work runs on the
    host's own cores: there PPO on gymnax runs the same within the noise either way, PPO on
    gymnasium's CartPole at 8 envs x 64 steps (the default training run) about 10% faster
    late, but a run's first results come an iteration later (at the paper's size a first
    iteration's metrics 0.5 s later), and an interrupt drops the last iteration's queued
    sinks. Wherever iterations are captured (``capture``) they are late on a CPU too: a
    captured iteration queues its late sinks with the values its program computed."""

    capture: bool | None = None
    """On the JAX backend (one device, ``mode`` lowered), run each steady iteration of the
    program's training loop (its outermost loop holding a lowered loop) as one XLA
    program: its scans, kernels and stores' updates traced once per kind of iteration,
    compiled in the background, its first run checked against the interpreted iteration
    (``tempo.runtime.capture``). The host ops that only feed sinks then run late
    (``late_sinks``, unless set). Where the loop does not allow it (a host env's step in
    it), it runs as before, and ``Executable.iteration_report`` says why. None (default):
    where a kind's program matched the interpreted iteration bit for bit (so a run's
    results do not depend on which iterations ran as programs; PPO does, n-step and
    REINFORCE, whose varying-length sums XLA adds up otherwise than NumPy, do not), and on
    a CPU only where the loop has at least ``capture.CPU_FRESH_ITERATIONS`` iterations, or
    ``capture.CPU_CHECKED_ITERATIONS`` where its program was checked on this machine
    before (the compile shares the run's cores; a program that differed from the
    interpreted iteration there is not tried again). True: wherever it can, up to
    rounding. False: never."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown loop mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.max_stacked_mb is not None and not self.max_stacked_mb >= 0:
            raise ValueError(f"max_stacked_mb must be >= 0 MiB or None, got {self.max_stacked_mb}")
        if self.late_sinks is not None and not isinstance(self.late_sinks, bool):
            raise ValueError(f"late_sinks must be true, false or None, got {self.late_sinks!r}")
        if self.capture is not None and not isinstance(self.capture, bool):
            raise ValueError(f"capture must be true, false or None, got {self.capture!r}")


@dataclass(frozen=True)
class Distribution:
    """How a program's parallel dim is split over devices (JAX backend): its points are
    laid out on one axis of a ``jax.sharding.Mesh`` (the env dim ``b``: acting, env state
    and rollouts split, parameters replicated), and XLA inserts the cross-device sums the
    shardings imply (a gradient summed over ``b``)."""

    devices: int | None = None
    """How many devices, the first of ``jax.devices()`` (every process's, after
    ``jax.distributed.initialize``); None: all of them."""
    dim: str | None = None
    """The parallel dim split over them; None: the context's first parallel dim."""

    def __post_init__(self) -> None:
        if self.devices is not None and (isinstance(self.devices, bool) or not isinstance(self.devices, int)
                                         or self.devices < 1):
            raise ValueError(f"devices must be a positive number of devices or None, got {self.devices!r}")
