"""Evaluate a checkpoint's greedy policy (its most likely action) for N episodes.

    python scripts/evaluate.py runs/<run>/checkpoints/last.npz
    python scripts/evaluate.py runs/<run>/checkpoints/last.npz --episodes 20 --video cartpole.gif

Prints the mean return. Episodes use seeds training did not (the run's seed + 10000)
unless --seed says otherwise. --video writes the first episode as a GIF (needs pygame and
Pillow: pip install -e .[video]).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tempo.errors import TempoError  # noqa: E402 - after the path fix for running from a checkout
from tempo_rl.algorithms import import_algorithm_module  # noqa: E402
from tempo_rl.evaluate import evaluate  # noqa: E402


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a .npz written by scripts/train.py")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--video", type=Path, default=None, help="write the first episode as a GIF")
    parser.add_argument("--env-id", default=None,
                        help="the gymnasium id to play (default: the checkpoint's; ids of the form "
                             "module:Env are taken from here only)")
    parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                        help="import this module first (one that registers the checkpoint's algorithm)")
    args = parser.parse_args(argv)
    for module in args.modules:
        import_algorithm_module(module)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    try:
        result = evaluate(args.checkpoint, episodes=args.episodes, seed=args.seed, video=args.video,
                          env_id=args.env_id)
    except (TempoError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(f"mean return {result.mean_return:.1f} over {len(result.returns)} episodes "
          f"(min {min(result.returns):.1f}, max {max(result.returns):.1f})"
          + (f"; video: {result.video}" if result.video else ""))
    return result.mean_return


if __name__ == "__main__":
    main()
