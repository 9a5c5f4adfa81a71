"""Generated TileLang-style kernels (`import tritile.language as T`) for the pipeline property
tests and the GPU replay (bench/pipeline_replay.py): the shapes `pipeline_programs.py`'s
hand-built GEMMs do not reach.

* `GemmChain` - one or two pipelined GEMM loops at 64-256 tiles and 128/256/384 threads; between
  two loops a row reduction (`T.reduce_sum` / `T.reduce_max`) of the first accumulator that the
  second loop takes as its accumulator's initial value, as a scale of its A tile (a register
  operand) or as a scale in the epilogue; then a `T.Parallel` epilogue (scale, bias add, relu,
  cast to a half fragment) and a store from the fragment or through a shared tile.  M and the K
  sizes may be `T.dynamic` (runtime trip counts), M and K not multiples of the tiles.
* `Attention` - FlashAttention forward (two gemms, online softmax, causal or not), written as
  examples/flash_attention.py's `flashattn` but with the causal offset `seq_kv - seq_q`
  computed inside the kernel, so that both lengths may be `T.dynamic`.

Each spec is a frozen dataclass whose repr rebuilds it (`eval(repr(spec))` with this module's
names): what a failing example prints.  Besides its knobs each spec carries `switches` (the
schedule environment switches, e.g. ``TRITILE_WARP_SPECIALIZE=1`` on one warpgroup) and `sms`
(the persistent program count, so that a small grid still walks several tiles per program);
`lower(spec, target)` runs the pass list under both.  The common interface (`program_args`,
`program_dims`, `program_outputs`, `program_expected` also take a `pipeline_programs.Program`):

* `spec.func` - the frontend `PrimFunc`; `spec.make_args(seed, device)` - fresh random fp16
  inputs (outputs filled with noise the kernel must overwrite); `spec.dims(args)` - the runtime
  dims {Var: int} (`program_dim_values`: in launch order);
* `spec.reference(args)` - the torch reference of the outputs, computed on `args`' device in
  float32 and rounded to the outputs' dtypes; `spec.out_idx`; `spec.tolerance(dtype)`.

`draw_gemm_chain(choose)` / `draw_attention(choose)` build a spec from a chooser (`choose(options)`
returns one of `options`): `hypothesis_chooser(draw)` for the property tests, `rng.choice` for the
seeded replay lists.  Drawn specs respect `max_shared` (shared bytes of the buffers and the
store's staging tile, an estimate with a margin under the compiler's exact count: 160 KB fits
sm_80 and sm_90) and keep at
most 128 float32 accumulator elements a thread (larger tiles spill registers and compile for
minutes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from unittest import mock

import torch

import tritile.language as T
from kernels import load_operand_tiles
from pipeline_programs import Program
from tritile.ir.padding import padded
from tritile.lowering import persistent_tiles, run_passes

# fp16 outputs: one rounding (~5e-4 relative) plus summation-order differences; fp32 outputs of
# K <= 512 sums: summation order only.  Relative and absolute.
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-3}
SM80_SHARED = 160 * 1024  # fits sm_80 (163 KB opt-in) and sm_90 with room for barriers and staging
SM90_SHARED = 216 * 1024  # fits sm_90 (227 KB) only
MAX_ACC_PER_THREAD = 128
# 384 threads (three warpgroups) run through the passes and the interpreter, but the Gluon
# backend cannot compile them yet (`THREE_WARPGROUP_GAPS`): the codegen lists draw from these.
COMPILED_THREADS = (128, 256)
ALL_THREADS = (128, 256, 384)

# schedule switches a spec may set; the default (empty) is what a user gets
SWITCHES = [(), (), (), (("TRITILE_WARP_SPECIALIZE", "1"),), (("TRITILE_WARP_SPECIALIZE", "0"),),
            (("TRITILE_PERSISTENT", "1"),), (("TRITILE_CONSUMER_PARTITIONS", "0"),)]


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE[dtype]


@contextlib.contextmanager
def _schedule(switches, sms):
    """The environment switches (read by the passes while they run) and the persistent program count."""
    saved = {name: os.environ.get(name) for name, _ in switches}
    os.environ.update(dict(switches))
    patch = mock.patch.object(persistent_tiles, "num_sms", lambda target: sms) if sms else contextlib.nullcontext()
    try:
        with patch:
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def lower(program, target, stop_after: str = None) -> list:
    """`run_passes(program.func, target)` under the program's schedule switches and persistent
    program count (`pipeline_programs.Program`s have neither)."""
    with _schedule(getattr(program, "switches", ()), getattr(program, "sms", None)):
        return run_passes(program.func, target, stop_after=stop_after)


def program_dims(program, args) -> dict:
    """{Var: int} of a generated program's runtime dims for arguments `args`."""
    if isinstance(program, Program):
        return dict(program.dims)
    return program.dims(args)


