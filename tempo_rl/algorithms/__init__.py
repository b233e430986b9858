"""RL algorithms, each an RT program builder over dims ``(b, i, t)`` (PPO: ``(b, i, u, t)``),
registered by name with ``register_algorithm`` (``tempo_rl.algorithms.registry``)."""

from tempo_rl.algorithms import nstep, ppo, reinforce  # noqa: F401 - registers them
from tempo_rl.algorithms.common import TrainProgram
from tempo_rl.algorithms.registry import ALGORITHMS, algorithm, import_algorithm_module, register_algorithm

__all__ = ["ALGORITHMS", "TrainProgram", "algorithm", "import_algorithm_module", "register_algorithm"]
