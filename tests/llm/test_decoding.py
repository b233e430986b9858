"""tempo_llm against transformers, an implementation we did not write: random small Llama
and Mistral models saved with ``save_pretrained`` load into tempo_llm, whose full-sequence
logits, per-step generation logits and greedy tokens must match ``LlamaForCausalLM`` /
``MistralForCausalLM`` in float32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import tempo as tp
import tempo_llm
from tempo_llm import random_checkpoint
from tempo_llm.sampling import Sampling

TOLERANCE = 1e-4
SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _save(model, out: Path, **kwargs) -> Path:
    model.save_pretrained(str(out), **kwargs)
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random Llama 3-style model (llama3 RoPE scaling), in transformers and on disk."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SIZES, rope_parameters=LLAMA3_ROPE)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, _save(model, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    torch.manual_seed(1)
    cfg = transformers.MistralConfig(**SIZES, sliding_window=4)
    model = transformers.MistralForCausalLM(cfg).eval()
    return model, _save(model, tmp_path_factory.mktemp("mistral"))


def _forward(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def _ids(batch: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, SIZES["vocab_size"], (batch, length))


BACKENDS = [("numpy", None), ("jax", None), ("jax", 4), ("numpy", 4)]
"""(backend, tile): the compiler's choice (JAX: the growing reads padded to their longest,
one shape; NumPy: not padded), and tiles of 4 rows on both (several shapes, the last
tile masked)."""


@pytest.mark.parametrize("backend,tile", BACKENDS)
@pytest.mark.parametrize("which", ["llama", "mistral"])
def test_full_sequence_logits_match_transformers(request, which, backend, tile):
    model, path = request.getfixturevalue(which)
    ids = _ids(2, 11)  # longer than Mistral's window of 4
    ours = tempo_llm.load(path, backend=backend, tile=tile).logits(ids)
    np.testing.assert_allclose(ours, _forward(model, ids), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("backend,tile", BACKENDS)
def test_greedy_generation_matches_transformers_generate(llama, backend, tile):
    model, path = llama
    ids = _ids(2, 5, seed=3)
    out = tempo_llm.load(path, backend=backend, tile=tile).generate(ids, 12, return_logits=True)
    with torch.no_grad():
        theirs = model.generate(torch.tensor(ids), max_new_tokens=12, do_sample=False, pad_token_id=0,
                                eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    np.testing.assert_array_equal(out.tokens, theirs.sequences.numpy())
    np.testing.assert_allclose(out.logits, torch.stack(theirs.logits, 1).numpy(), atol=TOLERANCE, rtol=0)
    assert out.lengths.tolist() == [12, 12]


@pytest.mark.parametrize("backend,tile", BACKENDS)
def test_window_generation_longer_than_the_window_matches_transformers(mistral, backend, tile):
    """Prompt 3 tokens, 14 generated, window 4: every step's logits equal Mistral's forward
    pass over the generated sequence (its sliding-window mask), and the greedy tokens equal
    its ``generate``."""
    model, path = mistral
    ids = _ids(2, 3, seed=4)
    out = tempo_llm.load(path, backend=backend, tile=tile).generate(ids, 14, attention="window",
                                                                   return_logits=True)
    forward = _forward(model, out.tokens)[:, 2:-1]
    np.testing.assert_allclose(out.logits, forward, atol=TOLERANCE, rtol=0)
    with torch.no_grad():
        theirs = model.generate(torch.tensor(ids), max_new_tokens=14, do_sample=False, pad_token_id=0,
                                eos_token_id=None)
    np.testing.assert_array_equal(out.tokens, theirs.numpy())


@pytest.mark.parametrize("which,attention", [("llama", "causal"), ("mistral", "window")])
def test_long_generations_run_in_scans_and_match_transformers(request, which, attention):
    """40 tokens on JAX: past the prompt the decode loop runs as scans over the positions
    (``tempo.runtime.lowering``, in spans), the keys and values in device buffers the scans
    carry (a window's ring overwritten as it slides). Every step's logits equal the
    model's forward pass over the generated sequence, and the greedy tokens its
    ``generate``'s."""
    model, path = request.getfixturevalue(which)
    lm = tempo_llm.load(path, backend="jax")
    ids = _ids(2, 5, seed=6)
    out = lm.generate(ids, 40, attention=attention, return_logits=True)
    np.testing.assert_allclose(out.logits, _forward(model, out.tokens)[:, 4:-1], atol=TOLERANCE, rtol=0)
    with torch.no_grad():
        theirs = model.generate(torch.tensor(ids), max_new_tokens=40, do_sample=False, pad_token_id=0,
                                eos_token_id=None)
    np.testing.assert_array_equal(out.tokens, theirs.numpy())
    exe = lm._program(lm._request(ids, 40, attention=attention, return_logits=True))[0]
    (spans,) = [c for c in exe.loop_choices.values() if c.form == "spans"]
    assert spans.iterations_in_scans >= 32 and spans.scans >= 1


def test_window_attention_differs_from_causal_past_the_window(mistral):
    _, path = mistral
    lm = tempo_llm.load(path)
    ids = _ids(1, 8, seed=5)
    causal, window = lm.logits(ids, attention="causal"), lm.logits(ids, attention="window")
    np.testing.assert_allclose(causal[:, :4], window[:, :4], atol=1e-6)  # within the window: the same
    assert np.abs(causal[:, 4:] - window[:, 4:]).max() > 1e-3


def test_sharded_bf16_tied_checkpoint_loads(tmp_path):
    torch.manual_seed(2)
    cfg = transformers.LlamaConfig(**SIZES, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    path = _save(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").exists()
    ids = _ids(1, 6)
    ours = tempo_llm.load(path).logits(ids)
    np.testing.assert_allclose(ours, _forward(model.float(), ids), atol=TOLERANCE, rtol=0)


def test_eos_ends_each_sequence_on_its_own(llama):
    _, path = llama
    lm = tempo_llm.load(path)
    ids = _ids(2, 4, seed=6)
    free = lm.generate(ids, 10)
    eos = int(free.tokens[0, 4 + 3])  # the first sequence's 4th generated token
    stopped = lm.generate(ids, 10, eos_token_id=eos)
    first = int(np.argmax(free.tokens[0, 4:] == eos)) + 1
    assert stopped.lengths[0] == first
    assert (stopped.tokens[0, 4 + first:] == eos).all()
    np.testing.assert_array_equal(stopped.tokens[0, :4 + first], free.tokens[0, :4 + first])
    second = free.tokens[1, 4:] == eos
    assert stopped.lengths[1] == (int(np.argmax(second)) + 1 if second.any() else 10)


def test_sampling_is_reproducible_and_filters_as_asked(llama):
    _, path = llama
    lm = tempo_llm.load(path)
    ids = _ids(2, 4, seed=7)
    draw = lm.generate(ids, 16, temperature=1.0, seed=11)
    np.testing.assert_array_equal(draw.tokens, lm.generate(ids, 16, temperature=1.0, seed=11).tokens)
    assert (draw.tokens != lm.generate(ids, 16, temperature=1.0, seed=12).tokens).any()
    greedy = lm.generate(ids, 8).tokens
    np.testing.assert_array_equal(lm.generate(ids, 8, temperature=1.0, top_k=1, seed=3).tokens, greedy)
    np.testing.assert_array_equal(lm.generate(ids, 8, temperature=0.7, top_p=1e-6, seed=3).tokens, greedy)


def _reference_draws(logits: np.ndarray, sampling: Sampling, u: np.ndarray) -> np.ndarray:
    """Tokens drawn from ``logits`` (``(B, vocab)``) at ``u`` (``(B,)`` in (0, 1]), in
    float64 NumPy: filter as asked, rank most likely first, invert the cumulative sum."""
    scaled = logits.astype(np.float64) / sampling.temperature
    order = np.argsort(-scaled, axis=-1, kind="stable")
    ranked = np.take_along_axis(scaled, order, -1)
    if sampling.top_k is not None:
        ranked = np.where(ranked < ranked[:, sampling.top_k - 1:sampling.top_k], -np.inf, ranked)
    probs = np.exp(ranked - ranked.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if sampling.top_p is not None:
        probs = np.where(probs.cumsum(-1) - probs < sampling.top_p, probs, 0.0)
    cumulative = probs.cumsum(-1)
    drawn = (cumulative < u[:, None] * cumulative[:, -1:]).sum(-1)
    return np.take_along_axis(order, drawn[:, None], -1)[:, 0]


def test_sampled_decoding_runs_in_scans_and_compiles_once_for_every_seed(llama):
    """Sampling on JAX: the positions run as scans, each token is the one a float64 NumPy
    sampler draws from its logits at the seed's uniform numbers, a seed is a run-time
    input (seed 2 compiles nothing more than seed 1), and seeds draw differently."""
    from tempo_llm.sampling import uniforms
    _, path = llama
    lm = tempo_llm.load(path, backend="jax")
    ids = _ids(2, 4, seed=7)
    sampling = Sampling(temperature=0.9, top_k=20, top_p=0.9)
    options = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    first = lm.generate(ids, 40, seed=1, return_logits=True, **options)
    u = uniforms(1, 4 + 40 - 1, 2)[3:, :, 0]  # (the numbers of the positions that choose)
    expected = np.stack([_reference_draws(first.logits[:, n], sampling, u[n]) for n in range(40)], 1)
    np.testing.assert_array_equal(first.tokens[:, 4:], expected)
    exe = lm._program(lm._request(ids, 40, seed=2, return_logits=True, **options))[0]
    compiled = dict(exe.xla.programs)
    other = lm.generate(ids, 40, seed=2, return_logits=True, **options)
    assert dict(exe.xla.programs) == compiled
    assert (first.tokens != other.tokens).any()
    np.testing.assert_array_equal(tempo_llm.load(path).generate(ids, 40, seed=1, **options).tokens,
                                  first.tokens)
    (spans,) = [c for c in exe.loop_choices.values() if c.form == "spans"]
    assert spans.iterations_in_scans >= 32


def test_a_filtered_token_is_never_drawn():
    """At the ends of the uniform numbers' range (0, 1]: top-k 1 draws the most likely
    token, top-k 2 one of the two most likely, never a filtered one."""
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        rows = tp.const(np.repeat(logits[None], 2, 0).astype(np.float32))[t]
        u = tp.const(np.array([[[2.0 ** -24]], [[1.0]]], np.float32))[t]
        one, two = (Sampling(temperature=1.0, top_k=k).choose(rows, t, u) for k in (1, 2))
        out = ctx.compile({T: 2}, [one, two]).run()
    assert out[one][:, 0].tolist() == [3, 3] and out[two][:, 0].tolist() == [3, 2]


def _draws(sampling: Sampling, logits: np.ndarray, n: int, backend: str = "numpy") -> np.ndarray:
    """``sampling``'s choice from the same ``logits`` (``(B, vocab)``) at ``n`` positions."""
    ctx = tp.Context(dims=("t",), seed=sampling.seed)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        rows = tp.const(np.repeat(logits[None], n, 0).astype(np.float32))[t]
        chosen = sampling.choose(rows, t, 1 - tp.uniform((len(logits), 1)))  # (in (0, 1], as generate's)
        return ctx.compile({T: n}, [chosen], backend=backend).run()[chosen]


def test_sampling_draws_follow_the_softmax():
    """Frequencies of 20,000 draws against the softmax, and against it restricted to the
    two most likely tokens (top-k 2, and top-p 0.7: 0.5 + 0.25 first reaches it); the
    tokens are not in order of likelihood (the filters rank them)."""
    p = np.array([0.125, 0.5, 0.125, 0.25])
    logits = np.log(p)[None]
    draws = _draws(Sampling(temperature=1.0), logits, 20000)[:, 0]
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), p, atol=0.015)
    for filtered in (Sampling(temperature=1.0, top_p=0.7, seed=1),
                     Sampling(temperature=1.0, top_k=2, seed=2)):
        draws = _draws(filtered, logits, 4000)[:, 0]
        np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), [0, 2 / 3, 0, 1 / 3],
                                   atol=0.03)
    hot = _draws(Sampling(temperature=4.0, seed=3), logits, 20000)[:, 0]  # p ** (1/4), normalized
    np.testing.assert_allclose(np.bincount(hot, minlength=4) / len(hot), p ** 0.25 / (p ** 0.25).sum(),
                               atol=0.015)


