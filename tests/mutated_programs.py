"""Mutated T programs for tests/test_mutated_programs.py and bench/mutant_replay.py: five base
kernels (a pipelined GEMM, a row softmax, a transposing copy, a FlashAttention loop, a column sum
by atomics), two more scheduled ones (`SCHEDULED_BASES`: a warp-specialized persistent GEMM
with a fused epilogue, a split-K GEMM), the library's attention kernels (`LIBRARY_BASES`: the
FlashAttention backward, GQA decoding's split and combine), two of runtime dims
(`DYNAMIC_BASES`: a GEMM, an RMS norm) and an FP8 GEMM (`FP8_BASES`), each mutant one of them
with one line of its kernel changed - a number, a buffer, a dtype, a flag, two arguments
swapped, the line removed (`mutate`; `mutants(seed, count)` a seeded list of distinct ones).

A mutant is a program, not necessarily a meaningful one: where it compiles, `interpreted` runs
it on the reference interpreter (blocks in launch order and reversed, TRITILE_BLOCK_ORDER) and
says whether its result is defined - not when its blocks race, when it reads memory nothing
wrote (the interpreter's fresh on-chip buffers hold NaN; and a run with finite garbage there,
which a max or min cannot swallow) or when it depends on integer lanes divided by zero (a run
with other quotients) - so that a backend's result can be held to it (`agree`).
"""
from __future__ import annotations

import importlib.util
import os
import random
import re
from unittest import mock

import torch

from tritile.interpreter import expressions as interpreter_expressions
from tritile.interpreter import values as interpreter_values

BASES = {
    "gemm": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 128), T.float16), B: T.Tensor((128, 192), T.float16), C: T.Tensor((256, 192), T.float16)):
        with T.Kernel(T.ceildiv(192, 64), T.ceildiv(256, 128), threads=128) as (bx, by):
            A_shared = T.alloc_shared((128, 32), T.float16)
            B_shared = T.alloc_shared((32, 64), T.float16)
            C_local = T.alloc_fragment((128, 64), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(128, 32), num_stages=3):
                T.copy(A[by * 128, k * 32], A_shared)
                T.copy(B[k * 32, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 128, bx * 64])
    return kernel
''',
    "softmax": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(X: T.Tensor((128, 256), T.float32), Y: T.Tensor((128, 256), T.float32)):
        with T.Kernel(T.ceildiv(128, 16), threads=128) as bx:
            x = T.alloc_fragment((16, 256), T.float32)
            m = T.alloc_fragment((16,), T.float32)
            s = T.alloc_fragment((16,), T.float32)
            T.copy(X[bx * 16, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(16, 256):
                x[i, j] = T.exp(x[i, j] - m[i])
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(16, 256):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * 16, 0])
    return kernel
''',
    "transpose": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((64, 96), T.float16), B: T.Tensor((96, 64), T.float16)):
        with T.Kernel(T.ceildiv(96, 32), T.ceildiv(64, 32), threads=128) as (bx, by):
            tile = T.alloc_shared((32, 32), T.float16)
            out = T.alloc_fragment((32, 32), T.float16)
            T.copy(A[by * 32, bx * 32], tile)
            for i, j in T.Parallel(32, 32):
                out[i, j] = tile[j, i] * 2
            T.copy(out, B[bx * 32, by * 32])
    return kernel
