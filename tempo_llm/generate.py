"""Decoding with a Llama-family model compiled by Tempo: full-sequence logits and
token-by-token generation, each one RT program over the position dim ``t``.

The tokens are a placeholder over ``t``: the prompt's at ``t < P`` (a host UDF hands them
in), the token chosen from the logits at ``t - 1`` after. The program is compiled once per
shape and options and cached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import tempo as tp
from tempo_llm.config import CheckpointFormatError, LlamaConfig
from tempo_llm.model import Attention, Decoder
from tempo_llm.sampling import Sampling, uniforms
from tempo_llm.weights import load_weights


@dataclass
class Generation:
    """A batch's generated sequences."""

    tokens: np.ndarray
    """``(B, P + N)``: the prompt and the ``N`` tokens after it (after an EOS, EOS again).
    ``N`` is ``max_new_tokens``, or fewer where every sequence emitted EOS before: decoding
    stopped there."""
    lengths: np.ndarray
    """``(B,)``: tokens generated up to and including each sequence's first EOS (``N``
    for a sequence without one)."""
    logits: np.ndarray | None = None
    """``(B, N, vocab)``: the logits each generated token was chosen from, when asked."""
    store_peak_bytes: int = 0
    """The most bytes the program's stores held at once: the weights, keys, values and the
    other points kept between positions (``tempo.runtime.stores.MemoryStats``)."""
    kept_peak_bytes: int = 0
    """Of those, without the weights: the most bytes of points over the positions held at
    once (keys, values and the few other points kept between positions;
    ``MemoryStats.over_dims``)."""