def test_sampling_draws_the_same_tokens_on_both_backends():
    """Given the same uniform numbers (``tp.uniform``'s, the same bits on both backends),
    NumPy and JAX draw the same tokens (but where a draw lands within float32 rounding of
    a boundary of the cumulative sum)."""
    jax = pytest.importorskip("jax")
    del jax
    logits = np.random.default_rng(0).normal(size=(3, 50)) * 2
    sampling = Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=5)
    ours, theirs = _draws(sampling, logits, 2000), _draws(sampling, logits, 2000, backend="jax")
    assert (ours == theirs).mean() > 0.999


def test_the_random_checkpoint_tool_writes_what_transformers_loads(tmp_path):
    out = random_checkpoint.main([str(tmp_path / "m"), "--arch", "mistral", "--window", "3", "--tie",
                                  "--dtype", "bfloat16", "--vocab", "40", "--hidden", "32"])
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    lm = tempo_llm.load(out)
    ids = _ids(1, 7) % 40
    np.testing.assert_allclose(lm.logits(ids), _forward(model, ids), atol=TOLERANCE, rtol=0)
    assert lm.decode(lm.encode("w1 w2 w30")) == "w1 w2 w30"


@pytest.mark.parametrize("damage,message", [
    ("missing tensor", "lacks 1 tensor"), ("wrong shape", "has shape"),
    ("architecture", "unsupported architecture"), ("attention bias", "attention_bias"),
    ("no config", "no config.json"), ("no weights", "neither model.safetensors"),
    ("bias", "bias tensors"), ("rope", "needs factor")])
