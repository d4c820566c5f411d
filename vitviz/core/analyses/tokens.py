"""The token layout of captured attention, shared by the analyses and rollout: validation, prefix tokens, grid.

An attention array is (L, H, T, T). Token order is the reference ViT's: `num_prefix` prefix tokens (cls, dist,
registers) first, then the patches in row-major order, so token `num_prefix + r * gw + c` is patch (r, c). For a raw
array `num_prefix` and the grid are passed explicitly and token 0 is taken to be the CLS token whenever
`num_prefix > 0`; for an `AttentionResult` they come from its spec (`spec.cls_token` decides). The grid is never
guessed from `sqrt(T)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np

from vitviz.core.spec import AttentionResult
from vitviz.errors import VitvizError

Head = Union[int, Literal["mean", "max"]]
Query = Union[int, Literal["cls", "mean"]]
Fusion = Literal["mean", "max", "min"]
AttentionLike = Union[AttentionResult, np.ndarray]

TINY = np.finfo(np.float32).tiny


class AnalysisError(VitvizError, ValueError):
    """An analysis was asked for something the attention cannot give (wrong shape, no CLS token, bad index)."""


@dataclass(frozen=True)
class Tokens:
    """The (L, H, T, T) array and how its tokens are laid out."""

    attn: np.ndarray
    num_prefix: int
    grid: tuple[int, int] | None
    has_cls: bool


def tokens_of(attn: AttentionLike, num_prefix: int | None, grid: tuple[int, int] | None,
              need_grid: bool = True) -> Tokens:
    """Validate the attention array and resolve the prefix count and grid from a result or the arguments."""
    has_cls: bool | None = None
    if isinstance(attn, AttentionResult):
        num_prefix = attn.spec.num_prefix if num_prefix is None else num_prefix
        grid = attn.spec.grid if grid is None else grid
        has_cls = attn.spec.cls_token
        attn = attn.attentions
    arr = np.asarray(attn)
    if arr.ndim != 4 or arr.shape[2] != arr.shape[3] or 0 in arr.shape:
        raise AnalysisError(f"expected attention of shape (L, H, T, T), found {arr.shape}")
    if num_prefix is None:
        raise AnalysisError("num_prefix is required with a raw (L, H, T, T) array")
    t = arr.shape[2]
    if not 0 <= num_prefix <= t:
        raise AnalysisError(f"num_prefix must lie in [0, {t}] for T={t}, found {num_prefix}")
    if grid is not None:
        gh, gw = int(grid[0]), int(grid[1])
        if gh < 1 or gw < 1 or num_prefix + gh * gw != t:
            raise AnalysisError(f"grid {gh}x{gw} with {num_prefix} prefix tokens makes "
                                f"{num_prefix + gh * gw} tokens, but the attention has T={t}")
        grid = (gh, gw)
    elif need_grid:
        raise AnalysisError("grid (rows, columns) is required with a raw array; it is never guessed from sqrt(T)")
    return Tokens(arr, num_prefix, grid, num_prefix > 0 if has_cls is None else has_cls)


def check_index(value: int, size: int, what: str) -> int:
    """A Python-style index (negative counts from the end) checked against `size`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not -size <= int(value) < size:
        raise AnalysisError(f"{what} must be an integer in [{-size}, {size}), found {value!r}")
    return int(value) % size


def to_grid(vec: np.ndarray, tok: Tokens) -> np.ndarray:
    """The patch part of a (T,) token vector as a (gh, gw) map."""
    assert tok.grid is not None
    return vec[tok.num_prefix:].reshape(tok.grid)  # (N,) -> (gh, gw)


def fuse_heads(block: np.ndarray, head: Head | Fusion) -> np.ndarray:
    """Reduce a (H, ...) block over heads: a head index, or 'mean' / 'max' / 'min'; always a new float32 array."""
    block = np.asarray(block, dtype=np.float32)
    if head == "mean":
        return block.mean(axis=0)
    if head == "max":
        return block.max(axis=0)
    if head == "min":
        return block.min(axis=0)
    if isinstance(head, str):
        raise AnalysisError(f"head must be an index, 'mean' or 'max' (rollout: 'mean', 'max', 'min'), found {head!r}")
    return block[check_index(head, block.shape[0], "head")].copy()


def query_rows(tok: Tokens, query: Query) -> int | slice:
    """The row index of `query`: a token index, 'cls' (token 0) or 'mean' (all patch rows, as a slice)."""
    t = tok.attn.shape[2]
    if query == "cls":
        if not tok.has_cls:
            raise AnalysisError("this model has no CLS token, so CLS maps are undefined; "
                                "use query='mean' (mean over patch queries) or a token index")
        return 0
    if query == "mean":
        if tok.num_prefix == t:
            raise AnalysisError("query='mean' needs at least one patch token")
        return slice(tok.num_prefix, t)
    return check_index(query, t, "query token")  # type: ignore[arg-type]


def patch_at(place: tuple[float, float], grid: tuple[int, int]) -> int:
    """The patch (row-major index on `grid`) under a place (y, x), fractions of the image: the one rule for keeping
    a query at the same place when the grid changes (another model, another input size, model B of a comparison)."""
    gh, gw = grid
    row, col = min(gh - 1, int(place[0] * gh)), min(gw - 1, int(place[1] * gw))
    return row * gw + col


@dataclass(frozen=True)
class TokenLayout:
    """How tokens map onto the image for one model and input size: the prefix tokens' names, then the patch
    grid row-major."""

    prefix: tuple[str, ...]
    grid: tuple[int, int]

    @property
    def count(self) -> int:
        return len(self.prefix) + self.grid[0] * self.grid[1]

    def place(self, token: int) -> str | tuple[float, float]:
        """A prefix token's name, or a patch's centre as a fraction of the image (y, x)."""
        p = len(self.prefix)
        if token < p:
            return self.prefix[token]
        row, col = divmod(token - p, self.grid[1])
        return ((row + 0.5) / self.grid[0], (col + 0.5) / self.grid[1])

    def token_at(self, place: str | tuple[float, float]) -> int | None:
        """The token at a place (`place`): the prefix token of that name, or the patch at that point."""
        if isinstance(place, str):
            return self.prefix.index(place) if place in self.prefix else None
        return len(self.prefix) + patch_at(place, self.grid)

    def describe(self, token: int) -> str:
        p = len(self.prefix)
        return self.prefix[token] if token < p else "patch ({}, {})".format(*divmod(token - p, self.grid[1]))


def follow_query(old: TokenLayout | None, new: TokenLayout, query: int | None,
                 where: str = "the new layout") -> tuple[int | None, str]:
    """The query token for a new token layout and what to tell the user ('' when nothing to say): the same prefix
    token by name, or the patch at the same place in the image; None when there is no such token. With no old
    layout (the first model) a query is an index into the new one."""
    if query is None:
        return None, ""
    if old is None:
        return (query if query < new.count else None), ""
    if query >= old.count:
        return None, ""
    token = new.token_at(old.place(query))
    before = old.describe(query)
    if token is None:
        return None, f"The query token {before} does not exist in {where}: query cleared"
    if old != new and (token != query or new.describe(token) != before):
        grids = "" if old.grid == new.grid else f" ({old.grid[0]}×{old.grid[1]} → {new.grid[0]}×{new.grid[1]})"
        return token, (f"Query kept at the same place in the image: {before} is {new.describe(token)} (token "
                       f"{token}) in {where}{grids}")
    return token, ""
