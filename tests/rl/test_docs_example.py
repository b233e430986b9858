"""The 'adding an algorithm' example of docs/rl.md compiles, runs and records episodes."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "rl.md"
IMPORTS = """
from dataclasses import dataclass
import tempo as tp
from tempo.api import optim
from tempo.api.distributions import Categorical
from tempo_rl.algorithms.common import TrainProgram, actor_critic, rl_context
from tempo_rl.options import POSITIVE, UNIT, option
"""


def test_td0_example_from_the_docs_runs():
    from tempo_rl.envs import GymnasiumEnv
    code = DOC.read_text().split("```python\n# tempo_rl/algorithms/td0.py\n")[1].split("```")[0]
    namespace: dict = {}
    exec(compile(IMPORTS + code, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    env = GymnasiumEnv("CartPole-v1", num_envs=2, seed=0)
    program = namespace["build"](env, namespace["TD0Config"]())
    res = program.ctx.compile(program.bounds(3, 20), list(program.metrics.values()), backend="numpy").run()
    assert all(len(res[m]) == 3 for m in program.metrics.values())
    assert env.episode_returns  # 120 random-ish steps finish some CartPole episodes
