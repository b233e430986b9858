"""Environments as UDF ops: gymnasium on the host; gymnax, Brax and the synthetic env in the
graph."""

from tempo_rl.envs.base import Env, EnvBase, EpisodeStats, Policy, Rollout, Snapshots
from tempo_rl.envs.brax_env import BraxEnv
from tempo_rl.envs.gymnasium_env import GymnasiumEnv
from tempo_rl.envs.gymnax_env import GymnaxEnv
from tempo_rl.envs.jax_env import JaxEnv
from tempo_rl.envs.normalize import NormalizedObservations
from tempo_rl.envs.registry import ENVS, is_host_env, make_env, register_env
from tempo_rl.envs.synthetic import SyntheticEnv

__all__ = ["ENVS", "BraxEnv", "Env", "EnvBase", "EpisodeStats", "GymnasiumEnv", "GymnaxEnv", "JaxEnv",
           "NormalizedObservations", "Policy", "Rollout", "Snapshots", "SyntheticEnv", "make_env",
           "is_host_env", "register_env"]
