"""Environments as UDF ops."""

from tempo_rl.envs.base import Env, Policy, Rollout
from tempo_rl.envs.gymnasium_env import GymnasiumEnv

__all__ = ["Env", "GymnasiumEnv", "Policy", "Rollout"]
