"""Benchmark: vitviz rollout (row vector, O(L T^2)) against the full matrix chain (O(L T^3)).

Run from the repository root: `python bench/rollout.py [--repeats N] [--tokens 197 577 1025]`.
Prints the median time of interleaved repeats for each method, the ratio, and checks the two agree.
`time_rollout(T)` is importable (e.g. by bench/capture.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from vitviz.core.analyses.analysis import rollout, rollout_naive  # noqa: E402


def random_attention(layers: int, heads: int, tokens: int, seed: int = 0) -> np.ndarray:
    """(L, H, T, T) float32 row-stochastic attention (softmax of N(0, 2^2) logits), built in place."""
    rng = np.random.default_rng(seed)
    attn = rng.standard_normal((layers, heads, tokens, tokens), dtype=np.float32)  # (L, H, T, T)
    attn *= 2.0
    attn -= attn.max(axis=-1, keepdims=True)
    np.exp(attn, out=attn)
    attn /= attn.sum(axis=-1, keepdims=True)
    return attn


def _grid_for(tokens: int) -> tuple[int, int, int]:
    """(num_prefix, gh, gw) for a CLS + square grid token count such as 197, 577 or 1025."""
    side = int(round((tokens - 1) ** 0.5))
    if side * side != tokens - 1:
        raise ValueError(f"T={tokens} is not 1 + a square grid")
    return 1, side, side


def time_rollout(tokens: int, layers: int = 12, heads: int = 12, repeats: int = 5, head_fusion: str = "mean",
                 discard_ratio: float = 0.0, seed: int = 0) -> dict[str, float]:
    """Time `rollout` and `rollout_naive` on random attention, alternating them `repeats` times.

    Returns:
        {'tokens', 'fast_s', 'naive_s', 'ratio' (naive / fast), 'max_abs_diff'}; raises AssertionError when the
        two results disagree (rtol 1e-4, atol 1e-6).
    """
    attn = random_attention(layers, heads, tokens, seed)
    num_prefix, gh, gw = _grid_for(tokens)
    kwargs = dict(head_fusion=head_fusion, discard_ratio=discard_ratio, num_prefix=num_prefix, grid=(gh, gw))
    methods: dict[str, Callable[[], np.ndarray]] = {
        "fast": lambda: rollout(attn, **kwargs),  # type: ignore[arg-type]
        "naive": lambda: rollout_naive(attn, **kwargs),  # type: ignore[arg-type]
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    outputs: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, method in methods.items():
            start = time.perf_counter()
            outputs[name] = method()
            times[name].append(time.perf_counter() - start)
    np.testing.assert_allclose(outputs["fast"], outputs["naive"], rtol=1e-4, atol=1e-6)
    fast, naive = statistics.median(times["fast"]), statistics.median(times["naive"])
    return {"tokens": float(tokens), "fast_s": fast, "naive_s": naive, "ratio": naive / fast,
            "max_abs_diff": float(np.abs(outputs["fast"] - outputs["naive"]).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[197, 577, 1025])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fusion", default="mean", choices=["mean", "max", "min"])
    parser.add_argument("--discard", type=float, default=0.0)
    args = parser.parse_args()
    print(f"rollout, L=12 H=12 float32, fusion={args.fusion} discard={args.discard}, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'T':>6} {'vitviz (ms)':>12} {'naive (ms)':>12} {'naive/vitviz':>13} {'max |diff|':>11}")
    for tokens in args.tokens:
        r = time_rollout(tokens, repeats=args.repeats, head_fusion=args.fusion, discard_ratio=args.discard)
        print(f"{tokens:>6} {r['fast_s'] * 1e3:>12.1f} {r['naive_s'] * 1e3:>12.1f} {r['ratio']:>12.1f}x "
              f"{r['max_abs_diff']:>11.2e}")


if __name__ == "__main__":
    main()