def test_a_bad_checkpoint_is_an_error_naming_what_is_wrong(tmp_path, damage, message):
    from safetensors.numpy import load_file, save_file
    path = random_checkpoint.write(tmp_path / "m", random_checkpoint.Spec(layers=1, hidden=16, vocab=20))
    weights, config = path / "model.safetensors", json.loads((path / "config.json").read_text())
    tensors = load_file(str(weights))
    if damage == "missing tensor":
        del tensors["model.norm.weight"]
    elif damage == "wrong shape":
        tensors["model.norm.weight"] = np.ones(17, np.float32)
    elif damage == "architecture":
        config["architectures"], config["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    elif damage == "attention bias":
        config["attention_bias"] = True
    elif damage == "no config":
        (path / "config.json").unlink()
    elif damage == "no weights":
        weights.unlink()
    elif damage == "bias":
        tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(16, np.float32)
    elif damage == "rope":
        config["rope_scaling"] = {"rope_type": "linear"}
    if weights.exists():
        save_file(tensors, str(weights))
    if (path / "config.json").exists():
        (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(tempo_llm.CheckpointFormatError, match=message):
        tempo_llm.load(path)


def test_bad_generation_arguments_are_errors(llama):
    _, path = llama
    lm = tempo_llm.load(path)
    with pytest.raises(ValueError, match="token ids must lie"):
        lm.logits(np.array([[1, 99]]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate(_ids(1, 2), 0)
    with pytest.raises(ValueError, match="window"):
        lm.generate(_ids(1, 2), 2, attention="window")  # a Llama config has no sliding_window
    with pytest.raises(ValueError, match="top_p"):
        lm.generate(_ids(1, 2), 2, temperature=1.0, top_p=1.5)


def test_the_decode_cli_prints_text_and_speed(tmp_path):
    import subprocess
    import sys
    model = random_checkpoint.write(tmp_path / "m", random_checkpoint.Spec(layers=1, hidden=16, vocab=30))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "scripts/decode.py", f"llm.checkpoint={model}", "llm.prompt=w1 w2",
                           "llm.max_new_tokens=6", "llm.batch=2", "llm.progress=false",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("[0] w") and lines[1].startswith("[1] w")
    assert "tokens/s" in lines[-1] and "peak RSS" in lines[-1]


def test_window_attention_keeps_a_bounded_number_of_points(mistral):
    """Causal decoding keeps every position's keys and values; a window of 4 frees each
    after its last read, so the points kept grow only by a few bytes per position (the
    int32 output tokens kept for the result; on JAX a scan's stacked tokens too)."""
    _, path = mistral
    kv_per_step = 2 * SIZES["num_hidden_layers"] * SIZES["num_key_value_heads"] * 8 * 4  # k and v, float32
    for backend in ("numpy", "jax"):
        lm = tempo_llm.load(path, backend=backend)
        ids = _ids(1, 3)
        runs = {(kind, n): lm.generate(ids, n, attention=kind, window=4)
                for kind in ("causal", "window") for n in (30, 60)}
        kept = {key: run.kept_peak_bytes for key, run in runs.items()}
        assert kept["causal", 60] - kept["causal", 30] >= 30 * kv_per_step, backend
        assert 0 <= kept["window", 60] - kept["window", 30] <= 30 * 2 * 4, backend  # (tokens, not KV)


def test_decoding_stops_once_every_sequence_has_ended(llama):
    """With one sequence whose 3rd token is taken as EOS, decoding 40 tokens stops after
    it: the loop ran 3 steps, not 40."""
    _, path = llama
    lm = tempo_llm.load(path)
    ids = _ids(1, 4, seed=9)
    free = lm.generate(ids, 40)
    eos = int(free.tokens[0, 4 + 2])
    first = int(np.argmax(free.tokens[0, 4:] == eos)) + 1
    out = lm.generate(ids, 40, eos_token_id=eos, return_logits=True)
    assert out.tokens.shape == (1, 4 + first) and out.lengths.tolist() == [first]
    np.testing.assert_array_equal(out.tokens, free.tokens[:, :4 + first])
    assert out.logits.shape[1] == first


def test_eos_on_jax_runs_in_scans_and_stops_where_the_sequence_ends(llama):
    """An EOS that first comes late: on JAX the positions before it run as scans (the
    check that every sequence has ended, and the progress bar, are sinks called after
    each scan), and decoding stops right after it, as transformers' tokens say."""
    from tempo.runtime.lowering import SINK_SPAN
    model, path = llama
    ids = _ids(1, 4, seed=25)  # (a generation whose 77th token is a new one; the model is tiny)
    with torch.no_grad():
        theirs = model.generate(torch.tensor(ids), max_new_tokens=120, do_sample=False, pad_token_id=0,
                                eos_token_id=None).numpy()[0, 4:]
    late = [p for p in range(110, 20, -1) if theirs[p] not in theirs[:p]]
    assert late, "no token of this generation comes first after its 20th"
    eos, first = int(theirs[late[0]]), late[0] + 1
    lm = tempo_llm.load(path, backend="jax")
    out = lm.generate(ids, 120, eos_token_id=eos, progress=True)
    assert out.lengths.tolist() == [first] and out.tokens.shape == (1, 4 + first)
    np.testing.assert_array_equal(out.tokens[0, 4:], theirs[:first])
    exe = lm._program(lm._request(ids, 120, eos_token_id=eos, watched=True))[0]
    (spans,) = [c for c in exe.loop_choices.values() if c.form == "spans"]
    assert spans.scans >= 1 and spans.iterations_in_scans >= min(first, SINK_SPAN) - 4


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_on_token_streams_every_generated_token_in_order(llama, backend):
    """``on_token`` gets each generated position's tokens once, in order, the same as the
    generation's; with an EOS check, up to where decoding stopped and not after."""
    model, path = llama
    lm = tempo_llm.load(path, backend=backend)
    ids = np.concatenate([_ids(1, 4, seed=25), _ids(1, 4, seed=3)])
    free = lm.generate(ids[:1], 120).tokens[0, 4:]
    late = [p for p in range(110, 20, -1) if free[p] not in free[:p]]
    assert late, "no token of this generation comes first after its 20th"
    lm.compile_generation(ids, 120, progress=True, on_token=print)  # (the streamed program, made apart)
    for eos in (None, int(free[late[0]])):
        streamed: list[tuple[int, np.ndarray]] = []
        out = lm.generate(ids if eos is None else ids[:1], 120, eos_token_id=eos,
                          on_token=lambda n, tokens: streamed.append((n, tokens.copy())))
        generated = out.tokens[:, 4:]
        assert [n for n, _ in streamed] == list(range(generated.shape[1]))
        np.testing.assert_array_equal(np.stack([tokens for _, tokens in streamed], 1), generated)
    assert generated.shape[1] == late[0] + 1 and generated[0, -1] == eos


def test_buffers_grown_at_one_position_hand_their_memory_back_once(llama, monkeypatch):
    """Tiles of 4 rows: the causal keys' and values' device buffers (2 layers: 4 of them)
    grow together at every 4th position; the freed memory goes back to the system once
    per such position, not once per buffer (each trim of the C heap costs milliseconds)."""
    from tempo.runtime import stores
    grown, trims = [], []
    replaced, trim = stores.DeviceBuffers.replaced, stores.return_freed_memory
    monkeypatch.setattr(stores.DeviceBuffers, "replaced",
                        lambda self, block: (grown.append(block.shape), replaced(self, block))[1])
    monkeypatch.setattr(stores, "return_freed_memory", lambda: (trims.append(len(grown)), trim())[1])
    _, path = llama
    out = tempo_llm.load(path, backend="jax", tile=4).generate(_ids(1, 3), 14)
    assert out.tokens.shape == (1, 17)
    buffers = 2 * SIZES["num_hidden_layers"]
    assert len(grown) >= buffers and len(grown) % buffers == 0
    assert trims == list(range(buffers, len(grown) + 1, buffers))
