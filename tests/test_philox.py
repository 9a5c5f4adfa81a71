"""tritile/interpreter/philox.py: Philox4x32-10 in torch integer ops, bit-exact with Triton's own
`tl.randint4x` (run in Triton's interpreter, which needs TRITON_INTERPRET=1 before triton is
imported: a subprocess) and with cuRAND's Philox stream as TileLang's `T.rng_rand` draws it."""
import os
import subprocess
import sys
import textwrap

import torch

from tritile.interpreter import philox

_TRITON = textwrap.dedent("""
    import sys
    import torch, triton, triton.language as tl

    @triton.jit
    def rand(X, seed, base, M, N: tl.constexpr):
        offset = base + tl.program_id(0) * N + tl.arange(0, N)
        r0, r1, r2, r3 = tl.randint4x(seed, offset)
        i = tl.program_id(0) * N * 4 + tl.arange(0, N) * 4
        tl.store(X + i, r0, mask=i < M)
        tl.store(X + i + 1, r1, mask=i + 1 < M)
        tl.store(X + i + 2, r2, mask=i + 2 < M)
        tl.store(X + i + 3, r3, mask=i + 3 < M)

    seed, base, M = (int(a) for a in sys.argv[1:4])
    x = torch.empty(M, dtype=torch.uint32)
    rand[(triton.cdiv(M, 128),)](x, seed, base, M, 32)
    torch.save(x, sys.argv[4])
""")


def _triton_randint4x(tmp_path, seed, base, m):
    script, out = tmp_path / "rand.py", tmp_path / f"rand_{seed}_{base}.pt"
    script.write_text(_TRITON)
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(script), str(seed), str(base), str(m), str(out)], check=True, env=env,
                   timeout=300)
    return torch.load(out).to(torch.int64) & philox.MASK  # uint32 -> its values


def test_randint4x_is_tritons_bit_for_bit(tmp_path):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for _ in range(2):
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        base = int(torch.randint(0, 2**20, (1,), generator=gen))
        m = 512
        expected = _triton_randint4x(tmp_path, seed, base, m)
        words = philox.randint4x(seed, base + torch.arange(m // 4))
        got = torch.stack(words, -1).reshape(-1)
        assert torch.equal(got, expected), (seed, base)
        # TileLang's rand_uint.py: program b's stream curand_init(seed, 0, b * 128) drawn 128 times
        # gives element b * 128 + j; every offset is a multiple of 4 there, so block-aligned
        draws = torch.arange(m)
        assert torch.equal(philox.curand_draws(seed, 0, base * 4 + (draws // 128) * 128, draws % 128), expected)
        # an unaligned start (offset % 4 != 0) skips words of the first block, as curand_init's
        assert torch.equal(philox.curand_draws(seed, 0, base * 4 + 1, draws[:-1]), expected[1:])


def test_known_answer_and_subsequence():
    # Random123's published known-answer vector for philox4x32-10: counter and key all ones
    ones = 0xFFFFFFFF
    words = [int(w) for w in philox.philox4x32(ones, ones, ones, ones, ones, ones)]
    assert words == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    words = [int(w) for w in philox.philox4x32(0xA4093822, 0x299F31D0, 0x243F6A88, 0x85A308D3, 0x13198A2E,
                                               0x03707344)]
    assert words == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    # subsequence s starts the counter at s * 2**64: its words 2 and 3
    a = philox.curand_draws(7, 3, 0, torch.arange(4))
    assert torch.equal(a, torch.stack(philox.philox4x32(7, 0, 0, 0, 3, 0), -1))
