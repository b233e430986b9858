"""The Hydra CLI as a user runs it: a multirun writes one directory per job with
TensorBoard events holding CleanRL's metric names, a checkpoint, and (when enabled) an
offline W&B run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tempo.api import checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_multirun_writes_metrics_checkpoints_and_wandb(tmp_path):
    cmd = [sys.executable, "scripts/train.py", "-m", "seed=0,1", "total_timesteps=1024",
           "algorithm.num_steps=16", "env.num_envs=4", "progress=false", "checkpoint_every=4",
           "logger.wandb.enabled=true", "memory=low", f"hydra.sweep.dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"WANDB_SILENT": "true", "PATH": "/usr/bin:/bin",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    # gymnasium's envs step on the host: on a CPU, JAX set to dispatch synchronously before
    # it started (each job's first line; an accelerator's says nothing of the CPU)
    firsts = [line for line in done.stdout.splitlines() if line.startswith("backend: ")]
    assert len(firsts) == 2, done.stdout[:1000]
    for line in firsts:
        assert line.endswith("; CPU dispatch: synchronous") or " on cpu device" not in line, line
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and "seed" in p.name)
    assert [p.name.rsplit("seed", 1)[1] for p in jobs] == ["0", "1"]
    for job in jobs:
        events = EventAccumulator(str(job / "tensorboard"))
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"charts/episodic_return", "charts/episodic_length", "charts/SPS",
                "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"} <= tags
        assert len(events.Scalars("charts/SPS")) == 16  # one per iteration: 1024 / (16 x 4)
        saved = checkpoint.load(job / "checkpoints" / "last.npz")
        assert saved[checkpoint.POINT_KEY][0] == 15  # the last iteration
        assert list((job / "wandb").glob("offline-run-*")), list(job.iterdir())
        assert (job / ".hydra" / "config.yaml").exists()
