"""FP8 (e4m3) GEMM with per-tensor scales and fp16 output, in TileLang's lazy style.

`C = (A @ B^T) * scale_a * scale_b` for A (M, K) and B (N, K), both K-major as FP8 wgmma wants
them.  FP8 wgmma accumulates with reduced precision over a long K; as cuBLASLt and DeepGEMM do,
the kernel promotes: the tensor cores accumulate `promote_every` k-steps into a partial
fragment, which is then added into a float32 accumulator in registers and cleared.  The scales
arrive as a 2-element float32 tensor.  Runs on CUDA when available, else on the CPU reference
interpreter with small sizes.  Run: ``python examples/gemm_fp8.py``.

Promoting every k-step, the tensor cores would wait for the CUDA cores' additions after each
step.  ``overlap_promotion`` (with ``promote_every=1``) splits each warpgroup's work in two wgmma
groups issued back to back, each into its own partial, and adds the first partial while the
second group runs:
* ``"k_pairs"``: the k-steps in pairs (steps 2k and 2k+1, each in its own tiles; a ring slot
  holds a pair);
* ``"n_halves"``: each k-step as its two halves of the tile's columns (two n/2 wgmmas);
* ``"n_pieces"``: each k-step as ``pieces`` gemms over the tile's columns through ``partials``
  fragments in turn (``n_halves`` is 2 and 2; 1 and 1 is DeepGEMM's form; 2 and 1 holds a
  128x256 tile in three 64-register accumulators), also with ``promote_every`` > 1.
Each adds the same partials in the same order as ``promote_every=1`` (bit-identical results).
bench/NOTES.md (issue #19) has the generated schedules and their register budgets.
"""
import torch

import tritile
import tritile.language as T


@T.macro
def promote(total, partial, rows, cols):
    """total += partial: the tensor cores' partial sum added in float32."""
    for i, j in T.Parallel(rows, cols):
        total[i, j] += partial[i, j]


@T.macro
def store_scaled(total, C, Scales, row, col, rows, cols):
    """C[row:, col:] = total * scale_a * scale_b, the output tile in fp16."""
    for i, j in T.Parallel(rows, cols):
        total[i, j] = total[i, j] * (Scales[0] * Scales[1])
    T.copy(total, C[row, col])


@tritile.jit(out_idx=[3])
def gemm_fp8(M, N, K, block_M=128, block_N=128, block_K=128, num_stages=3, threads=256, promote_every=4,
             overlap_promotion=None, pieces=2, partials=2, panel_size=10):
    in_dtype, accum_dtype, out_dtype = "float8_e4m3", "float", "float16"
    if overlap_promotion is not None:
        if overlap_promotion not in OVERLAPPED:
            raise ValueError(f"overlap_promotion must be one of {sorted(OVERLAPPED)} or None, "
                             f"not {overlap_promotion!r}")
        tiles = (M, N, K, block_M, block_N, block_K, num_stages, threads)
        if overlap_promotion == "n_pieces":
            return _n_pieces(*tiles, pieces, partials, promote_every, panel_size=panel_size)
        if (pieces, partials) != (2, 2):
            raise ValueError(f"pieces and partials are overlap_promotion='n_pieces' settings, not "
                             f"{overlap_promotion!r}'s (pieces={pieces!r}, partials={partials!r})")
        if promote_every != 1:
            raise ValueError(f"overlap_promotion={overlap_promotion!r} promotes every k-step: promote_every must be "
                             f"1, not {promote_every}")
        return OVERLAPPED[overlap_promotion](*tiles, panel_size=panel_size)

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K), in_dtype), Scales: T.Tensor((2,), "float32"),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), in_dtype)
            B_shared = T.alloc_shared((block_N, block_K), in_dtype)
            partial = T.alloc_fragment((block_M, block_N), accum_dtype)
            total = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=panel_size)
            T.clear(partial)
            T.clear(total)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, partial, transpose_B=True)
                if (k + 1) % promote_every == 0:  # promote the tensor cores' partial sum to float32
                    promote(total, partial, block_M, block_N)
                    T.clear(partial)
            for i, j in T.Parallel(block_M, block_N):
                total[i, j] = (total[i, j] + partial[i, j]) * (Scales[0] * Scales[1])
            T.copy(total, C[by * block_M, bx * block_N])

    return main


