"""A keyed random permutation of [0, n) that is evaluated at any position without building it.

`index_shuffle(positions, n, key)` maps positions to values through a bijection of [0, n): a
balanced Feistel network over the smallest even-bit power-of-two domain >= n, with cycle walking
back into [0, n). This is the construction behind Grain's `index_shuffle` and the "random
access shuffle" of large-scale loaders: memory O(1) in n, so a rank can ask for the slice of an
epoch it reads without holding the epoch. The round function is SplitMix64's finaliser, which
is a good 64-bit mixer; six rounds pass the usual uniformity checks at the sizes we use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

_ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (uint64 arithmetic wraps, which is what it relies on)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def round_keys(key: Sequence[int]) -> np.ndarray:
    """Six 64-bit round keys from any sequence of non-negative ints (seed, epoch, ...)."""
    return np.random.default_rng([int(k) for k in key]).integers(
        0, np.iinfo(np.uint64).max, size=_ROUNDS, dtype=np.uint64, endpoint=True
    )


def _feistel(x: np.ndarray, half_bits: int, keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    with np.errstate(over="ignore"):
        for k in keys:
            left, right = right, left ^ ((_mix(right ^ k) + _GOLDEN) & mask)
    return (left << shift) | right


def _feistel_inverse(y: np.ndarray, half_bits: int, keys: np.ndarray) -> np.ndarray:
    """`_feistel` undone: the rounds run backwards with the keys in reverse order."""
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = y >> shift, y & mask
    with np.errstate(over="ignore"):
        for k in keys[::-1]:
            left, right = right ^ ((_mix(left ^ k) + _GOLDEN) & mask), left
    return (left << shift) | right


def _checked(positions: np.ndarray, n: int) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= max(n, 1)):
        raise IndexError(f"positions outside [0, {n})")
    return pos


def _walk(
    x: np.ndarray, n: int, key: Sequence[int] | np.ndarray,
    rounds: Callable[[np.ndarray, int, np.ndarray], np.ndarray],
) -> np.ndarray:  # fmt: skip
    keys = key if isinstance(key, np.ndarray) and key.dtype == np.uint64 else round_keys(key)
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    out = rounds(x.astype(np.uint64), half_bits, keys)
    # Cycle walking: a value outside [0, n) is permuted again until it lands inside. The domain
    # is < 4n, so this takes fewer than four rounds on average and keeps the map a bijection.
    outside = np.flatnonzero(out >= np.uint64(n))
    while outside.size:
        out[outside] = rounds(out[outside], half_bits, keys[:, outside] if keys.ndim == 2 else keys)
        outside = outside[out[outside] >= np.uint64(n)]
    return out.astype(np.int64)


def index_shuffle(positions: np.ndarray, n: int, key: Sequence[int] | np.ndarray) -> np.ndarray:
    """The values at `positions` of a keyed permutation of [0, n); int64 like the positions.

    `key` is a sequence of ints or the array `round_keys` returned for it (reuse it when the
    same permutation is asked many times); or, to evaluate several permutations of [0, n) in
    one pass, one column of round keys per position (shape (rounds, len(positions))).
    """
    pos = _checked(positions, n)
    return pos.copy() if n <= 1 else _walk(pos, n, key, _feistel)


def index_unshuffle(values: np.ndarray, n: int, key: Sequence[int] | np.ndarray) -> np.ndarray:
    """The positions at which `index_shuffle(., n, key)` gives `values`: its inverse, so that
    where a few known values sit in the permutation costs O(values), not O(n). Walking the
    inverse cycle from a value stops at the position the forward walk started from, since the
    forward walk passed only through values outside [0, n) on the way."""
    pos = _checked(values, n)
    return pos.copy() if n <= 1 else _walk(pos, n, key, _feistel_inverse)
