"""A run refuses what would silently go wrong: resuming another run's checkpoint, options
of the wrong type or range, a run dir in use or unwritable, and learning that diverged."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tempo.api import checkpoint
from tempo_rl.checkpoints import ResumeMismatchError
from tempo_rl.config import load_config as config
from tempo_rl.metrics import TrainingDiverged
from tempo_rl.options import ConfigError
from tempo_rl.run_dir import LOCK_NAME, RunDirError
from tempo_rl.train import train

ROOT = Path(__file__).resolve().parents[2]
RUN = ("algorithm.num_steps=8", "env.num_envs=2", "total_timesteps=32")


@pytest.fixture(scope="module")
def reinforce_checkpoint(tmp_path_factory) -> Path:
    run = train(config("algorithm=reinforce", *RUN), tmp_path_factory.mktemp("run"), progress=False)
    return run.checkpoint


@pytest.mark.parametrize("changes,named", [
    (("algorithm=ppo", "algorithm.num_minibatches=1"), "algorithm.name"),
    (("algorithm=reinforce", "algorithm.learning_rate=0.01"), "algorithm.learning_rate"),
    (("algorithm=reinforce", "seed=1"), "seed"),
    (("algorithm=reinforce", "network.activation=relu"), "network.activation"),
    (("algorithm=reinforce", "env.id=CartPole-v0"), "env.id")])
def test_resuming_a_different_run_lists_the_differences(reinforce_checkpoint, tmp_path, changes, named):
    with pytest.raises(ResumeMismatchError, match=named.replace(".", r"\.")) as caught:
        train(config(*RUN, *changes, f"resume_from={reinforce_checkpoint}"), tmp_path, progress=False)
    assert "resume_override=true" in str(caught.value)
    assert not (tmp_path / "checkpoints" / "last.npz").exists()


def test_a_resumed_run_may_run_longer_and_log_differently(reinforce_checkpoint, tmp_path):
    result = train(config("algorithm=reinforce", *RUN[:2], "total_timesteps=64", "checkpoint_every=1",
                          f"resume_from={reinforce_checkpoint}"), tmp_path, progress=False)
    assert [row["iteration"] for row in result.history] == [2, 3]


def test_resume_override_goes_on_with_a_warning(reinforce_checkpoint, tmp_path, capsys):
    cfg = config("algorithm=reinforce", *RUN[:2], "total_timesteps=64", "algorithm.learning_rate=0.01",
                 "resume_override=true", f"resume_from={reinforce_checkpoint}")
    result = train(cfg, tmp_path, progress=False)
    assert [row["iteration"] for row in result.history] == [2, 3]
    err = capsys.readouterr().err
    assert "warning" in err and "algorithm.learning_rate" in err


@pytest.mark.parametrize("override,named", [
    ("env.num_envs=0", "env.num_envs"), ("env.num_envs=2.5", "env.num_envs"),
    ("algorithm.num_steps=0", "algorithm.num_steps"),
    ("algorithm.num_minibatches=0", "algorithm.num_minibatches"),
    ("algorithm.update_epochs=0", "algorithm.update_epochs"),
    ("algorithm.learning_rate=nan", "algorithm.learning_rate"),
    ("algorithm.learning_rate=-1e-3", "algorithm.learning_rate"), ("algorithm.gamma=1.5", "algorithm.gamma"),
    ("algorithm.gae_lambda=-0.1", "algorithm.gae_lambda"),
    ("algorithm.clip_coef=-0.2", "algorithm.clip_coef"),
    ("algorithm.max_grad_norm=-1", "algorithm.max_grad_norm"),
    ("network.hidden=[64,0]", r"network.hidden\[1\]"),
    ("algorithm.anneal_lr=3", "algorithm.anneal_lr"), ("seed=-1", "seed")])
def test_a_bad_option_is_an_error_naming_it_before_anything_runs(tmp_path, override, named):
    with pytest.raises(ConfigError, match=named):
        train(config("algorithm.num_steps=8", "total_timesteps=64", override), tmp_path / "run",
              progress=False)
    assert not (tmp_path / "run").exists()


def test_nstep_window_below_one_is_an_error():
    with pytest.raises(ConfigError, match="algorithm.n must be >= 1"):
        train(config("algorithm=nstep", *RUN, "algorithm.n=0"), Path("/nonexistent"), progress=False)


def test_total_timesteps_that_is_not_whole_iterations_says_what_would_fit(tmp_path):
    with pytest.raises(ConfigError, match=r"total_timesteps=40 .* 16 steps .* use 32 or 48"):
        train(config("algorithm.num_steps=8", "env.num_envs=2", "total_timesteps=40"), tmp_path,
              progress=False)


def test_a_run_dir_held_by_a_live_run_is_refused_and_a_stale_lock_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pathlib import Path\n"
                               "from tempo_rl.run_dir import claimed\n"
                               "with claimed(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(60)", str(tmp_path)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {holder.pid}\\)"):
            train(config(*RUN), tmp_path, progress=False)
    finally:
        holder.kill()  # killed: it never removes its lock file
        holder.wait()
    assert (tmp_path / LOCK_NAME).exists()
    result = train(config(*RUN), tmp_path, progress=False)  # the holder is gone: its lock is free
    assert result.checkpoint is not None and not (tmp_path / LOCK_NAME).exists()


def test_an_unwritable_run_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RunDirError, match="cannot write to"):
        train(config(*RUN), blocker / "run", progress=False)


def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    """A learning rate of 1e38 overflows the parameters in the second iteration."""
    cfg = config("algorithm=nstep", "algorithm.num_steps=8", "env.num_envs=2", "total_timesteps=64",
                 "checkpoint_every=1", "algorithm.learning_rate=1e38")
    with pytest.raises(TrainingDiverged, match=r"iteration \d+: .* not finite|is nan"):
        train(cfg, tmp_path, progress=False)
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.npz")
    assert all(np.all(np.isfinite(v)) for v in saved.values() if v.dtype.kind == "f")
    assert saved[checkpoint.POINT_KEY][0] < 3


def test_the_cli_exits_non_zero_with_one_message_on_divergence_and_bad_options(tmp_path):
    for args, expected in [(["algorithm.learning_rate=1e38", "checkpoint_every=1"], "diverged"),
                           (["algorithm.gamma=2"], "algorithm.gamma must be")]:
        done = subprocess.run([sys.executable, "scripts/train.py", "algorithm=nstep", *RUN, "progress=false",
                               f"hydra.run.dir={tmp_path / expected.split()[0]}", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_the_grad_norm_is_logged_and_finite(tmp_path):
    result = train(config("algorithm=nstep", *RUN), tmp_path, progress=False)
    norms = [row["losses/grad_norm"] for row in result.history]
    assert norms and all(math.isfinite(n) and n > 0 for n in norms)
