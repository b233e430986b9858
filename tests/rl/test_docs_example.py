"""The 'adding an algorithm' example of docs/rl.md is the file examples/td0.py, verbatim,
and it trains from the CLI without any change to tempo_rl (registered from outside)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tempo.api import checkpoint

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "rl.md"


def test_the_docs_show_the_example_file_verbatim():
    text = DOC.read_text()
    assert "```python\n" + (ROOT / "examples" / "td0.py").read_text() + "```" in text
    assert "```yaml\n" + (ROOT / "examples" / "conf" / "algorithm" / "td0.yaml").read_text() + "```" in text


def test_an_algorithm_registered_outside_the_package_trains_and_evaluates(tmp_path):
    done = subprocess.run([sys.executable, "scripts/train.py", "hydra.searchpath=[file://examples/conf]",
                           "algorithm=td0", "env.num_envs=2", "total_timesteps=320", "progress=false",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first, summary = done.stdout.splitlines()[:2]
    assert first.startswith("backend: ") and summary.startswith("td0 on CartPole-v1"), done.stdout
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.npz")
    assert saved[checkpoint.POINT_KEY][0] == 4  # 320 steps / (32 x 2) = 5 iterations
    assert all(np.all(np.isfinite(v)) for k, v in saved.items() if k.startswith("param"))
    last = str(tmp_path / "checkpoints" / "last.npz")
    evaluated = subprocess.run([sys.executable, "scripts/evaluate.py", last, "--episodes", "2",
                                "--import", "examples.td0"], cwd=ROOT, capture_output=True, text=True,
                               timeout=600)
    assert evaluated.returncode == 0 and "mean return" in evaluated.stdout, evaluated.stderr[-2000:]
    refused = subprocess.run([sys.executable, "scripts/evaluate.py", last, "--episodes", "2"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "--import" in refused.stderr