def _k_pairs(M, N, K, block_M, block_N, block_K, num_stages, threads, panel_size=10):
    """Promotion every k-step, the k-steps in pairs: each pipelined iteration loads steps 2k and
    2k+1 into their own tiles, runs each into its own partial (cleared by its gemm: no register
    clear), then promotes the even partial - pipeline injection retires only the even gemm
    before it (``wait(1)``), so it runs under the odd step's wgmma - and the odd one.  An odd
    number of k-steps leaves the last odd tile past K: its load fills zeros, its partial adds 0.
    A ring slot holds a pair: ``num_stages=2`` keeps four k-steps in shared memory."""
    in_dtype, accum_dtype, out_dtype = "float8_e4m3", "float", "float16"

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K), in_dtype), Scales: T.Tensor((2,), "float32"),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_even = T.alloc_shared((block_M, block_K), in_dtype)
            B_even = T.alloc_shared((block_N, block_K), in_dtype)
            A_odd = T.alloc_shared((block_M, block_K), in_dtype)
            B_odd = T.alloc_shared((block_N, block_K), in_dtype)
            partial_even = T.alloc_fragment((block_M, block_N), accum_dtype)
            partial_odd = T.alloc_fragment((block_M, block_N), accum_dtype)
            total = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=panel_size)
            T.clear(total)
            for k in T.Pipelined(T.ceildiv(K, 2 * block_K), num_stages=num_stages):
                T.copy(A[by * block_M, 2 * k * block_K], A_even)
                T.copy(B[bx * block_N, 2 * k * block_K], B_even)
                T.copy(A[by * block_M, (2 * k + 1) * block_K], A_odd)
                T.copy(B[bx * block_N, (2 * k + 1) * block_K], B_odd)
                T.clear(partial_even)
                T.gemm(A_even, B_even, partial_even, transpose_B=True)
                T.clear(partial_odd)
                T.gemm(A_odd, B_odd, partial_odd, transpose_B=True)
                promote(total, partial_even, block_M, block_N)  # under the odd step's wgmma
                promote(total, partial_odd, block_M, block_N)
            store_scaled(total, C, Scales, by * block_M, bx * block_N, block_M, block_N)

    return main


def _n_pieces(M, N, K, block_M, block_N, block_K, num_stages, threads, pieces=2, partials=2, promote_every=1,
              panel_size=10):
    """Promotion every k-step, each k-step as `pieces` gemms over equal column pieces of the tile
    (B's rows), each promoted into its own total; the pieces' partials take `partials` fragments
    in turn.  Piece p's gemm (cleared by the wgmma: no register clear) is issued once the piece
    before it in the same fragment was added, so with two fragments a piece's promotion runs
    under the next piece's wgmma: pipeline injection retires the groups one at a time
    (``wait(1)``).  `pieces=2, partials=2` is ``"n_halves"``; `pieces=1, partials=1` is
    DeepGEMM's form (only the other warpgroup's wgmmas run under a promotion); `pieces=2,
    partials=1` holds a 128x256 tile in 192 registers a thread (a warpgroup's 64x128 partial and
    two totals).  `pieces=4, partials=2` would too, but ptxas gives each cleared n64 wgmma fresh
    registers and issues it early: four partials live, spills (bench/NOTES.md, session 21).  The ring is the plain one (one k-step a slot);
    narrower wgmmas read each warpgroup's A rows from shared memory once per piece.
    `promote_every` > 1 (each piece its own partial) accumulates that many k-steps into the
    partials before promoting them all (cleared by register moves), as the default program does:
    fewer additions, less accurate."""
    if not isinstance(pieces, int) or pieces < 1 or block_N % pieces:
        raise ValueError(f"pieces must be a positive divisor of block_N={block_N}, not {pieces!r}")
    if not isinstance(partials, int) or not 1 <= partials <= pieces:
        raise ValueError(f"partials must be an int from 1 to pieces={pieces}, not {partials!r}")
    if promote_every != 1 and partials != pieces:
        raise ValueError(f"promote_every={promote_every} keeps each piece's partial over k-steps: partials must be "
                         f"pieces={pieces}, not {partials}")
    in_dtype, accum_dtype, out_dtype = "float8_e4m3", "float", "float16"
    width = block_N // pieces
    order = list(range(pieces))  # a Python list: the frontend unrolls the loops over it

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K), in_dtype), Scales: T.Tensor((2,), "float32"),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), in_dtype)
            B_shared = T.alloc_shared((block_N, block_K), in_dtype)
            partial = [T.alloc_fragment((block_M, width), accum_dtype) for _ in order[:partials]]
            total = [T.alloc_fragment((block_M, width), accum_dtype) for _ in order]
            T.use_swizzle(panel_size=panel_size)
            for piece in order:
                T.clear(total[piece])
                if promote_every != 1:
                    T.clear(partial[piece])
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                if promote_every != 1:
                    for q in order:
                        T.gemm(A_shared, B_shared[q * width:(q + 1) * width, :], partial[q], transpose_B=True)
                    if (k + 1) % promote_every == 0:  # one `if`: one per piece made ptxas serialize (C7514)
                        for r in order:
                            promote(total[r], partial[r], block_M, width)
                            T.clear(partial[r])
                else:
                    for p in order:
                        if p >= partials:  # the fragment's previous piece, added under piece p-1's wgmma
                            promote(total[p - partials], partial[p % partials], block_M, width)
                        T.clear(partial[p % partials])  # the wgmma clears it
                        T.gemm(A_shared, B_shared[p * width:(p + 1) * width, :], partial[p % partials],
                               transpose_B=True)
                    for last in order[pieces - partials:]:
                        promote(total[last], partial[last % partials], block_M, width)
            if promote_every != 1:  # the k-steps after the last promotion
                for piece in order:
                    promote(total[piece], partial[piece], block_M, width)
            for i, j in T.Parallel(block_M, width):  # all pieces in one loop (the measured program)
                for t in total:
                    t[i, j] = t[i, j] * (Scales[0] * Scales[1])
            for piece in order:
                T.copy(total[piece], C[by * block_M, bx * block_N + piece * width])

    return main


