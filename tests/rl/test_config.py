"""One owner per default: each built-in algorithm's dataclass. The CLI's config of an
algorithm is made from it, so ``PPOConfig()`` and ``algorithm=ppo`` mean the same run."""

from __future__ import annotations

import dataclasses

import pytest

from tempo_rl.algorithms import ALGORITHMS
from tempo_rl.config import NETWORK_KEYS, load_config
from tempo_rl.train import algorithm_config


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_cli_config_of_an_algorithm_is_its_dataclass(name):
    cls, _ = ALGORITHMS[name]
    cfg = load_config(f"algorithm={name}")
    built = algorithm_config(cls, cfg["algorithm"], cfg["network"])
    assert built == cls()  # the yaml adds nothing of its own (the network group's are the same)
    fields = {f.name for f in dataclasses.fields(cls)} - set(NETWORK_KEYS)
    assert set(cfg["algorithm"]) == {"name", *fields}  # every option overridable on the CLI


def test_an_override_reaches_the_dataclass():
    cls, _ = ALGORITHMS["nstep"]
    cfg = load_config("algorithm=nstep", "algorithm.n=7", "algorithm.learning_rate=0.01")
    built = algorithm_config(cls, cfg["algorithm"], cfg["network"])
    assert (built.n, built.learning_rate) == (7, 0.01)


def test_an_unknown_option_is_an_error():
    cls, _ = ALGORITHMS["ppo"]
    cfg = load_config()
    with pytest.raises(ValueError, match="has no option"):
        algorithm_config(cls, {**cfg["algorithm"], "clip_coeff": 0.1}, cfg["network"])


@pytest.mark.parametrize("overrides,expected", [
    ((), False),                                    # gymnasium's CartPole: stepped on the host
    (("env=gymnax_cartpole",), True),               # in the graph
    (("env=synthetic",), True),
    (("cpu_async_dispatch=true",), True),           # asked for
    (("env=gymnax_cartpole", "cpu_async_dispatch=false"), False),
    (("backend=numpy",), None),                     # no JAX
])
def test_cpu_dispatch_is_synchronous_where_the_env_steps_on_the_host(overrides, expected, monkeypatch):
    from tempo_rl.train import ASYNC_DISPATCH_VARIABLE, cpu_async_dispatch
    monkeypatch.delenv(ASYNC_DISPATCH_VARIABLE, raising=False)
    assert cpu_async_dispatch(load_config(*overrides)) is expected


def test_jaxs_own_environment_variable_keeps_its_dispatch_unless_the_config_sets_one(monkeypatch):
    from tempo_rl.train import ASYNC_DISPATCH_VARIABLE, cpu_async_dispatch
    monkeypatch.setenv(ASYNC_DISPATCH_VARIABLE, "1")
    assert cpu_async_dispatch(load_config()) is None
    assert cpu_async_dispatch(load_config("cpu_async_dispatch=false")) is False


def test_a_checkpoint_from_before_the_dispatch_option_resumes_without_differences():
    from tempo_rl.checkpoints import config_differences
    new = load_config()
    old = {k: v for k, v in new.items() if k != "cpu_async_dispatch"}
    assert config_differences(old, new) == []


def test_a_cpu_dispatch_that_is_not_a_bool_is_a_config_error():
    from tempo_rl.options import ConfigError
    from tempo_rl.train import check_config
    with pytest.raises(ConfigError, match="cpu_async_dispatch must be true or false, got 1"):
        check_config({**load_config(), "cpu_async_dispatch": 1})


CONFIGURE = """
import json
import jax
from tempo_rl.config import load_config
from tempo_rl.train import configure_cpu_dispatch
said = configure_cpu_dispatch(load_config())
jax.devices()  # JAX starts: the setting is read now
later = configure_cpu_dispatch(load_config("cpu_async_dispatch=true"))
print(json.dumps([str(said), said.kept, jax.config.read("jax_cpu_enable_async_dispatch"), str(later),
                  later.kept]))
"""


def test_the_cpu_dispatch_is_set_before_jax_starts_and_kept_after():
    """In a fresh process the run's choice is JAX's setting; once JAX has started, another
    choice is not applied (JAX would ignore it) and the run says so."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tempo_rl.train import ASYNC_DISPATCH_VARIABLE
    env = {k: v for k, v in os.environ.items() if k != ASYNC_DISPATCH_VARIABLE}
    done = subprocess.run([sys.executable, "-c", CONFIGURE], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    said, said_kept, setting, later, later_kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert (said, said_kept, setting) == ("CPU dispatch: synchronous", False, False)
    assert later.startswith("CPU dispatch: synchronous (JAX had started") and later_kept, later


def test_a_run_that_cannot_take_its_dispatch_warns(tmp_path):
    """JAX has started in this process: a run asking for the other dispatch keeps the
    process's and says so."""
    import jax

    from tempo_rl.train import train
    jax.devices()
    other = "false" if jax.config.read("jax_cpu_enable_async_dispatch") else "true"
    cfg = load_config("env=synthetic", "env.num_envs=2", "algorithm.num_steps=4", "total_timesteps=8",
                      f"cpu_async_dispatch={other}", "progress=false")
    with pytest.warns(UserWarning, match="CPU dispatch: .* \\(JAX had started in this process"):
        train(cfg, tmp_path / "run", progress=False)