''',
    "attention": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(Q: T.Tensor((1, 2, 128, 64), T.float16), K: T.Tensor((1, 2, 128, 64), T.float16),
               V: T.Tensor((1, 2, 128, 64), T.float16), O: T.Tensor((1, 2, 128, 64), T.float16)):
        with T.Kernel(T.ceildiv(128, 64), 2, 1, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared((64, 64), T.float16)
            K_shared = T.alloc_shared((64, 64), T.float16)
            V_shared = T.alloc_shared((64, 64), T.float16)
            S = T.alloc_fragment((64, 64), T.float32)
            P = T.alloc_fragment((64, 64), T.float16)
            acc = T.alloc_fragment((64, 64), T.float32)
            m = T.alloc_fragment((64,), T.float32)
            m_prev = T.alloc_fragment((64,), T.float32)
            l = T.alloc_fragment((64,), T.float32)
            rs = T.alloc_fragment((64,), T.float32)
            T.copy(Q[bz, by, bx * 64:(bx + 1) * 64, :], Q_shared)
            T.fill(acc, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(T.float32))
            for k in T.Pipelined(T.ceildiv(128, 64), num_stages=2):
                T.copy(K[bz, by, k * 64:(k + 1) * 64, :], K_shared)
                T.clear(S)
                T.gemm(Q_shared, K_shared, S, transpose_B=True)
                T.copy(m, m_prev)
                T.reduce_max(S, m, dim=1, clear=False)
                for i, j in T.Parallel(64, 64):
                    S[i, j] = T.exp2(S[i, j] * 0.18 - m[i] * 0.18)
                for i in T.Parallel(64):
                    rs[i] = T.exp2(m_prev[i] * 0.18 - m[i] * 0.18)
                for i, j in T.Parallel(64, 64):
                    acc[i, j] *= rs[i]
                T.reduce_sum(S, l, dim=1, clear=False)
                T.copy(S, P)
                T.copy(V[bz, by, k * 64:(k + 1) * 64, :], V_shared)
                T.gemm(P, V_shared, acc)
            for i, j in T.Parallel(64, 64):
                acc[i, j] /= l[i]
            T.copy(acc, O[bz, by, bx * 64:(bx + 1) * 64, :])
    return kernel
''',
    "column_sum": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 64), T.float32), S: T.Tensor((64,), T.float32)):
        with T.Kernel(T.ceildiv(256, 32), threads=128) as bx:
            tile = T.alloc_fragment((32, 64), T.float32)
            col = T.alloc_fragment((64,), T.float32)
            T.copy(A[bx * 32, 0], tile)
            T.reduce_sum(tile, col, dim=0)
            for j in T.Parallel(64):
                T.atomic_add(S[j], col[j])
    return kernel