def program_args(program, seed: int, device="cpu") -> list:
    """Fresh random arguments of a generated program on `device`."""
    if isinstance(program, Program):
        return [t.to(device) for t in program.make_args(seed)]
    return program.make_args(seed, device)


def program_dim_values(program, args) -> list:
    """The runtime dims in launch order (`func.dynamic_vars`), as `mbarrier_problems` takes them."""
    dims = program_dims(program, args)
    return [dims[v] for v in program.func.dynamic_vars]


def program_outputs(program, args) -> list:
    """The output tensors of `args` that `program_expected` predicts."""
    if isinstance(program, Program):  # C, and D when read_after
        return [args[3], args[4]][:2 if program.read_after else 1]
    return [args[i] for i in program.out_idx]


def program_expected(program, args) -> list:
    """[(expected tensor, rtol, atol)] for `program_outputs(program, args)`."""
    if isinstance(program, Program):  # the hand-built GEMMs' tolerances (test_pipeline_properties)
        c, d = program.reference([t.cpu() for t in args])
        return [(c, 1e-4, 1e-3), (d, 0.0, 0.0)][:2 if program.read_after else 1]
    return [(e, program.tolerance(e.dtype), program.tolerance(e.dtype)) for e in program.reference(args)]


class _Spec:
    """What both kernel kinds share: the cached frontend IR and the runtime dims."""

    @functools.cached_property
    def func(self):
        return self.build()

    def tolerance(self, dtype: torch.dtype) -> float:
        """Relative and absolute tolerance of an output of `dtype`."""
        return tolerance(dtype)

    def dims(self, args) -> dict:
        return {var: int(args[index].shape[axis]) for var, (index, axis) in self.func.dim_bindings.items()}

    def __repr__(self) -> str:  # only the knobs (dataclass fields), never the cached IR
        knobs = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.init)
        return f"{type(self).__name__}({knobs})"


def _noise(shape, dtype, gen, device):
    return torch.randn(shape, generator=gen).to(dtype).to(device)


# ---------------------------------------------------------------- GEMM chains