@dataclass
class LanguageModel:
    """A loaded model: ``logits(ids)`` and ``generate(ids, n)``."""

    cfg: LlamaConfig
    weights: dict[str, np.ndarray]
    backend: str = "numpy"
    tokenizer: Any = None
    """A ``tokenizers.Tokenizer`` when the checkpoint has ``tokenizer.json``."""
    tile: int | None = None
    """Rows per tile of the attention's growing key/value reads (``tempo.passes.tile``;
    None: the compiler's choice)."""
    _programs: dict[_Request, tuple] = field(default_factory=dict, repr=False)
    _running: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """One generation at a time (threads calling ``generate`` wait their turn)."""

    def logits(self, ids: np.ndarray, attention: str | None = None,
               window: int | None = None) -> np.ndarray:
        """The logits after every position of ``ids`` (``(B, P)`` ints): ``(B, P, vocab)``.
        By default with the model's own attention (a window for a Mistral config with
        ``sliding_window``, else causal)."""
        ids = _token_ids(ids, self.cfg.vocab_size)
        request = _Request(*ids.shape, 0, self._attention(attention, window), Sampling(), None, True)
        return self._run(request, ids)["logits"]

    def generate(self, ids: np.ndarray, max_new_tokens: int, *, attention: str | None = None,
                 window: int | None = None, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: int | None = None, seed: int = 0,
                 return_logits: bool = False, progress: bool = False,
                 on_token: Callable[[int, np.ndarray], None] | None = None) -> Generation:
        """``max_new_tokens`` tokens after each prompt of ``ids`` (``(B, P)`` ints).
        ``attention`` is the model's own by default (a window for a Mistral config with
        ``sliding_window``, else causal); ``"window"`` attends to the last ``window``
        positions (by default the config's ``sliding_window``). A sequence that emits
        ``eos_token_id`` keeps emitting it; ``lengths`` says where each one stopped.
        ``progress``: a progress bar. ``on_token(n, tokens)`` streams the generation: it is
        called with ``n = 0, 1, ...`` and the ``(B,)`` tokens generated ``n``-th, in order, as
        they reach the host (on the JAX backend, up to two scans of positions after the device
        chose them)."""
        ids = _token_ids(ids, self.cfg.vocab_size)
        request = self._request(ids, max_new_tokens, attention, window, temperature, top_k, top_p,
                                eos_token_id, seed, return_logits, progress or on_token is not None)
        out = self._run(request, ids, progress, on_token)
        P = request.prompt
        generated = out["chosen"][:, P - 1:]  # fewer than asked when every sequence ended
        tokens = np.concatenate([ids, generated], axis=1)
        lengths = np.full(len(ids), generated.shape[1], np.int64)
        if eos_token_id is not None:
            ended = generated == eos_token_id
            lengths = np.where(ended.any(1), ended.argmax(1) + 1, generated.shape[1])
        logits = out["logits"][:, P - 1:] if return_logits else None
        stats = self._program(request)[0].stats
        return Generation(tokens, lengths, logits, stats.peak_device_bytes + stats.peak_host_bytes,
                          stats.over_dims.run_peak)

    def compile_generation(self, ids: np.ndarray, max_new_tokens: int, **options: Any) -> None:
        """Compile what ``generate`` with these arguments runs, without running it (to time
        compilation apart)."""
        ids = _token_ids(ids, self.cfg.vocab_size)
        progress, on_token = options.pop("progress", False), options.pop("on_token", None)
        watched = bool(progress) or on_token is not None
        self._program(self._request(ids, max_new_tokens, **options, watched=watched))

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids (needs the checkpoint's ``tokenizer.json``)."""
        return self._tokens().encode(text).ids

    def decode(self, ids: Any) -> str:
        """The text of token ids (needs the checkpoint's ``tokenizer.json``)."""
        return self._tokens().decode([int(k) for k in ids])

    def _tokens(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json; pass token ids instead of text")
        return self.tokenizer

    def _attention(self, kind: str | None, window: int | None) -> Attention:
        if kind is None:
            kind = "window" if self.cfg.sliding_window else "causal"
        if kind == "window" and window is None:
            window = self.cfg.sliding_window
        return Attention(kind, window)

    def _request(self, ids: np.ndarray, max_new_tokens: int, attention: str | None = None,
                 window: int | None = None, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: int | None = None, seed: int = 0,
                 return_logits: bool = False, watched: bool = False) -> _Request:
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if eos_token_id is not None and not 0 <= eos_token_id < self.cfg.vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary "
                             f"({self.cfg.vocab_size})")
        return _Request(*ids.shape, max_new_tokens, self._attention(attention, window),
                        Sampling(temperature, top_k, top_p, seed), eos_token_id, return_logits, watched)

    def _run(self, request: _Request, ids: np.ndarray, progress: bool = False,
             on_token: Callable[[int, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
        """Run ``request``'s program on ``ids``: the token chosen at every position
        (``(B, positions)``) and, when asked, the logits there."""
        exe, feed, outputs = self._program(request)
        with self._running:  # (``feed`` is the program's, whatever the seed)
            feed["ids"], feed["seed"] = ids, request.sampling.seed
            bar = tqdm(total=request.new, desc="decoding", unit="tok", disable=not progress)

            def watch(n: int, tokens: np.ndarray) -> None:
                bar.update(1)
                if on_token is not None:
                    on_token(n, tokens)
            feed["watch"] = watch
            try:
                results = exe.run()
            finally:
                bar.close()
        return {name: np.moveaxis(np.asarray(results[rt]), 0, 1) for name, rt in outputs.items()}

    def _program(self, request: _Request) -> tuple:
        """The compiled program of ``request``, shared by every seed (a run-time input)."""
        key = replace(request, sampling=replace(request.sampling, seed=0))
        if key not in self._programs:
            self._programs[key] = self._compile(key)
        return self._programs[key]

    def _compile(self, request: _Request) -> tuple:
        """The decoding program of ``request`` over positions ``0 .. P + new - 2``: the
        executable, the dict its UDFs read the prompt from, its outputs by name."""
        B, P, eos, sampling = request.batch, request.prompt, request.eos, request.sampling
        decoder = Decoder(self.cfg, self.weights)
        feed: dict[str, Any] = {}
        positions = P + max(request.new, 1) - 1
        ctx = tp.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            tokens = tp.placeholder(shape=(B,), dtype="int32", domain=(t,))
            (prompt,) = tp.udf(lambda point: feed["ids"][:, point["t"]], outputs=[((B,), "int32")],
                               domain=(t,), name="prompt", pass_point=True, when=t < P)
            tokens[t < P] = prompt
            logits = decoder.logits(tokens, t, request.attention)

            uniform = None
            if not sampling.greedy:  # every position's numbers, handed in with the prompt
                (drawn,) = tp.udf(lambda point: uniforms(feed["seed"], positions, B),
                                  outputs=[((positions, B, 1), "float32")], domain=(t,), name="uniforms",
                                  pass_point=True, when=t < 1)
                at = tp.symbol_value(t).astype("int32").reshape(1, 1, 1).expand(1, B, 1)
                uniform = drawn[0].gather(at, 0).reshape(B, 1)
            chosen = sampling.choose(logits, t, uniform)  # on the device: no position waits for the host
            if eos is not None:  # a generated EOS repeats
                chosen = tp.where((tokens == eos) & (tp.symbol_value(t) >= P), eos, chosen)
            if request.new:
                tokens[t >= P] = chosen[t - 1]
            if request.watched:  # a progress bar or ``on_token``
                tp.sink(chosen, lambda tokens, point: feed["watch"](point["t"] - (P - 1), np.asarray(tokens)),
                        name="watch", when=t >= P - 1)
            if request.new and eos is not None:  # every sequence has ended: stop decoding
                ended = (chosen == eos).astype("int32").min() > 0  # (on the device: a sink's
                tp.stop_when(ended & (tp.symbol_value(t) >= P - 1))  # calls wait for a scan)
        outputs = {"chosen": chosen, **({"logits": logits} if request.keep_logits else {})}
        exe = ctx.compile({T: positions}, list(outputs.values()), backend=self.backend,
                          tile=self.tile)
        return exe, feed, outputs


@dataclass(frozen=True)
class _Request:
    """What one compiled decoding program is for (the programs' cache key)."""

    batch: int
    prompt: int
    new: int
    """Tokens to generate (0: logits of the prompt only)."""
    attention: Attention
    sampling: Sampling
    eos: int | None
    keep_logits: bool
    watched: bool = False
    """Whether the generated tokens reach the host as they are chosen (a progress bar, ``on_token``)."""


def _token_ids(ids: Any, vocab: int) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim != 2 or array.shape[1] < 1 or array.dtype.kind not in "iu":
        raise ValueError(f"ids must be a (batch, prompt length) integer array, got "
                         f"{array.dtype}{array.shape}")
    if array.min() < 0 or array.max() >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab}), got {array.min()}..{array.max()}")
    return array.astype(np.int32)


def load(path: str | Path, backend: str = "numpy", tile: int | None = None) -> LanguageModel:
    """The model in a local Hugging Face-format directory (``config.json``, safetensors
    weights, optionally ``tokenizer.json``). ``tile``: rows per tile of the attention's
    key/value reads (by default the compiler's choice; ``tempo.passes.tile``)."""
    path = Path(path)
    cfg = LlamaConfig.from_file(path / "config.json")
    weights = load_weights(path, cfg)
    tokenizer = None
    if (path / "tokenizer.json").exists():
        from tokenizers import Tokenizer
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own exception type
            raise CheckpointFormatError(f"{path / 'tokenizer.json'} is not a tokenizer ({e})") from None
    return LanguageModel(cfg, weights, backend, tokenizer, tile)
