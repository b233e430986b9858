"""LLM decoding, side by side: tempo_llm (NumPy and JAX backends) against transformers
(eager with its default cache, and with its static cache) and a plain JAX greedy decode
with a preallocated padded KV cache (``baselines/jax_decode.py``), on the same random
weights, greedy, prompt of 16 tokens.

    python benchmarks/decode.py               # causal and window, batch 1 and 8, 512/2K/8K tokens
    python benchmarks/decode.py --lengths 512 2048 --batches 1 --attention causal
    python benchmarks/decode.py --systems tempo-numpy jax --lengths 512
    python benchmarks/decode.py --systems tempo-jax --decoding greedy eos sampled --lengths 2048
    python benchmarks/decode.py --lengths 512 2048 --plot decode.png   # + time per step against position

The model is ``--config small`` (4 layers, hidden 256, 8 heads, 2 KV heads, SwiGLU 704,
vocab 1000) or ``base`` (~100M parameters: 12 layers, hidden 768, 12 heads, 4 KV heads,
SwiGLU 2048, vocab 32000), written with ``tempo_llm.random_checkpoint`` as a Llama
checkpoint (causal) and a Mistral one with ``sliding_window=--window`` (window; the same
weights). ``--decoding`` also runs Tempo with an EOS check (``eos``: an ``eos_token_id``
of the vocabulary's last id, which a generation may or may not emit: tokens/s counts the
tokens generated) or sampling (``sampled``: temperature 0.8, top-k 50, top-p 0.9); the
baselines decode greedily only, and the ratios compare with their greedy rows. Each cell
runs in a fresh process and reports tokens/s of the generation (after
compiling and a short warm-up generation), compile time and peak RSS; the tables give
ratios to the plain JAX row. Every system runs on its framework's default device (a GPU
where there is one). Tempo's JAX backend compiles its kernels when they first run,
once per shape, so its first generation at a length includes XLA compiling; the faster of
two more (``tokens/s again``) shows the steady speed. A cell that fails or exceeds ``--timeout``
says so.

``--plot`` times each position in one more generation per cell: Tempo's streamed with
``on_token`` (its tokens reach the host a span of 64 positions at a time), transformers'
with a streamer, and the plain JAX decode's in a second program that calls back to the
host every 64 positions (the table's tokens/s come from the runs without these). The KV
column is what each system keeps: transformers' cache tensors, the plain JAX padded cache,
and Tempo's ``Generation.kept_peak_bytes`` (keys, values and the few other points kept
between positions, at their peak).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from benchmarks.common import fmt, ratio, render, report_result, run_worker  # noqa: E402

SYSTEMS = ("tempo-numpy", "tempo-jax", "jax", "torch-eager", "torch-static")
CONFIGS = {"small": dict(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=704, vocab=1000),
           "base": dict(layers=12, hidden=768, heads=12, kv_heads=4, intermediate=2048, vocab=32000)}
PROMPT = 16
WARMUP_TOKENS = 8
DECODINGS = ("greedy", "eos", "sampled")
SAMPLED = dict(temperature=0.8, top_k=50, top_p=0.9)


@dataclass(frozen=True)
class DecodeCell:
    system: str
    attention: str
    batch: int
    new_tokens: int
    checkpoint: str
    window: int
    decoding: str = "greedy"
    timeline: bool = False
    """Also time each position (for ``--plot``), in one more generation."""


def _thinned(marks: list[tuple[int, float]], start: float, every: int = 16) -> list[tuple[int, float]]:
    """``(tokens generated, seconds since start)`` at every ``every``-th mark and the last."""
    return [(n, at - start) for k, (n, at) in enumerate(marks) if n % every == 0 or k == len(marks) - 1]


def run_cell(cell: DecodeCell) -> dict[str, Any]:
    import numpy as np
    ids = np.random.default_rng(0).integers(3, 100, (cell.batch, PROMPT))
    window = cell.window if cell.attention == "window" else None
    if cell.system.startswith("tempo"):
        import tempo_llm
        lm = tempo_llm.load(cell.checkpoint, backend=cell.system.removeprefix("tempo-"))
        options: dict[str, Any] = dict(attention=cell.attention, window=window)
        if cell.decoding == "eos":
            options["eos_token_id"] = lm.cfg.vocab_size - 1
        elif cell.decoding == "sampled":
            options.update(SAMPLED)
        lm.generate(ids, WARMUP_TOKENS, **options)
        start = time.perf_counter()
        lm.compile_generation(ids, cell.new_tokens, **options)
        compiled = time.perf_counter()
        out = lm.generate(ids, cell.new_tokens, **options)
        decoded = time.perf_counter()
        again, again_s = None, float("inf")
        for _ in range(2):  # (on a GPU, the first of them may still wait for a background compile)
            start_again = time.perf_counter()
            generation = lm.generate(ids, cell.new_tokens, **options)
            if time.perf_counter() - start_again < again_s:
                again, again_s = generation, time.perf_counter() - start_again
        result = {"compile_s": compiled - start, "decode_s": decoded - compiled,
                  "again_s": again_s, "kv_bytes": again.kept_peak_bytes,
                  "tokens": out.tokens.shape[1] - PROMPT, "tokens_again": again.tokens.shape[1] - PROMPT}
        if cell.timeline:  # streamed (``on_token``): its first generation compiles the sink's spans
            marks: list[tuple[int, float]] = []
            lm.generate(ids, cell.new_tokens, **options, on_token=lambda n, _: None)
            start = time.perf_counter()
            lm.generate(ids, cell.new_tokens, **options,
                        on_token=lambda n, _: marks.append((n + 1, time.perf_counter())))
            result["timeline"] = _thinned(marks, start)
        return result
    if cell.system == "jax":
        import tempo_llm
        from benchmarks.baselines import jax_decode
        lm = tempo_llm.load(cell.checkpoint)
        out = jax_decode.decode(lm.cfg, lm.weights, ids, cell.new_tokens, window,
                                mark_every=64 if cell.timeline else None)
        return {"compile_s": out.compile_s, "decode_s": out.decode_s, "kv_bytes": out.kv_bytes,
                **({"timeline": out.timeline} if cell.timeline else {})}
    return _run_torch(cell, ids)


def _run_torch(cell: DecodeCell, ids: Any) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (as JAX: its default device)
    model = AutoModelForCausalLM.from_pretrained(cell.checkpoint, dtype=torch.float32).eval().to(device)
    static = {"cache_implementation": "static"} if cell.system == "torch-static" else {}
    prompt = torch.tensor(ids, device=device)

    def generate(n: int, streamer: Any = None) -> Any:
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0, return_dict_in_generate=True,
                                  streamer=streamer, **static)
    generate(WARMUP_TOKENS)
    start = time.perf_counter()
    out = generate(cell.new_tokens)
    result = {"compile_s": None, "decode_s": time.perf_counter() - start,
              "kv_bytes": _cache_bytes(out.past_key_values)}
    if cell.timeline:
        marks = _Marks()
        start = time.perf_counter()
        generate(cell.new_tokens, marks)
        result["timeline"] = _thinned(marks.marks, start)
    return result


class _Marks:
    """A transformers streamer that notes when each new token arrives (its first call
    hands in the prompt)."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []
        self._calls = 0

    def put(self, value: Any) -> None:
        if self._calls:
            self.marks.append((self._calls, time.perf_counter()))
        self._calls += 1

    def end(self) -> None:
        pass


