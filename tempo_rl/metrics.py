"""Metrics of a training run, as they happen: TensorBoard always, W&B when enabled
(offline unless told otherwise), and a progress bar. Names follow CleanRL's."""

from __future__ import annotations

import math
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tempo.runtime.stores import MemoryStats
from tempo_rl.envs import Env

MIB = 1 << 20


def is_measurement(name: str) -> bool:
    """Whether metric ``name`` measures the machine (speed, memory) rather than training:
    two runs that train alike still differ in it."""
    return name == "charts/SPS" or name.startswith("memory/")

FLUSH_SECONDS = 1.0
"""An iteration's events reach the disk at most this long after it (and all at the end):
a flush per iteration costs about 1 ms (a write and an fsync), a share of a small
iteration."""


def peak_rss_bytes() -> int:
    """The process's peak resident set size (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class TrainingDiverged(RuntimeError):
    """A metric or the training state is not finite (NaN or infinite)."""


class MetricLogger:
    """Called by the program's metric sink once per iteration, while it runs. Episodic
    return and length are the means over the episodes that ended in the iteration.

    ``iterations`` is the whole run's; a resumed run starts at ``start_iteration``, and
    ``continues`` (the run dir of the checkpoint it resumes, when known) gives its
    TensorBoard events up to there, so that the stream has each iteration once. A run split
    over ``devices`` also logs ``charts/SPS_per_device``."""

    def __init__(self, out_dir: Path, env: Env, iterations: int, steps_per_iteration: int,
                 wandb_cfg: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                 progress: bool = True, start_iteration: int = 0, continues: Path | None = None,
                 devices: int = 1):
        # TensorBoard's own event writer (tensorboardX imports PyTorch where it is installed:
        # 0.8 s and ~250 MiB of RSS for nothing)
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._summary, self._event = Summary, Event
        self.env, self.iterations = env, iterations
        self.steps_per_iteration = steps_per_iteration
        self.devices = devices
        events = out_dir / "tensorboard"
        if start_iteration and continues is not None:
            _copy_events(continues / "tensorboard", events)
        events.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(events), flush_secs=5)
        if start_iteration:  # TensorBoard drops earlier events from this step on
            purge = self.global_step(start_iteration)
            self.writer.add_event(Event(wall_time=time.time(), step=purge,
                                        session_log=SessionLog(status=SessionLog.START)))
        self._flushed = time.perf_counter()
        self.wandb = _start_wandb(out_dir, wandb_cfg, config) if wandb_cfg else None
        self._bar_args = {"total": iterations, "initial": start_iteration, "desc": "training",
                          "unit": "it", "disable": not progress}
        self.bar: tqdm | None = None
        self._seen_episodes = 0
        self._clock = time.perf_counter()
        self.history: list[dict[str, float]] = []
        self.memory: Callable[[], MemoryStats] | None = None
        """The running program's memory counters (``Executable.stats``), once compiled."""

    def start(self) -> None:
        """The run begins now (after compiling): SPS and the progress bar count from here."""
        self.bar = tqdm(**self._bar_args)
        self._clock = time.perf_counter()
        self._seen_episodes = len(self.env.episode_returns)  # a resumed run's come from its checkpoint

    def global_step(self, iteration: int) -> int:
        """Env steps taken by the end of ``iteration`` (counted from the run's start, also
        in a resumed run, whose sinks see the iterations of the run it continues)."""
        return (iteration + 1) * self.steps_per_iteration

    def on_iteration(self, names: list[str], values: list[Any], point: dict[str, int]) -> None:
        iteration = point["i"]
        step = self.global_step(iteration)
        now = time.perf_counter()
        row = {name: float(v) for name, v in zip(names, values)}
        row["charts/SPS"] = self.steps_per_iteration / max(now - self._clock, 1e-9)
        if self.devices > 1:
            row["charts/SPS_per_device"] = row["charts/SPS"] / self.devices
        self._clock = now
        finished = self.env.episode_returns[self._seen_episodes:]
        if finished:  # one point per iteration: thousands of episodes end in one at 512 envs
            row["charts/episodic_return"] = sum(finished) / len(finished)
            lengths = self.env.episode_lengths[self._seen_episodes:]
            row["charts/episodic_length"] = sum(lengths) / len(lengths)
        row["charts/episodes"] = len(finished)
        row.update(self._memory_row())
        recent = self.env.episode_returns[-20:]
        self._seen_episodes = len(self.env.episode_returns)
        self._scalars(row, step)
        if self.wandb is not None:
            self.wandb.log(row, step=step)
        if now - self._flushed >= FLUSH_SECONDS:
            self.writer.flush()
            self._flushed = now
        row["iteration"] = iteration
        self.history.append(row)
        diverged = next((name for name in names if not math.isfinite(row[name])), None)
        if diverged is not None:
            raise TrainingDiverged(f"iteration {iteration}: {diverged} is {row[diverged]} (the learning "
                                   "diverged; try a smaller algorithm.learning_rate); no checkpoint is "
                                   "written from this iteration on")
        shown = f"{sum(recent) / len(recent):.1f}" if recent else "-"
        if self.bar is not None:
            self.bar.set_postfix(ret=shown, SPS=f"{row['charts/SPS']:.0f}")
            self.bar.update(1)

    def _memory_row(self) -> dict[str, float]:
        """Peak bytes the program's stores held in the iteration (device and host memory,
        ``tempo.runtime.stores.MemoryStats``) and the process's peak RSS so far, in MiB."""
        row = {"memory/rss_peak_mb": peak_rss_bytes() / MIB}
        if self.memory is not None:
            device, host = self.memory().restart_byte_peaks()
            row["memory/device_peak_mb"], row["memory/host_peak_mb"] = device / MIB, host / MIB
        return row

    def _scalars(self, row: dict[str, float], step: int) -> None:
        """The iteration's scalars as one TensorBoard event (an event per scalar costs
        ~70 us each, queued to the writer's thread)."""
        summary = self._summary
        values = [summary.Value(tag=name, simple_value=value) for name, value in row.items()]
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary(value=values)))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _copy_events(source: Path, target: Path) -> None:
    """The event files of ``source`` (another run's TensorBoard dir) into ``target``."""
    if not source.is_dir() or source.resolve() == target.resolve():
        return
    target.mkdir(parents=True, exist_ok=True)
    for events in source.glob("events.out.tfevents.*"):
        shutil.copy2(events, target / events.name)


def _start_wandb(out_dir: Path, cfg: dict[str, Any], config: dict[str, Any] | None) -> Any:
    import wandb
    return wandb.init(project=cfg.get("project", "tempo"), mode=cfg.get("mode", "offline"),
                      dir=str(out_dir), config=config, name=cfg.get("name"), reinit=True)
