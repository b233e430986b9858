"""Environments as UDF ops: gymnasium on the host; gymnax and the synthetic env in the graph."""

from tempo_rl.envs.base import Env, EpisodeStats, Policy, Rollout, Snapshots
from tempo_rl.envs.gymnasium_env import GymnasiumEnv
from tempo_rl.envs.gymnax_env import GymnaxEnv
from tempo_rl.envs.synthetic import SyntheticEnv

__all__ = ["Env", "EpisodeStats", "GymnasiumEnv", "GymnaxEnv", "Policy", "Rollout", "Snapshots",
           "SyntheticEnv"]