def _cache_bytes(cache: Any) -> int:
    """The bytes of a transformers cache's keys and values after a generation."""
    import torch
    if hasattr(cache, "layers"):  # transformers 5
        tensors = [getattr(layer, name, None) for layer in cache.layers for name in ("keys", "values")]
    else:  # transformers 4: per-layer lists
        tensors = [*getattr(cache, "key_cache", []), *getattr(cache, "value_cache", [])]
    return sum(x.numel() * x.element_size() for x in tensors if isinstance(x, torch.Tensor))


def worker(spec: str) -> None:
    cell = DecodeCell(**json.loads(spec))
    report_result(lambda: run_cell(cell))


HEADERS = ["system", "attention", "batch", "new tokens", "tokens/s", "tokens/s again", "compile s",
           "peak RSS MiB", "KV MiB", "tokens/s / jax", "again / jax", "RSS / jax"]


def table(rows: list[tuple[DecodeCell, dict[str, Any]]], title: str, markdown: bool) -> str:
    def speed(cell: DecodeCell, out: dict[str, Any], key: str = "decode_s") -> float | None:
        tokens = out.get("tokens_again" if key == "again_s" else "tokens", cell.new_tokens)
        return cell.batch * tokens / out[key] if key in out else None
    ref = {(c.attention, c.batch, c.new_tokens): (speed(c, o), o.get("peak_rss_mb"))
           for c, o in rows if c.system == "jax" and not o.get("error")}
    body = []
    for cell, out in rows:
        key = (cell.attention, cell.batch, cell.new_tokens)
        system = cell.system if cell.decoding == "greedy" else f"{cell.system} ({cell.decoding})"
        if out.get("error"):
            body.append([system, cell.attention, str(cell.batch), str(cell.new_tokens), out["error"]])
            continue
        jax_speed, jax_rss = ref.get(key, (None, None))
        tps, again = speed(cell, out), speed(cell, out, "again_s")
        others = cell.system != "jax"
        body.append([system, cell.attention, str(cell.batch), str(cell.new_tokens), fmt(tps, 1),
                     fmt(again, 1) if again else "", fmt(out.get("compile_s")),
                     fmt(out.get("peak_rss_mb"), 0),
                     fmt(out["kv_bytes"] / 2 ** 20, 2) if out.get("kv_bytes") is not None else "",
                     ratio(tps, jax_speed) if others else "",
                     ratio(again, jax_speed) if others and again else "",
                     ratio(out.get("peak_rss_mb"), jax_rss) if others else ""])
    notes = ["tokens/s: batch x new tokens generated over the generation's wall time (after compiling "
             f"and a {WARMUP_TOKENS}-token warm-up generation); prompt {PROMPT} tokens; greedy unless "
             f"(eos): with an EOS check, (sampled): {SAMPLED}.",
             "tokens/s again: the faster of Tempo's second and third generations of the same length "
             "(its JAX backend compiles kernels for new shapes during the first).",
             "ratios: over the plain JAX row of the same attention, batch and length; above 1x for "
             "tokens/s Tempo is faster, below 1x for RSS it is smaller.",
             "peak RSS: ru_maxrss of the cell's process.",
             "KV MiB: the keys and values kept after the generation (transformers: its cache's "
             "tensors; plain JAX: its preallocated cache) or, for Tempo, the most its stores held "
             "at once of points over the positions (keys, values and the few other points kept "
             "between positions)."]
    return render(title, HEADERS, body, notes, markdown)


