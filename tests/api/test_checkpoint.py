"""Checkpoints: a resumed run continues exactly, and a write killed midway never leaves an
unloadable file behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tempo as tp
from tempo.api import checkpoint, nn, optim

K = 6
X = np.random.default_rng(1).uniform(-2, 2, (32, 1)).astype(np.float32)


def _train(iterations, path, start=0, resume_from=None, backend="numpy"):
    """Fit sin(x) for ``iterations``, writing a checkpoint every K; return the losses."""
    ctx = tp.Context(dims=("i",), seed=0)
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        model = nn.MLP(1, [16], 1, domain=(i,))
        loss = ((model(tp.const(X)) - tp.const(np.sin(X))) ** 2).mean()
        loss.backward()
        lr = 0.02 * 0.97 ** (tp.symbol_value(i) + start).astype("float32")
        opt = optim.Adam(model.parameters(), lr, max_grad_norm=1.0)
        opt.step()
        if resume_from is not None:
            opt.load_state(checkpoint.load(resume_from))
        checkpoint.save(opt.checkpoint_state(), path, when=(i + 1) % K == 0)
    return ctx.compile(bounds={I: iterations}, outputs=[loss], backend=backend).run()[loss]


def test_resumed_run_continues_exactly(tmp_path):
    straight = _train(2 * K, tmp_path / "straight.npz")
    first = _train(K, tmp_path / "first.npz")
    second = _train(K, tmp_path / "second.npz", start=K, resume_from=tmp_path / "first.npz")
    np.testing.assert_allclose(first, straight[:K], rtol=1e-6)
    np.testing.assert_allclose(second, straight[K:], rtol=1e-6)
    a, b = checkpoint.load(tmp_path / "straight.npz"), checkpoint.load(tmp_path / "second.npz")
    for name in a:
        if name != checkpoint.POINT_KEY:
            np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert a["count"] == 2 * K and a[checkpoint.POINT_KEY].tolist() == [2 * K - 1]


def test_checkpoint_written_only_where_the_condition_holds(tmp_path):
    _train(K - 1, tmp_path / "never.npz")
    assert not (tmp_path / "never.npz").exists()
    _train(K, tmp_path / "{i}.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{K - 1}.npz"]


def test_loading_a_mismatched_checkpoint_is_a_clear_error(tmp_path):
    np.savez(tmp_path / "bad.npz", param0=np.zeros((3, 3)))
    with pytest.raises(tp.TempoError, match="shape|no value"):
        _train(2, tmp_path / "x.npz", resume_from=tmp_path / "bad.npz")
    with pytest.raises(tp.TempoError, match="no checkpoint"):
        checkpoint.load(tmp_path / "missing.npz")


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    from tempo.api.checkpoint import write_atomically
    big = {"w": np.random.default_rng(0).normal(size=(4_000_000,))}
    print("ready", flush=True)
    while True:
        write_atomically(Path(sys.argv[1]), big)
""")


def test_write_killed_midway_leaves_a_loadable_checkpoint(tmp_path):
    target = tmp_path / "ckpt.npz"
    checkpoint.write_atomically(target, {"w": np.arange(3.0)})
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE,
                            cwd=str(tmp_path), env={"PYTHONPATH": str(_repo_root())})
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(0.4)  # in the middle of writing 32 MB, most likely
    proc.kill()
    proc.wait()
    loaded = checkpoint.load(target)
    assert loaded["w"].shape in ((3,), (4_000_000,))


def _repo_root():
    from pathlib import Path
    return Path(tp.__file__).resolve().parent.parent


def test_origin_continues_random_draws_and_symbol_values():
    """A program run from origin k observes what the longer run observed at k and after."""
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        noise = tp.uniform((2,), domain=(i, t))
        progress = tp.symbol_value(i).astype("float32") / tp.symbol_value(I).astype("float32")
        seen = []
        tp.sink(progress, lambda value, point: seen.append((point["i"], float(value))))
    whole = ctx.compile({I: 6, T: 3}, outputs=[noise, progress], backend="numpy").run()
    seen_whole, seen[:] = list(seen), []
    tail = ctx.compile({I: 4, T: 3}, outputs=[noise, progress], backend="numpy").run(origin={i: 2})
    np.testing.assert_array_equal(tail[noise], whole[noise][2:])
    np.testing.assert_array_equal(tail[progress], whole[progress][2:])
    assert seen == seen_whole[2:]
    with pytest.raises(tp.TempoError, match="not a dim"):
        ctx.compile({I: 4, T: 3}, outputs=[noise], backend="numpy").run(origin={I: 2})
