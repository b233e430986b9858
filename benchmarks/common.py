"""What every system's PPO run shares: the settings (read from Tempo's own config, so the
hyperparameters are identical across systems) and what a run measures."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PPOSettings:
    """PPO's hyperparameters, as in Tempo's config (``PPOConfig``, ``conf/network``)."""

    num_steps: int
    learning_rate: float
    anneal_lr: bool
    gamma: float
    gae_lambda: float
    update_epochs: int
    num_minibatches: int
    clip_coef: float
    clip_vloss: bool
    ent_coef: float
    vf_coef: float
    normalize_advantages: bool
    max_grad_norm: float | None
    adam_eps: float
    hidden: tuple[int, ...]
    activation: str

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> PPOSettings:
        """From a Tempo training config (the plain-dict Hydra config)."""
        algo, net = cfg["algorithm"], cfg.get("network", {})
        if algo["name"] != "ppo":
            raise ValueError(f"the benchmark runs PPO, not {algo['name']!r}")
        return cls(int(algo["num_steps"]), float(algo["learning_rate"]), bool(algo["anneal_lr"]),
                   float(algo["gamma"]), float(algo["gae_lambda"]), int(algo["update_epochs"]),
                   int(algo["num_minibatches"]), float(algo["clip_coef"]), bool(algo["clip_vloss"]),
                   float(algo["ent_coef"]), float(algo["vf_coef"]), bool(algo["normalize_advantages"]),
                   None if algo["max_grad_norm"] is None else float(algo["max_grad_norm"]),
                   float(algo["adam_eps"]), tuple(int(h) for h in net.get("hidden", (64, 64))),
                   str(net.get("activation", "tanh")))


@dataclass(frozen=True)
class EnvSettings:
    """The benchmark's env: ``synthetic`` (the contextual bandit of
    ``tempo_rl/envs/synthetic.py``) or ``cartpole`` (CartPole-v1)."""

    name: str
    num_envs: int
    obs_shape: tuple[int, ...]
    num_actions: int
    episode_length: int

    @property
    def obs_dim(self) -> int:
        return math.prod(self.obs_shape)


@dataclass(frozen=True)
class Cell:
    """One measured run: a system on an env and config, in its own process."""

    system: str
    """``tempo-numpy``, ``tempo-jax``, ``torch`` or ``jax``."""
    impl: str
    """How the env is stepped: ``synthetic``, ``gymnasium`` or ``gymnax``."""
    config: str
    env: EnvSettings
    ppo: PPOSettings
    warmup: int
    iterations: int
    seed: int = 0
    passes: tuple[str, ...] | None = None
    """Tempo's optimization passes (None: all of them)."""
    label: str = ""
    tempo_cfg: dict[str, Any] = field(default_factory=dict, compare=False)
    jax_cache_dir: str | None = None
    """The JAX baseline's persistent compilation cache (``--baseline-cache``; None: none,
    JAX's default)."""

    @property
    def total_iterations(self) -> int:
        return self.warmup + self.iterations

    @property
    def steps_per_iteration(self) -> int:
        return self.env.num_envs * self.ppo.num_steps

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        env = EnvSettings(**{**data["env"], "obs_shape": tuple(data["env"]["obs_shape"])})
        ppo = PPOSettings(**{**data["ppo"], "hidden": tuple(data["ppo"]["hidden"])})
        passes = None if data["passes"] is None else tuple(data["passes"])
        return cls(**{**data, "env": env, "ppo": ppo, "passes": passes})


@dataclass
class Measurement:
    """What a system's run reports: compile time (None where there is none), the time of
    each iteration (warm-up ones first) and the returns of finished episodes, in order."""

    compile_s: float | None
    iteration_s: list[float]
    episode_returns: list[float]
    note: str = ""
    setup_s: float | None = None
    """From the start of the system's training function to its first iteration: env,
    parameters, tracing and compiling."""
    episodes: list[int] = field(default_factory=list)
    """Episodes finished in each iteration (``episode_returns`` in order)."""
    init_compile_s: float | None = None
    """The JAX PPO's initialization program's compile (parameters, optimizer state, first
    env states; PureJaxRL compiles them inside its one program), not in ``compile_s``."""


def score(env: EnvSettings, steps_per_iteration: int, returns: list[float], last: bool = True) -> float:
    """How well the policy does, from the finished episodes: on the synthetic env the mean
    reward per step over about one iteration's episodes (random: 1/num_actions), on
    CartPole the mean return of 20 episodes; the last ones, or the first ones."""
    if env.name == "synthetic":
        count = max(1, steps_per_iteration // env.episode_length)
    else:
        count = 20
    chosen = returns[-count:] if last else returns[:count]
    if not chosen:
        return float("nan")
    mean = sum(chosen) / len(chosen)
    return mean / env.episode_length if env.name == "synthetic" else mean


# ---- tables ---------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or x != x:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def render(title: str, headers: list[str], rows: list[list[str]], notes: list[str], markdown: bool,
           text_columns: int = 1) -> str:
    """A plain-text or Markdown table, with notes under it; the first ``text_columns``
    columns are left-aligned, the others right-aligned."""
    if markdown:
        lines = [f"### {title}", "", "| " + " | ".join(headers) + " |",
                 "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines += [""] + [f"- {n}" for n in notes] if notes else []
        return "\n".join(lines) + "\n"
    # A short row (a failed cell) ends in its message, which runs on unaligned.
    widths = [max([len(h)] + [len(r[k]) for r in rows if k < len(r) - (len(r) < len(headers))])
              for k, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))

    def cells(r: list[str]) -> str:
        aligned = [c.rjust(w) if k >= text_columns else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))]
        if len(r) < len(headers):
            aligned[-1] = r[-1]
        return "  ".join(aligned)
    body = [cells(r) for r in rows]
    return "\n".join([title, line, "-" * len(line), *body, *(f"  note: {n}" for n in notes)]) + "\n"


# ---- one cell per subprocess ----------------------------------------------------------------
RESULT_TAG = "BENCH-RESULT "
"""Starts the line on which a worker process reports its result (JSON)."""
OOM_CODES = {-9, 137}
"""Exit statuses of a process the kernel's out-of-memory killer ended (SIGKILL)."""


def report_result(run: Callable[[], dict[str, Any]]) -> None:
    """The worker side: ``run()``'s result, or the error it raised (its traceback on
    stderr), with the process's peak RSS, printed as one tagged JSON line."""
    try:
        out = run()
    except MemoryError:
        traceback.print_exc()
        out = {"error": "out of memory (MemoryError)"}
    except Exception as err:  # reported in the table, with the traceback on stderr
        traceback.print_exc()
        message = str(err).splitlines()[0] if str(err) else ""
        out = {"error": f"{type(err).__name__}: {message}"[:200]}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(RESULT_TAG + json.dumps(out), flush=True)


def run_worker(script: Path, spec: str, timeout: float, cwd: Path,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """The parent side: run ``script --worker spec`` in a fresh Python process (with the
    environment ``env``, else this one's) and return what it reported, or
    ``{"error": ...}`` when it timed out or reported nothing."""
    cmd = [sys.executable, str(script), "--worker", spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not lines:
        if proc.returncode in OOM_CODES:
            return {"error": f"killed (exit {proc.returncode}; out of memory?)"}
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"[:200]}
    out = json.loads(lines[-1][len(RESULT_TAG):])
    if out.get("error") and proc.stderr.strip():
        sys.stderr.write(proc.stderr[-4000:])
    return out