def plot(rows: list[tuple[DecodeCell, dict[str, Any]]], path: Path, title: str) -> None:
    """Time per decoding step against position, one panel per attention and batch, at the
    longest length: each system's timed positions, averaged over bins of at least 64
    positions (Tempo's streamed tokens reach the host a span of 64 at a time)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    timed = [(c, o["timeline"]) for c, o in rows if o.get("timeline")]
    if not timed:
        print("no cell finished with a timeline: nothing to plot")
        return
    longest = max(c.new_tokens for c, _ in timed)
    panels = sorted({(c.attention, c.batch) for c, _ in timed})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (attention, batch) in zip(axes[0], panels):
        for cell, timeline in timed:
            if (cell.attention, cell.batch, cell.new_tokens) != (attention, batch, longest):
                continue
            n, at = np.asarray(timeline, dtype=float).T
            edges = np.linspace(0, n[-1], max(2, int(n[-1] // max(64, n[-1] // 32))) + 1)
            ms = np.diff(np.interp(edges, np.r_[0.0, n], np.r_[0.0, at])) / np.diff(edges) * 1e3
            label = cell.system if cell.decoding == "greedy" else f"{cell.system} ({cell.decoding})"
            ax.stairs(ms, PROMPT + edges, label=label, linewidth=1.5, baseline=None)
        ax.set(title=f"{attention}, batch {batch}, {longest} new tokens", xlabel="position",
               ylabel="ms per step (the whole batch)", yscale="log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title.replace(" (", "\n("), fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=list(CONFIGS), default="small")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--attention", nargs="+", choices=["causal", "window"], default=["causal", "window"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 8192])
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--decoding", nargs="+", choices=DECODINGS, default=["greedy"],
                   help="Tempo's decodings (the baselines: greedy only)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per cell (default 900)")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown here")
    p.add_argument("--plot", type=Path, default=None,
                   help="time each position in one more generation per cell and plot time per step "
                        "against position at the longest length (a PNG)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    from tempo_llm import random_checkpoint
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tempo-decode-") as tmp:
        sizes = CONFIGS[args.config]
        longest = max(args.lengths) + PROMPT
        paths = {"causal": random_checkpoint.write(Path(tmp) / "llama",
                                                   random_checkpoint.Spec(**sizes, max_positions=longest)),
                 "window": random_checkpoint.write(Path(tmp) / "mistral", random_checkpoint.Spec(
                     **sizes, arch="mistral", window=args.window, max_positions=longest))}
        rows = []
        for attention in args.attention:
            for batch in args.batches:
                for length in args.lengths:
                    for system in args.systems:
                        for decoding in args.decoding if system.startswith("tempo") else ["greedy"]:
                            cell = DecodeCell(system, attention, batch, length, str(paths[attention]),
                                              args.window, decoding, args.plot is not None)
                            print(f"... {system} ({decoding}), {attention}, batch {batch}, {length} tokens",
                                  flush=True)
                            rows.append((cell, run_worker(Path(__file__).resolve(), json.dumps(asdict(cell)),
                                                          args.timeout, ROOT)))
    sizes_text = ", ".join(f"{k} {v}" for k, v in CONFIGS[args.config].items())
    title = f"Decoding, config {args.config} ({sizes_text}), window {args.window}"
    print(table(rows, title, markdown=False))
    if args.markdown:
        args.markdown.write_text(table(rows, title, markdown=True) + "\n")
    if args.plot:
        plot(rows, args.plot, title)
    print(f"total wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
