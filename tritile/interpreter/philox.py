"""Philox4x32-10 in torch integer ops, bit-exact with Triton's `tl.philox` / `tl.randint4x` and
with cuRAND's `curandStatePhilox4_32_10_t` (the generator behind TileLang's `T.rng_init` /
`T.rng_rand`): the interpreter evaluates the IR's ``Call("philox", (seed, subsequence,
position))`` with `curand_word` (tritile/interpreter/expressions.py).

Words are int64 tensors holding values in [0, 2**32).  A 32 x 32-bit product fits 64 bits
unsigned; int64 multiplication wraps modulo 2**64, so its bits are the unsigned product's and
``(p >> 32) & MASK`` is the high word (`umulhi`) whatever the sign of the wrapped int64.

cuRAND's stream: ``curand_init(seed, subsequence, offset)`` keys Philox with the 64-bit seed
(low word k0, high word k1), starts the 128-bit counter at ``subsequence * 2**64 + offset // 4``
and skips ``offset % 4`` words; each ``curand()`` returns the next of the four words of the
current counter's block, stepping the counter after the fourth.  Draw n of a stream is so word
``(offset + n) % 4`` of the block at counter ``subsequence * 2**64 + (offset + n) // 4`` - which is
what Triton's ``randint4x(seed, offset // 4 ...)`` returns, block by block (TileLang's
examples/rand/rand_uint.py compares the two).
"""
from __future__ import annotations

import torch

MASK = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # round multipliers


def _words(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64) & MASK


def philox4x32(k0, k1, c0, c1, c2, c3, rounds: int = 10):
    """The four words (int64 tensors in [0, 2**32)) of Philox4x32 of counter (c0, c1, c2, c3)
    under key (k0, k1) - Triton's `philox_impl` on uint32 words, broadcasting its arguments."""
    k0, k1, c0, c1, c2, c3 = (_words(x) for x in (k0, k1, c0, c1, c2, c3))
    k0, k1, c0, c1, c2, c3 = torch.broadcast_tensors(k0, k1, c0, c1, c2, c3)
    for _ in range(rounds):
        p0, p2 = ROUND_A * c0, ROUND_B * c2  # wrapped 64-bit products
        c0, c1, c2, c3 = ((p2 >> 32) & MASK) ^ c1 ^ k0, p2 & MASK, ((p0 >> 32) & MASK) ^ c3 ^ k1, p0 & MASK
        k0, k1 = (k0 + KEY_A) & MASK, (k1 + KEY_B) & MASK
    return c0, c1, c2, c3


def randint4x(seed: int, offset):
    """Triton's `tl.randint4x(seed, offset)`: Philox of counter (offset's low word, its high word
    for 64-bit offsets else 0, 0, 0) under the seed's two words (a negative seed sign-extended to
    64 bits, as Triton's `seed.to(tl.uint64)`)."""
    offset = torch.as_tensor(offset, dtype=torch.int64)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return philox4x32(seed & MASK, seed >> 32, offset & MASK, (offset >> 32) & MASK, 0, 0)


def curand_word(seed, subsequence, position):
    """Draw number `position` of cuRAND's Philox4_32_10 stream ``curand_init(seed, subsequence, 0)``
    - draw n of ``curand_init(seed, subsequence, offset)`` is its draw offset + n - as uint32 values
    in int64; `seed`, `subsequence` and `position` are ints or int64 tensors (broadcast), a
    negative seed read as its 64-bit two's complement (positions below 2**62; the counter's carry
    out of its low 64 bits into the subsequence words is not modelled)."""
    seed, subsequence, position = (torch.as_tensor(x, dtype=torch.int64) for x in (seed, subsequence, position))
    block = position >> 2
    words = philox4x32(seed & MASK, (seed >> 32) & MASK, block & MASK, (block >> 32) & MASK, subsequence & MASK,
                       (subsequence >> 32) & MASK)
    which = (position & 3).expand(words[0].shape)
    return torch.stack(words, -1).gather(-1, which.unsqueeze(-1)).squeeze(-1)


def curand_draws(seed: int, subsequence, offset, draws):
    """Draws number `draws` (an int64 tensor, broadcast with `subsequence` and `offset`) of the
    cuRAND Philox4_32_10 stream ``curand_init(seed, subsequence, offset)``, as uint32 values in
    int64 (offsets and draw numbers below 2**62)."""
    position = torch.as_tensor(offset, dtype=torch.int64) + torch.as_tensor(draws, dtype=torch.int64)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return curand_word(seed - (1 << 64) if seed >> 63 else seed, subsequence, position)  # int64's bits
