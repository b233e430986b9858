"""Train an RL agent from the command line (Hydra; configs in conf/).

    python scripts/train.py                                  # PPO on CartPole-v1
    python scripts/train.py algorithm=reinforce seed=3
    python scripts/train.py -m seed=0,1 algorithm.learning_rate=1e-3,3e-4

Each run writes TensorBoard events, checkpoints and the resolved config to its Hydra
output directory (runs/...).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tempo.errors import TempoError  # noqa: E402 - after the path fix for running from a checkout
from tempo.runtime.backends import describe_backend  # noqa: E402
from tempo_rl import distributed  # noqa: E402
from tempo_rl.config import store_algorithm_defaults  # noqa: E402
from tempo_rl.metrics import TrainingDiverged  # noqa: E402
from tempo_rl.options import ConfigError  # noqa: E402
from tempo_rl.run_dir import RunDirError  # noqa: E402
from tempo_rl.train import check_config, configure_cpu_dispatch, train  # noqa: E402

store_algorithm_defaults()  # conf/algorithm/<name>.yaml start from the dataclasses' defaults


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    logging.getLogger("jax").setLevel(logging.WARNING)  # Hydra logs INFO: "no TPU", cache resets
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        check_config(plain)  # (first: a user's algorithm module, imported here, may register an env)
        dispatch = configure_cpu_dispatch(plain)  # before JAX starts: it reads the setting once
        split = distributed.distribution(plain)  # several hosts join here, before JAX runs
        backend = describe_backend(str(cfg.backend))
        print(backend + (f"; {dispatch}" if dispatch is not None and " on cpu device" in backend else ""))
        if split is not None:
            print(distributed.describe(split, int(plain["env"].get("num_envs", 8))))
        result = train(plain, out_dir, progress=bool(cfg.progress))
    except (ConfigError, TempoError, RunDirError, TrainingDiverged) as e:
        sys.exit(f"error: {e}")  # a message, not a traceback: exit status 1
    mean = result.mean_return()
    print(f"{cfg.algorithm.name} on {cfg.env.id}: mean return of the last 20 episodes {mean:.1f} "
          f"({len(result.episode_returns)} episodes; compile {result.compile_seconds:.1f} s, "
          f"run {result.run_seconds:.1f} s) -> {out_dir}")
    peaks = result.memory
    print(f"peak memory: {peaks['device_peak_mb']:.1f} MiB of stored points in the backend's memory "
          f"(the device on JAX), {peaks['host_peak_mb']:.1f} MiB in host buffers, "
          f"{peaks['rss_peak_mb']:.0f} MiB process RSS"
          + (f"; {peaks['split_peak_mb']:.1f} MiB of stored points split over devices"
             if cfg.distributed.mode != "none" else ""))
    return mean


if __name__ == "__main__":
    main()