@dataclass(frozen=True, repr=False)
class GemmChain(_Spec):
    """C = epilogue(acc) of one or two pipelined GEMM loops over tile rows `by`, columns `bx`.

    `k_sizes` - K of each loop (A_i: [M, K_i], B_i: [K_i, N]); `stages` - num_stages of each loop.
    With two loops, `reduce` ("sum" / "max") reduces the first accumulator over its tile's
    columns into r[i], and `use` says how the second loop takes it: "init" (its accumulator
    starts at r[i]), "operand" (its A tile is scaled by r[i] / block_N in a half
    register fragment before the gemm), "epilogue" (its result is scaled by r[i] / block_N); `reuse_acc`: the second loop accumulates into the first loop's fragment.
    Epilogue, in this order: `scale` (x * scale, 1.0 = none), `bias` (+ Bias[col]), `relu`,
    `cast_fragment` (a `T.Parallel` cast into a fragment of the output dtype, else the store
    casts), `staged_store` (through a shared tile).  `dynamic`: M and every K are `T.dynamic`.
`policy`: the gemms' `T.GemmWarpPolicy` ("Square" / "FullRow").
    """
    tiles: tuple = (64, 64, 32)  # block_M, block_N, block_K
    threads: int = 128
    stages: tuple = (2,)
    m: int = 64
    n: int = 64
    k_sizes: tuple = (64,)
    reduce: str = "sum"
    use: str = "init"
    reuse_acc: bool = False
    scale: float = 1.0
    bias: bool = False
    relu: bool = False
    out_dtype: str = "float16"
    cast_fragment: bool = False
    staged_store: bool = False
    dynamic: bool = False
    policy: str = "Square"
    switches: tuple = ()
    sms: int = None
    out_idx: list = field(default=(5,), init=False)

    @property
    def grid(self) -> tuple:
        bm, bn, _ = self.tiles
        return (-(-self.n // bn), -(-self.m // bm))

    def shared_bytes(self) -> int:
        # a tile's dims take shared memory padded to powers of two (ir/padding.py: 192 rows as 256)
        bm, bn, bk = (padded(d) for d in self.tiles)
        # the store's tile: the staged one, or the TMA store's staging tile the generated code adds
        store = bm * bn * (2 if self.out_dtype == "float16" else 4)
        return sum(max(s, 1) * (bm * bk + bk * bn) * 2 for s in self.stages) + store

    def acc_per_thread(self) -> int:
        bm, bn, _ = self.tiles
        accumulators = 2 if len(self.k_sizes) == 2 and not self.reuse_acc else 1
        return accumulators * bm * bn // self.threads

    def tolerance(self, dtype: torch.dtype) -> float:
        # the "operand" use rounds A2 * r to half, r summed in another order than torch's: an
        # fp32 output then carries half-precision error
        half_operand = len(self.k_sizes) == 2 and self.use == "operand"
        return tolerance(torch.float16 if half_operand else dtype)

    def build(self):
        bm, bn, bk = self.tiles
        two = len(self.k_sizes) == 2
        if self.dynamic:
            M, K1, K2 = T.dynamic("m, k1, k2")
        else:
            M, K1, K2 = self.m, self.k_sizes[0], self.k_sizes[-1]
        N, threads, out_dtype = self.n, self.threads, self.out_dtype
        s1, s2 = self.stages[0], self.stages[-1]
        reduce, use, reuse_acc, scale, bias, relu = self.reduce, self.use, self.reuse_acc, self.scale, self.bias, self.relu
        cast_fragment, staged_store, policy = self.cast_fragment, self.staged_store, self.policy
        norm = 1.0 / bn  # r * norm is O(1): the scaled operand and result stay well inside fp16

        @T.prim_func
        def gemm_chain(A: T.Tensor((M, K1), "float16"), B: T.Tensor((K1, N), "float16"),
                       A2: T.Tensor((M, K2), "float16"), B2: T.Tensor((K2, N), "float16"),
                       Bias: T.Tensor((N,), "float16"), C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
                A_shared = T.alloc_shared((bm, bk), "float16")
                B_shared = T.alloc_shared((bk, bn), "float16")
                acc = T.alloc_fragment((bm, bn), "float32")
                T.clear(acc)
                for k in T.Pipelined(T.ceildiv(K1, bk), num_stages=s1):
                    load_operand_tiles(A, B, A_shared, B_shared, k, bx, by, bm, bn, bk, False, False)
                    T.gemm(A_shared, B_shared, acc, policy=policy)
                out = acc
                if two:
                    r = T.alloc_fragment((bm,), "float32")
                    if reduce == "sum":
                        T.reduce_sum(acc, r, dim=1)
                    else:
                        T.reduce_max(acc, r, dim=1)
                    A2_shared = T.alloc_shared((bm, bk), "float16")
                    B2_shared = T.alloc_shared((bk, bn), "float16")
                    if reuse_acc:
                        acc2 = acc
                    else:
                        acc2 = T.alloc_fragment((bm, bn), "float32")
                    if use == "init":
                        for i, j in T.Parallel(bm, bn):
                            acc2[i, j] = r[i]
                    else:
                        T.clear(acc2)
                    if use == "operand":
                        A2_local = T.alloc_fragment((bm, bk), "float16")
                    for k in T.Pipelined(T.ceildiv(K2, bk), num_stages=s2):
                        load_operand_tiles(A2, B2, A2_shared, B2_shared, k, bx, by, bm, bn, bk, False, False)
                        if use == "operand":
                            for i, j in T.Parallel(bm, bk):
                                A2_local[i, j] = A2_shared[i, j] * (r[i] * norm)
                            T.gemm(A2_local, B2_shared, acc2, policy=policy)
                        else:
                            T.gemm(A2_shared, B2_shared, acc2, policy=policy)
                    if use == "epilogue":
                        for i, j in T.Parallel(bm, bn):
                            acc2[i, j] = acc2[i, j] * (r[i] * norm)
                    out = acc2
                if scale != 1.0:
                    for i, j in T.Parallel(bm, bn):
                        out[i, j] *= scale
                if bias:
                    for i, j in T.Parallel(bm, bn):
                        out[i, j] += Bias[bx * bn + j]
                if relu:
                    for i, j in T.Parallel(bm, bn):
                        out[i, j] = T.max(out[i, j], 0.0)
                if cast_fragment:
                    C_cast = T.alloc_fragment((bm, bn), out_dtype)
                    for i, j in T.Parallel(bm, bn):
                        C_cast[i, j] = T.cast(out[i, j], out_dtype)
                    out = C_cast
                if staged_store:
                    C_shared = T.alloc_shared((bm, bn), out_dtype)
                    T.copy(out, C_shared)
                    T.copy(C_shared, C[by * bm, bx * bn])
                else:
                    T.copy(out, C[by * bm, bx * bn])

        return gemm_chain

    def make_args(self, seed: int, device="cpu") -> list:
        gen = torch.Generator().manual_seed(seed)
        k1, k2 = self.k_sizes[0], self.k_sizes[-1]  # one loop: A2 and B2 are unused copies of A's shapes
        out = getattr(torch, self.out_dtype)
        shapes = [(self.m, k1), (k1, self.n), (self.m, k2), (k2, self.n), (self.n,)]
        return [_noise(s, torch.float16, gen, device) for s in shapes] + [_noise((self.m, self.n), out, gen, device)]

    def reference(self, args) -> list:
        a, b, a2, b2, bias, c = args
        bm, bn, bk = self.tiles
        acc = a.float() @ b.float()
        if len(self.k_sizes) == 2:
            tiles = acc.reshape(self.m, -1, bn)  # n is a multiple of block_N
            r = tiles.sum(-1) if self.reduce == "sum" else tiles.amax(-1)
            r = r.repeat_interleave(bn, dim=1)  # [m, n]: the row value of each column's tile
            norm = 1.0 / bn
            if self.use == "operand":  # one product per column tile of the output
                cols = [(a2.float() * (r[:, j * bn:j * bn + 1] * norm)).half().float() @ b2[:, j * bn:(j + 1) * bn].float()
                        for j in range(self.n // bn)]
                acc = torch.cat(cols, dim=1)
            else:
                acc = a2.float() @ b2.float()
                acc = acc + r if self.use == "init" else acc * (r * norm)
        acc = acc * self.scale
        if self.bias:
            acc = acc + bias.float()
        if self.relu:
            acc = torch.relu(acc)
        return [acc.to(c.dtype)]


def hypothesis_chooser(draw):
    """`choose(options)` drawing with hypothesis (shrinks toward the first option)."""
    from hypothesis import strategies as st

    return lambda options: draw(st.sampled_from(list(options)))


def _rows_and_threads(choose, powers, thread_counts):
    """(block_M, threads): 128 threads on any tile, 256 on 128+ rows, 384 on 192 (three
    consumer partitions of 64 rows, as bench/attention_configs.py) or 128 rows (not split)."""
    count = choose(list(thread_counts))
    if count == 384:
        return choose([192, 128]), count
    return choose(powers if count == 128 else [p for p in powers if p >= 128]), count


def draw_gemm_chain(choose, max_shared: int = SM80_SHARED, wide: bool = False, thread_counts=COMPILED_THREADS) -> GemmChain:
    """A `GemmChain` from `choose`; redrawn until it fits `max_shared` and the register rule.
    `wide`: up to 6x6 tiles (a GPU-only size: the interpreter would take seconds); `threads`:
    `thread_counts`: the CTA sizes drawn from."""
    while True:
        bm, threads = _rows_and_threads(choose, [64, 128, 256], thread_counts)
        bn, bk = choose([64, 128, 256]), choose([32, 64])
        loops = choose([1, 1, 2])
        stages = tuple(choose([0, 1, 2, 3, 4]) for _ in range(loops))
        trips = [choose([1, 2, 3, 4, 6]) for _ in range(loops)]
        dynamic = choose([False, False, True])
        ragged = dynamic and choose([False, True])  # M and K off the tile grid
        rows, cols = (choose([1, 2, 4, 6]), choose([1, 2, 6])) if wide else (choose([1, 1, 2]), choose([1, 1, 2]))
        m = rows * bm - (choose([1, bm // 2]) if ragged else 0)
        k_sizes = tuple(t * bk - (choose([8, bk // 2]) if ragged else 0) for t in trips)
        spec = GemmChain(
            tiles=(bm, bn, bk), threads=threads, stages=stages, m=m, n=cols * bn, k_sizes=k_sizes,
            reduce=choose(["sum", "max"]), use=choose(["init", "operand", "epilogue"]),
            reuse_acc=choose([False, True]), scale=choose([1.0, 0.5, 0.125]), bias=choose([False, True]),
            relu=choose([False, True]), out_dtype=choose(["float16", "float32"]), cast_fragment=choose([False, True]),
            staged_store=choose([False, True]), dynamic=dynamic,
            policy=choose(["Square", "FullRow"]), switches=choose(SWITCHES),
            sms=choose([None, 1, 2]))
        if spec.shared_bytes() <= max_shared and spec.acc_per_thread() <= MAX_ACC_PER_THREAD:
            return spec


# ---------------------------------------------------------------- attention


@dataclass(frozen=True, repr=False)
class Attention(_Spec):
    """softmax(Q K^T / sqrt(dim)) V per (batch, head) for Q [batch, heads, seq_q, dim] and K, V
    [batch, heads, seq_kv, dim]; causal: query i sees keys j <= i + seq_kv - seq_q.  Lengths
    are multiples of the tiles (no key padding mask); `dynamic`: both are `T.dynamic` (runtime
    grid and trip counts).  `staged_store`: the output goes through a shared tile."""
    block_M: int = 64
    block_N: int = 64
    dim: int = 64
    threads: int = 128
    num_stages: int = 1
    causal: bool = False
    batch: int = 1
    heads: int = 1
    seq_q: int = 64
    seq_kv: int = 64
    staged_store: bool = True
    dynamic: bool = False
    switches: tuple = ()
    sms: int = None
    out_idx: list = field(default=(3,), init=False)

    def shared_bytes(self) -> int:
        tile = padded(self.dim) * 2
        # Q, the output's tile (staged, or the TMA store's staging tile), K and V per stage, their
        # rows padded to powers of two as the compiler pads them (ir/padding.py)
        return 2 * padded(self.block_M) * tile + 2 * max(self.num_stages, 1) * padded(self.block_N) * tile

    def acc_per_thread(self) -> int:
        return self.block_M * (self.block_N + self.dim) // self.threads

    def build(self):
        bm, bn, dim, threads, causal, stages, staged_store = (self.block_M, self.block_N, self.dim, self.threads,
                                                             self.causal, self.num_stages, self.staged_store)
        seq_q, seq_kv = T.dynamic("seq_q, seq_kv") if self.dynamic else (self.seq_q, self.seq_kv)
        batch, heads = self.batch, self.heads
        q_shape, kv_shape = [self.batch, self.heads, seq_q, dim], [self.batch, self.heads, seq_kv, dim]
        scale = (1.0 / dim) ** 0.5 * 1.44269504  # 1/sqrt(dim) * log2(e): the softmax in exp2
        dtype, accum = "float16", "float32"

        @T.prim_func
        def attention(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                      Output: T.Tensor(q_shape, dtype)):
            with T.Kernel(T.ceildiv(seq_q, bm), heads, batch, threads=threads) as (bx, by, bz):
                Q_shared = T.alloc_shared([bm, dim], dtype)
                K_shared = T.alloc_shared([bn, dim], dtype)
                V_shared = T.alloc_shared([bn, dim], dtype)
                acc_s = T.alloc_fragment([bm, bn], accum)
                acc_s_cast = T.alloc_fragment([bm, bn], dtype)
                acc_o = T.alloc_fragment([bm, dim], accum)
                scores_max = T.alloc_fragment([bm], accum)
                scores_max_prev = T.alloc_fragment([bm], accum)
                scores_scale = T.alloc_fragment([bm], accum)
                scores_sum = T.alloc_fragment([bm], accum)
                logsum = T.alloc_fragment([bm], accum)
                past_len = seq_kv - seq_q

                T.copy(Q[bz, by, bx * bm:(bx + 1) * bm, :], Q_shared)
                T.fill(acc_o, 0)
                T.fill(logsum, 0)
                T.fill(scores_max, -T.infinity(accum))
                loop_range = (T.min(T.ceildiv(seq_kv, bn), T.ceildiv((bx + 1) * bm + past_len, bn))
                              if causal else T.ceildiv(seq_kv, bn))
                for k in T.Pipelined(loop_range, num_stages=stages):
                    T.copy(K[bz, by, k * bn:(k + 1) * bn, :], K_shared)
                    if causal:
                        for i, j in T.Parallel(bm, bn):
                            acc_s[i, j] = T.if_then_else(bx * bm + i + past_len >= k * bn + j, 0, -T.infinity(accum))
                    else:
                        T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                    for i in T.Parallel(bm):  # a row whose keys are all masked keeps its max
                        scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                    for i in T.Parallel(bm):
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(bm, bn):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(bm):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)
                    for i, j in T.Parallel(bm, dim):
                        acc_o[i, j] *= scores_scale[i]
                    T.copy(V[bz, by, k * bn:(k + 1) * bn, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(bm, dim):
                    acc_o[i, j] /= logsum[i]
                if staged_store:
                    O_shared = T.alloc_shared([bm, dim], dtype)
                    T.copy(acc_o, O_shared)
                    T.copy(O_shared, Output[bz, by, bx * bm:(bx + 1) * bm, :])
                else:
                    T.copy(acc_o, Output[bz, by, bx * bm:(bx + 1) * bm, :])

        return attention

    def make_args(self, seed: int, device="cpu") -> list:
        gen = torch.Generator().manual_seed(seed)
        q_shape = (self.batch, self.heads, self.seq_q, self.dim)
        kv_shape = (self.batch, self.heads, self.seq_kv, self.dim)
        return [_noise(s, torch.float16, gen, device) for s in (q_shape, kv_shape, kv_shape, q_shape)]

    def reference(self, args) -> list:
        q, k, v, _ = args
        scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / math.sqrt(self.dim)
        if self.causal:
            visible = torch.ones(self.seq_q, self.seq_kv, device=q.device).tril(diagonal=self.seq_kv - self.seq_q)
            scores = scores.masked_fill(visible == 0, float("-inf"))
        return [torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), v.float()).half()]


def draw_attention(choose, max_shared: int = SM80_SHARED, wide: bool = False, thread_counts=COMPILED_THREADS) -> Attention:
    """An `Attention` from `choose`, redrawn until it fits `max_shared` and the register rule;
    at most 2 blocks (`wide`: up to 16, a GPU-only size), 1 to 4 key tiles."""
    while True:
        bm, threads = _rows_and_threads(choose, [64, 128], thread_counts)
        bn, dim = choose([64, 128]), choose([64, 128])
        row_blocks = choose([1, 2, 4]) if wide else choose([1, 1, 2])
        heads = choose([1, 2, 4]) if wide else (choose([1, 2]) if row_blocks == 1 else 1)
        seq_q = row_blocks * bm
        # seq_kv: a multiple of block_N, at least seq_q when causal (every query sees a key)
        past = choose([0, 0, bn, 2 * bn])
        seq_kv = -(-seq_q // bn) * bn + past if choose([True, False]) else choose([1, 2, 3]) * bn
        causal = choose([False, True])
        if causal and seq_kv < seq_q:
            seq_kv = -(-seq_q // bn) * bn
        spec = Attention(block_M=bm, block_N=bn, dim=dim, threads=threads, num_stages=choose([1, 2, 0, 3]),
                         causal=causal, batch=choose([1, 2]) if wide else 1, heads=heads, seq_q=seq_q,
                         seq_kv=seq_kv, staged_store=choose([True, False]), dynamic=choose([False, False, True]),
                         switches=choose(SWITCHES), sms=choose([None, 1, 2]))
        if spec.shared_bytes() <= max_shared and spec.acc_per_thread() <= MAX_ACC_PER_THREAD:
            return spec


KINDS = {"gemm_chain": draw_gemm_chain, "attention": draw_attention}


# Was a compiler hang (three warpgroups under the "Square" warp policy looped forever in
# `tritile.ir.layouts.wgmma_accumulator`); tests/test_pipeline_kernel_properties.py lowers it in a
# subprocess with a timeout.  Its 192-row fragments are a THREE_WARPGROUP_GAPS case for the backend.
GEMM_384_SQUARE = GemmChain(tiles=(192, 64, 32), threads=384, m=192, n=64, k_sizes=(64,))

# Backend gaps (CompileError, both targets), xfailed in tests/test_pipeline_kernel_properties.py:
# 12 warps in one partition ("num_warps must be a power of 2": 128 rows are not split across
# three consumers), and the three-partition split's 192-row fragments ("non-power-of-two
# dimension 192").
THREE_WARPGROUP_GAPS = {
    "gemm-128-rows": GemmChain(tiles=(128, 64, 64), threads=384, m=128, n=64, k_sizes=(128,), policy="FullRow"),
    "gemm-192-rows": GemmChain(tiles=(192, 64, 64), threads=384, m=192, n=64, k_sizes=(128,), policy="FullRow"),
    "gemm-192-rows-square": GEMM_384_SQUARE,
    "attention-192-rows": Attention(block_M=192, block_N=64, threads=384, seq_q=192, seq_kv=128, num_stages=2),
}


def replay_kernels(count: int, seed: int, max_shared: int = SM80_SHARED, wide_every: int = 0) -> list:
    """[(spec, argument seed)]: `count` specs drawn with `random.Random(seed)`, the kinds in turn,
    the same list in every process.  `wide_every` > 0: every such spec of each kind is drawn
    `wide` (GPU-only sizes)."""
    import random

    rng = random.Random(seed)
    draws = list(KINDS.values())
    out = []
    for i in range(count):
        wide = wide_every > 0 and (i // len(draws)) % wide_every == wide_every - 1
        out.append((draws[i % len(draws)](rng.choice, max_shared, wide), rng.randint(0, 2**16)))
    return out

# Was a compiler crash (tests/test_pipeline_kernel_properties.py compiles it): a causal attention
# made persistent without warp specialization (TRITILE_PERSISTENT=1 on one warpgroup) whose key
# loop is shorter than its stages (at most 1 tile, 3 stages) failed in Triton's
# ConvertTritonGPUToLLVM with an LLVM assertion (SmallVector `idx < size()`), through the
# prologue's guarded copies of iterations that never run; pipeline planning now caps the stages
# by the loop's static trip count.
CAUSAL_PERSISTENT_SHORT = Attention(block_M=64, block_N=64, dim=64, threads=128, causal=True, num_stages=3, seq_q=64,
                                    seq_kv=64, switches=(("TRITILE_PERSISTENT", "1"),))