OVERLAPPED = {"k_pairs": _k_pairs, "n_halves": _n_pieces, "n_pieces": _n_pieces}  # n_halves: 2 pieces, 2 partials


# session 19's CUDA tiles (bench/NOTES.md): 128x128x128 on two warpgroups, each k-step as two
# half-width gemms (`overlap_promotion="n_halves"`: one half's partial is added while the other
# half's wgmmas run), five stages - 1124 / 1062 TFLOP/s at 4096³ / 8192³ in session 21's sweep
TILE_128X128_HALVES = dict(block_M=128, block_N=128, block_K=128, num_stages=5, threads=256, promote_every=1,
                           overlap_promotion="n_halves")


def tile_config(device_type: str) -> dict:
    """Small tiles for the CPU interpreter; on CUDA 128x256x128 tiles on two warpgroups,
    promoting every k-step (every 128 of K, DeepGEMM's interval: the only setting as accurate as
    cuBLASLt on the H100), each k-step as two column pieces of 64x128 a warpgroup through one
    partial (`overlap_promotion="n_pieces", pieces=2, partials=1`: a warpgroup holds its 64x256
    total in two 64-register fragments and one partial; ptxas moves half of a piece's additions
    under the next piece's wgmmas), four stages.  bench/NOTES.md, session 21 (do_bench, the
    variants interleaved): 1263 / 1210 TFLOP/s at 4096³ / 8192³ (1.008x / 0.955x cuBLASLt's
    1253 / 1267; TileLang 1110 / 1186) with cuBLASLt's error (4.37e-4 / 3.43e-4 of max |C|),
    against 1124 / 1062 for `TILE_128X128_HALVES` and 1129 / 1110 for the 128x256 tile on three
    stages."""
    if device_type != "cuda":
        return dict(block_M=32, block_N=32, block_K=32, num_stages=1, threads=128, promote_every=2)
    return dict(block_M=128, block_N=256, block_K=128, num_stages=4, threads=256, promote_every=1,
                overlap_promotion="n_pieces", pieces=2, partials=1)


def quantize(x: torch.Tensor) -> tuple:
    """(x / scale as e4m3, scale) with the per-tensor scale that maps max |x| to e4m3's 448."""
    scale = x.abs().max().float().clamp(min=1e-12) / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def tritile_gemm_fp8(a8, b8, scale_a, scale_b) -> torch.Tensor:
    """(a8 @ b8^T) * scale_a * scale_b in fp16, for e4m3 a8 (M, K) and b8 (N, K)."""
    (M, K), N = a8.shape, b8.shape[0]
    scales = torch.stack([scale_a.float().reshape(()), scale_b.float().reshape(())])
    return gemm_fp8(M, N, K, **tile_config(a8.device.type))(a8, b8, scales)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    M, N, K = (1024, 1024, 4096) if device == "cuda" else (64, 64, 128)
    a8, scale_a = quantize(torch.randn(M, K, device=device))
    b8, scale_b = quantize(torch.randn(N, K, device=device))
    c = tritile_gemm_fp8(a8, b8, scale_a, scale_b)
    exact = (a8.double() @ b8.double().t()) * (scale_a.double() * scale_b.double())  # of the same fp8 values
    error = ((c.double() - exact).abs().max() / exact.abs().max()).item()
    print(f"gemm fp8 e4m3 {M}x{N}x{K} on {device}: max |tritile - torch| / max |C| = {error:.3e}")
    torch.testing.assert_close(c.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())
    print("All checks passed.")


if __name__ == "__main__":
    main()