''',
}
# kernels the passes schedule further, in lists of their own (`mutants(..., SCHEDULED_BASES)`) so
# that the seeded lists of `BASES`, which replays recorded by index, stay what they were: a GEMM of
# 256 threads (a producer warp, persistent tiles) whose fused epilogue is stored through shared
# memory by TMA, and a split-K GEMM adding its tiles by one TMA reduce each
SCHEDULED_BASES = {
    "gemm_epilogue": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 256), T.float16), B: T.Tensor((256, 256), T.float16), Bias: T.Tensor((256,), T.float16),
               C: T.Tensor((256, 256), T.float16)):
        with T.Kernel(T.ceildiv(256, 128), T.ceildiv(256, 128), threads=256) as (bx, by):
            A_shared = T.alloc_shared((128, 64), T.float16)
            B_shared = T.alloc_shared((64, 128), T.float16)
            C_shared = T.alloc_shared((128, 128), T.float16)
            C_local = T.alloc_fragment((128, 128), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(256, 64), num_stages=3):
                T.copy(A[by * 128, k * 64], A_shared)
                T.copy(B[k * 64, bx * 128], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(128, 128):
                C_local[i, j] = T.max(C_local[i, j] + Bias[bx * 128 + j], 0)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * 128, bx * 128])
    return kernel
''',
    "split_k": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((128, 256), T.float16), B: T.Tensor((256, 128), T.float16), C: T.Tensor((128, 128), T.float32)):
        with T.Kernel(T.ceildiv(128, 64), T.ceildiv(128, 64), 4, threads=128) as (bx, by, bz):
            A_shared = T.alloc_shared((64, 32), T.float16)
            B_shared = T.alloc_shared((32, 64), T.float16)
            C_local = T.alloc_fragment((64, 64), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(2, num_stages=2):
                T.copy(A[by * 64, bz * 64 + k * 32], A_shared)
                T.copy(B[bz * 64 + k * 32, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.atomic_add(C[by * 64, bx * 64], C_local)
    return kernel
''',
}
# the library's attention kernels, a list of their own again (`LIBRARY_BASES`): the FlashAttention
# backward (tritile/ops/attention.py: 256 threads, K Q^T and V dO^T from shared memory, dV and dK
# by register operands, dQ by dS^T from shared memory and one tile atomic a step) and the two
# kernels of GQA decoding by splits (examples/flash_decoding.py: a split's key range and trip
# count clamped by the cache's end, keys past it masked, only the group's rows stored; the
# combine of the splits' partials in split order)
LIBRARY_BASES = {
    "attention_bwd": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(Q: T.Tensor((1, 2, 256, 64), T.float16), K: T.Tensor((1, 2, 256, 64), T.float16),
               V: T.Tensor((1, 2, 256, 64), T.float16), dO: T.Tensor((1, 2, 256, 64), T.float16),
               LSE: T.Tensor((1, 2, 256), T.float32), Delta: T.Tensor((1, 2, 256), T.float32),
               dQ: T.Tensor((1, 2, 256, 64), T.float32), dK: T.Tensor((1, 2, 256, 64), T.float16),
               dV: T.Tensor((1, 2, 256, 64), T.float16)):
        with T.Kernel(T.ceildiv(256, 128), 2, 1, threads=256) as (bx, by, bz):
            K_shared = T.alloc_shared((128, 64), T.float16)
            V_shared = T.alloc_shared((128, 64), T.float16)
            q_shared = T.alloc_shared((64, 64), T.float16)
            do_shared = T.alloc_shared((64, 64), T.float16)
            lse_shared = T.alloc_shared((64,), T.float32)
            delta_shared = T.alloc_shared((64,), T.float32)
            dsT_shared = T.alloc_shared((128, 64), T.float16)
            qkT = T.alloc_fragment((128, 64), T.float32)
            dpT = T.alloc_fragment((128, 64), T.float32)
            pT_cast = T.alloc_fragment((128, 64), T.float16)
            dsT_cast = T.alloc_fragment((128, 64), T.float16)
            dv_local = T.alloc_fragment((128, 64), T.float32)
            dk_local = T.alloc_fragment((128, 64), T.float32)
            dq_local = T.alloc_fragment((64, 64), T.float32)
            T.copy(K[bz, by, bx * 128:(bx + 1) * 128, :], K_shared)
            T.copy(V[bz, by, bx * 128:(bx + 1) * 128, :], V_shared)
            T.clear(dv_local)
            T.clear(dk_local)
            for j in T.Pipelined(T.ceildiv(256, 64), num_stages=2):
                T.copy(Q[bz, by, j * 64:(j + 1) * 64, :], q_shared)
                T.clear(qkT)
                T.gemm(K_shared, q_shared, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(LSE[bz, by, j * 64:(j + 1) * 64], lse_shared)
                for i, jj in T.Parallel(128, 64):
                    qkT[i, jj] = T.exp2(qkT[i, jj] * 0.02 - lse_shared[jj])
                T.copy(dO[bz, by, j * 64:(j + 1) * 64, :], do_shared)
                T.clear(dpT)
                T.gemm(V_shared, do_shared, dpT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, pT_cast)
                T.gemm(pT_cast, do_shared, dv_local, policy=T.GemmWarpPolicy.FullRow)
                T.copy(Delta[bz, by, j * 64:(j + 1) * 64], delta_shared)
                for i, jj in T.Parallel(128, 64):
                    dsT_cast[i, jj] = qkT[i, jj] * (dpT[i, jj] - delta_shared[jj]) * 0.01
                T.copy(dsT_cast, dsT_shared)
                T.clear(dq_local)
                T.gemm(dsT_shared, K_shared, dq_local, transpose_A=True)
                T.gemm(dsT_cast, q_shared, dk_local, policy=T.GemmWarpPolicy.FullRow)
                T.atomic_add(dQ[bz, by, j * 64:(j + 1) * 64, :], dq_local)
            T.copy(dv_local, dV[bz, by, bx * 128:(bx + 1) * 128, :])
            T.copy(dk_local, dK[bz, by, bx * 128:(bx + 1) * 128, :])
    return kernel
''',
    "decode_split": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(Q: T.Tensor((2, 8, 64), T.float16), K: T.Tensor((2, 2, 200, 64), T.float16),
               V: T.Tensor((2, 2, 200, 64), T.float16), O_partial: T.Tensor((2, 8, 2, 64), T.float32),
               LSE_partial: T.Tensor((2, 8, 2), T.float32)):
        with T.Kernel(2, 2, 2, threads=128) as (sid, hid, bid):
            Q_shared = T.alloc_shared((64, 64), T.float16)
            K_shared = T.alloc_shared((64, 64), T.float16)
            V_shared = T.alloc_shared((64, 64), T.float16)
            acc_s = T.alloc_fragment((64, 64), T.float32)
            acc_s_cast = T.alloc_fragment((64, 64), T.float16)
            acc_o = T.alloc_fragment((64, 64), T.float32)
            scores_max = T.alloc_fragment((64,), T.float32)
            scores_max_prev = T.alloc_fragment((64,), T.float32)
            scores_scale = T.alloc_fragment((64,), T.float32)
            scores_sum = T.alloc_fragment((64,), T.float32)
            logsum = T.alloc_fragment((64,), T.float32)
            T.copy(Q[bid, hid * 4:hid * 4 + 64, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(T.float32))
            for k in T.Pipelined(T.ceildiv(T.min(128, 200 - sid * 128), 64), num_stages=2):
                T.copy(K[bid, hid, sid * 128 + k * 64:sid * 128 + (k + 1) * 64, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(64, 64):
                    acc_s[i, j] = T.if_then_else(sid * 128 + k * 64 + j < 200, acc_s[i, j], -T.infinity(T.float32))
                T.copy(scores_max, scores_max_prev)
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(64):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * 0.18 - scores_max[i] * 0.18)
                for i, j in T.Parallel(64, 64):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * 0.18 - scores_max[i] * 0.18)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(64):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(64, 64):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bid, hid, sid * 128 + k * 64:sid * 128 + (k + 1) * 64, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(64, 64):
                if i < 4:
                    O_partial[bid, hid * 4 + i, sid, j] = acc_o[i, j] / logsum[i]
            for i in T.Parallel(64):
                if i < 4:
                    LSE_partial[bid, hid * 4 + i, sid] = T.log2(logsum[i]) + scores_max[i] * 0.18
    return kernel
''',
    "decode_combine": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(O_partial: T.Tensor((2, 8, 4, 64), T.float32), LSE_partial: T.Tensor((2, 8, 4), T.float32),
               Output: T.Tensor((2, 8, 64), T.float16)):
        with T.Kernel(8, 2, threads=128) as (hid, bid):
            weights = T.alloc_fragment((1, 4), T.float32)
            lse_max = T.alloc_fragment((1,), T.float32)
            weight_sum = T.alloc_fragment((1,), T.float32)
            out = T.alloc_fragment((1, 64), T.float32)
            for h, s in T.Parallel(1, 4):
                weights[h, s] = LSE_partial[bid, hid + h, s]
            T.reduce_max(weights, lse_max, dim=1)
            for h, s in T.Parallel(1, 4):
                weights[h, s] = T.exp2(weights[h, s] - lse_max[h])
            T.reduce_sum(weights, weight_sum, dim=1)
            T.clear(out)
            for s in T.unroll(4):
                for h, j in T.Parallel(1, 64):
                    out[h, j] += O_partial[bid, hid + h, s, j] * T.exp2(LSE_partial[bid, hid + h, s] - lse_max[h])
            for h, j in T.Parallel(1, 64):
                out[h, j] /= weight_sum[h]
            T.copy(out, Output[bid, hid:hid + 1, :])
    return kernel
''',
}
# kernels of runtime dims (`T.dynamic`), a list of their own again (`DYNAMIC_BASES`), run at the
# sizes `DYNAMIC_SIZES`: TileLang's dynamic-shape GEMM (examples/dynamic_shape: the launch picks a
# variant by which dims are multiples of 16 - here n and k are, m is not) and an RMS norm over a
# runtime number of rows
DYNAMIC_BASES = {
    "gemm_dynamic": '''
import tritile.language as T

def make():
    M, N, K = T.dynamic("m, n, k")

    @T.prim_func
    def kernel(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 128), threads=128) as (bx, by):
            A_shared = T.alloc_shared((128, 32), T.float16)
            B_shared = T.alloc_shared((32, 64), T.float16)
            C_local = T.alloc_fragment((128, 64), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=3):
                T.copy(A[by * 128, k * 32], A_shared)
                T.copy(B[k * 32, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 128, bx * 64])
    return kernel
''',
    "rms_norm_dynamic": '''
import tritile.language as T

def make():
    M = T.dynamic("m")

    @T.prim_func
    def kernel(X: T.Tensor((M, 256), T.float32), W: T.Tensor((256,), T.float32), Y: T.Tensor((M, 256), T.float16)):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            x_local = T.alloc_fragment((16, 256), T.float32)
            sq_local = T.alloc_fragment((16, 256), T.float32)
            s_local = T.alloc_fragment((16,), T.float32)
            T.copy(X[bx * 16, 0], x_local)
            for i, j in T.Parallel(16, 256):
                sq_local[i, j] = x_local[i, j] * x_local[i, j]
            T.reduce_sum(sq_local, s_local, dim=1)
            for i in T.Parallel(16):
                s_local[i] = T.rsqrt(s_local[i] / 256 + 1e-6)
            for i, j in T.Parallel(16, 256):
                x_local[i, j] = x_local[i, j] * s_local[i] * W[j]
            T.copy(x_local, Y[bx * 16, 0])
    return kernel
''',
}
DYNAMIC_SIZES = {"m": 200, "n": 144, "k": 80}
# the FP8 GEMM of examples/gemm_fp8.py (wgmma of fp8 operands, B K-major, the partial sums
# promoted to float32 every two k-steps, a swizzled tile order), a list of its own again
# (`FP8_BASES`)
FP8_BASES = {
    "gemm_fp8": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 512), T.float8_e4m3), B: T.Tensor((256, 512), T.float8_e4m3),
               Scales: T.Tensor((2,), T.float32), C: T.Tensor((256, 256), T.float16)):
        with T.Kernel(T.ceildiv(256, 128), T.ceildiv(256, 128), threads=256) as (bx, by):
            A_shared = T.alloc_shared((128, 128), T.float8_e4m3)
            B_shared = T.alloc_shared((128, 128), T.float8_e4m3)
            partial_local = T.alloc_fragment((128, 128), T.float32)
            total_local = T.alloc_fragment((128, 128), T.float32)
            T.use_swizzle(panel_size=2)
            T.clear(partial_local)
            T.clear(total_local)
            for k in T.Pipelined(T.ceildiv(512, 128), num_stages=3):
                T.copy(A[by * 128, k * 128], A_shared)
                T.copy(B[bx * 128, k * 128], B_shared)
                T.gemm(A_shared, B_shared, partial_local, transpose_B=True)
                if (k + 1) % 2 == 0:
                    for i, j in T.Parallel(128, 128):
                        total_local[i, j] += partial_local[i, j]
                    T.clear(partial_local)
            for i, j in T.Parallel(128, 128):
                total_local[i, j] = (total_local[i, j] + partial_local[i, j]) * (Scales[0] * Scales[1])
            T.copy(total_local, C[by * 128, bx * 128])
    return kernel
''',
}
DTYPES = ["T.float16", "T.float32", "T.bfloat16", "T.int8", "T.int32", "T.float8_e4m3", "T.float64", "T.bool"]
NUMBERS = ["0", "1", "2", "3", "7", "16", "17", "33", "48", "100", "1000", "-1", "-16", "4096"]
MUTATIONS = ["number", "number", "name", "name", "dtype", "delete", "swap", "flag"]


def mutate(src: str, rng: random.Random):
    """`src` with one line of its kernel body changed, or None where the drawn change does not apply."""
    lines = src.split("\n")
    i = rng.choice([k for k, line in enumerate(lines) if line.startswith("        ") and line.strip()])
    line, kind = lines[i], rng.choice(MUTATIONS)
    if kind == "number":
        numbers = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", line))
        if numbers:
            m = rng.choice(numbers)
            line = line[:m.start()] + rng.choice(NUMBERS) + line[m.end():]
    elif kind == "name":
        names = sorted(set(re.findall(r"\b([A-Z][A-Za-z_]*|[a-z_]+(?:_shared|_local|_prev))\b", src)) - {"T"})
        present = [n for n in names if re.search(rf"\b{n}\b", line)]
        if present:
            line = re.sub(rf"\b{rng.choice(present)}\b", rng.choice(names), line, count=1)
    elif kind == "dtype":
        found = [d for d in DTYPES if d in line]
        if found:
            line = line.replace(rng.choice(found), rng.choice(DTYPES), 1)
    elif kind == "delete":
        if not line.rstrip().endswith(":"):
            line = line[:len(line) - len(line.lstrip())] + "pass"
    elif kind == "swap":
        m = re.search(r"T\.(copy|gemm)\((\w+(?:\[[^\]]*\])?), (\w+(?:\[[^\]]*\])?)", line)
        if m:
            line = line[:m.start(2)] + m.group(3) + ", " + m.group(2) + line[m.end(3):]
    elif "transpose_B=True" in line:
        line = line.replace("transpose_B=True", "transpose_A=True")
    elif "T.gemm(" in line:
        line = line.replace(")", ", transpose_B=True)", 1)
    elif "dim=1" in line:
        line = line.replace("dim=1", rng.choice(["dim=0", "dim=2", "dim=-1"]))
    if line == lines[i]:
        return None
    lines[i] = line
    return "\n".join(lines)


def mutants(seed: int, count: int, bases: dict = BASES) -> list:
    """`count` distinct mutants [(base name, source)] of `bases`, drawn with a Random seeded by `seed`."""
    rng, found = random.Random(seed), {}
    while len(found) < count:
        base = rng.choice(sorted(bases))
        src = mutate(bases[base], rng)
        if src is not None:
            found.setdefault(src, base)
    return [(base, src) for src, base in found.items()]


def load(src: str, path: str):
    """The `make` of mutant `src`, written to `path` (the file its errors quote), or None where
    it is no longer Python that runs (a removed line left a name undefined: Python's own error)."""
    with open(path, "w") as f:
        f.write(src)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - any error of the user's own Python
        return None
    return module.make


def random_arguments(func, gen: torch.Generator) -> list:
    """Fresh random tensors for every parameter of `func`, outputs included; a runtime dim
    (`T.dynamic`) takes its size from `DYNAMIC_SIZES` (any other name: 96)."""
    out = []
    for param in func.params:
        shape = [d if isinstance(d, int) else DYNAMIC_SIZES.get(getattr(d, "name", ""), 96) for d in param.shape]
        dtype = param.dtype.torch
        if dtype.is_floating_point:
            out.append((torch.randn(shape, generator=gen) * 2).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.rand(shape, generator=gen) > 0.5)
        else:
            out.append(torch.randint(-20, 20, shape, generator=gen).to(dtype))
    return out


def interpreted(kernel, args: list):
    """(why the result is undefined or None, the arguments after `kernel` ran on the interpreter
    on copies of `args` in launch order; scalar arguments are passed as they are).  `kernel` must
    be compiled with ``target="cpu", backend="auto"``: the triton backend (``TRITILE_BACKEND=triton``
    too) runs CPU tensors through Triton's interpreter, which `TRITILE_BLOCK_ORDER` does not
    reverse - its racing mutants would pass as defined.  Four runs: in launch order, blocks
    reversed, finite garbage in fresh on-chip buffers, and other quotients of integer lanes
    divided by zero (an unspecified value, docs/semantics.md: `x / 256` of an int8 x divides by
    the literal wrapped to 0)."""
    if kernel.backend == "triton":
        raise ValueError("interpreted() needs tritile's interpreter: compile with backend='auto'")
    forward, backward, other_garbage, other_quotients = ([t.clone() if isinstance(t, torch.Tensor) else t for t in args]
                                                         for _ in range(4))
    kernel(*forward)
    with mock.patch.dict(os.environ, {"TRITILE_BLOCK_ORDER": "reversed"}):
        kernel(*backward)
    with mock.patch.object(interpreter_values, "allocate", _finite_garbage):
        kernel(*other_garbage)
    with mock.patch.object(interpreter_expressions, "_int_division", _other_quotients):
        kernel(*other_quotients)
    runs = [(x, y, z, w) for x, y, z, w in zip(forward, backward, other_garbage, other_quotients)
            if isinstance(x, torch.Tensor)]
    if not all(agree(x, y) for x, y, _, _ in runs):
        return "its blocks race", forward
    if any(x.dtype.is_floating_point and bool(x.isnan().any()) for x, _, _, _ in runs):
        return "it reads memory nothing wrote", forward
    if not all(agree(x, z) for x, _, z, _ in runs):  # a NaN a max swallowed: relu(unwritten + b) is 0
        return "it reads memory nothing wrote", forward
    if not all(agree(x, w) for x, _, _, w in runs):
        return "it divides integers by zero", forward
    return None, forward


_int_division = interpreter_expressions._int_division


def _other_quotients(a, b, rounding_mode):
    """`expressions._int_division` with other results where a lane divides by zero: quotient 0
    (what numpy and Triton's interpreter give; 1 where a is 0: never a), remainder 1."""
    quotient, remainder = _int_division(a, b, rounding_mode)
    zero = torch.as_tensor(b) == 0
    other = (torch.as_tensor(a) == 0).to(quotient.dtype)
    quotient = torch.where(zero, other, quotient)
    return quotient, torch.where(zero, torch.ones((), dtype=remainder.dtype), remainder)


def _finite_garbage(shape: tuple, dtype) -> torch.Tensor:
    """A fresh on-chip buffer of the interpreter (`values.allocate`) filled with finite garbage
    where `allocate` puts NaN, and other garbage where it puts integers and bools."""
    if dtype.is_float:
        return torch.full(shape, 96.0, dtype=dtype.torch)
    if dtype.kind == "bool":
        return torch.zeros(shape, dtype=torch.bool)
    return interpreter_values.storage_view(torch.full(shape, 3, dtype=dtype.torch), dtype)


def agree(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bools equal; integers equal but for at most 1 % of the elements off by one (an integer
    tensor stored from float sums, which the spec lets a backend add in another order: a sum a
    hair below an integer on one side, above on the other - seed 2080's mutant 13 and seed
    3011's 368 on the H100); floats within 2 % of the tensor's largest magnitude (a float16
    accumulator's rounding differs between backends by a few ulps a step)."""
    if expected.dtype == torch.bool or actual.dtype != expected.dtype:
        return torch.equal(actual.cpu(), expected.cpu())
    if not expected.dtype.is_floating_point:
        off = (actual.cpu().long() - expected.cpu().long()).abs()
        return bool(off.max() <= 1) and int((off != 0).sum()) <= expected.numel() // 100 if off.numel() else True
    x, y = actual.cpu().double(), expected.cpu().double()
    scale = max(1.0, float(y.abs().nan_to_num(0.0, 0.0, 0.0).max()) if y.numel() else 1.0)
    close = ((x - y).abs() <= 2e-2 * scale) | (x.isnan() & y.isnan()) | (x == y)
    return bool(close.all())
