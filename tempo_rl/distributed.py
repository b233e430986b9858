"""A run over several devices (``conf/distributed/``): the options, the processes joined
with ``jax.distributed.initialize`` on several hosts, and the ``tp.Distribution`` the
program is compiled with (the env dim ``b`` split over every device)."""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass
from typing import Any

import tempo as tp
from tempo.errors import TempoError
from tempo.runtime.backends import make_mesh
from tempo_rl.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ConfigError, check_options, option

MODES = ("none", "data")


@dataclass(frozen=True)
class DistributedOptions:
    """The options of ``conf/distributed/*.yaml``."""

    mode: str = "none"
    devices: int | None = option(None, AT_LEAST_ONE)
    num_processes: int | None = option(None, AT_LEAST_ONE)
    process_id: int | None = option(None, NON_NEGATIVE)
    coordinator_address: str | None = None
    initialization_timeout: float = option(300.0, POSITIVE)


def options(cfg: dict[str, Any]) -> DistributedOptions:
    """The run's distributed options, checked (type, range, mode, the multi-host trio)."""
    values = dict(cfg.get("distributed") or {})
    check_options(DistributedOptions, values, "distributed.")
    known = {f.name for f in dataclasses.fields(DistributedOptions)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"distributed has no option(s) {unknown}; it has {sorted(known)}")
    opts = DistributedOptions(**values)
    if opts.mode not in MODES:
        raise ConfigError(f"distributed.mode={opts.mode!r}: choose one of {', '.join(MODES)}")
    hosts = (opts.num_processes, opts.process_id, opts.coordinator_address)
    if opts.mode == "data" and any(x is not None for x in hosts):
        if any(x is None for x in hosts):
            raise ConfigError("several hosts need distributed.num_processes, distributed.process_id and "
                              "distributed.coordinator_address together")
        if opts.process_id >= opts.num_processes:
            raise ConfigError(f"distributed.process_id={opts.process_id} is not below "
                              f"distributed.num_processes={opts.num_processes}")
    return opts


def distribution(cfg: dict[str, Any]) -> tp.Distribution | None:
    """The ``tp.Distribution`` the run's program is compiled with (None: one device),
    after joining the other processes when the run spans several hosts, and checking that
    the devices split ``env.num_envs`` evenly."""
    opts = options(cfg)
    if opts.mode == "none":
        return None
    if str(cfg.get("backend", "auto")) == "numpy":
        raise ConfigError("distributed=data runs on the jax backend; drop backend=numpy")
    if opts.num_processes is not None:
        join_processes(opts)
    count = device_count(opts)
    num_envs = int(cfg["env"].get("num_envs", 8))
    if num_envs % count:
        raise ConfigError(f"env.num_envs={num_envs} cannot be split evenly over {count} devices; "
                          f"use a multiple of {count}")
    return tp.Distribution(devices=opts.devices)


def device_count(opts: DistributedOptions) -> int:
    """The devices the run is split over: ``devices``, else every device JAX sees (the
    compiler's own mesh, ``tempo.runtime.backends.make_mesh``, checked here already)."""
    try:
        return make_mesh(opts.devices, "b").size
    except TempoError as err:
        raise ConfigError(f"distributed.devices={opts.devices}: {err}") from None


def join_processes(opts: DistributedOptions) -> None:
    """``jax.distributed.initialize`` for this process of a multi-host run, once the
    coordinator's address is known to work: a one-line error when process 0 cannot listen
    on it, or another process cannot reach it within the timeout. (JAX itself ends the
    process, without an exception, when registering with the coordinator times out;
    process 0 waits up to the timeout for the others, and JAX ends it if one never comes.)"""
    import jax
    if jax.distributed.is_initialized():  # joined already (scripts/train.py, then train())
        return
    host, port = _address(opts.coordinator_address)
    if opts.process_id == 0:
        _check_can_listen(port, opts)
    else:
        _wait_for_coordinator(host, port, opts)
    try:
        jax.distributed.initialize(coordinator_address=opts.coordinator_address,
                                   num_processes=opts.num_processes, process_id=opts.process_id,
                                   initialization_timeout=int(opts.initialization_timeout))
    except Exception as err:  # JAX raises XlaRuntimeError (DEADLINE_EXCEEDED, UNAVAILABLE, ...)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"process {opts.process_id} of {opts.num_processes} could not join the "
                          f"coordinator at {opts.coordinator_address} within "
                          f"{opts.initialization_timeout:g} s: {first}") from None


def devices_of(dist: tp.Distribution | None) -> int:
    """How many devices a run with ``dist`` is split over (1 without one)."""
    if dist is None:
        return 1
    import jax
    return dist.devices or jax.device_count()


def _address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"distributed.coordinator_address={address!r} is not host:port")
    return host.strip("[]"), int(port)


def _check_can_listen(port: int, opts: DistributedOptions) -> None:
    """Process 0 hosts the coordinator on ``port``: an error now if it cannot."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as err:
            raise ConfigError(f"process 0 cannot host the coordinator on port {port} "
                              f"(distributed.coordinator_address={opts.coordinator_address}): "
                              f"{err.strerror}") from None


def _wait_for_coordinator(host: str, port: int, opts: DistributedOptions) -> None:
    """Until the coordinator accepts a connection, or the timeout passes (an error)."""
    deadline = time.monotonic() + opts.initialization_timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, left))):
                return
        except OSError as err:
            if time.monotonic() + 0.5 >= deadline:
                reason = err.strerror or type(err).__name__
                raise ConfigError(f"process {opts.process_id} of {opts.num_processes} could not join the "
                                  f"coordinator at {opts.coordinator_address} within "
                                  f"{opts.initialization_timeout:g} s: {reason}") from None
            time.sleep(0.5)


def describe(dist: tp.Distribution, num_envs: int) -> str:
    """One line for the run's first output: the mesh the env dim is split over."""
    import jax
    devices = jax.devices()[:dist.devices or jax.device_count()]
    hosts = len({d.process_index for d in devices})
    return (f"mesh: b over {len(devices)} {devices[0].platform} device(s) on {hosts} host(s), "
            f"{num_envs // len(devices)} envs each (distributed=data)")
