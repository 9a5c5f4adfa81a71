"""GQA decoding attention with split KV (flash-decoding), in TileLang's lazy style.

One new query token per sequence: q (batch, heads, dim) against a cache K, V (batch, kv_heads,
seq, dim), heads = groups * kv_heads.  The work of one (batch, kv head) is split over
`num_split` programs along the keys (splits spread one sequence's keys over many SMs when
batch * kv_heads alone cannot fill them); each split's program runs `split_attention`: the
`groups` query heads of the kv head fill the top rows of a `block_H`-row tile (wgmma's 64-row
minimum; the rows below are computed and dropped), and the online softmax of
examples/flash_attention.py walks the split's `block_N`-key tiles (keys past `seq` masked).
The splits are then combined (`combine_heads`): their normalised outputs weighted by
exp2(lse - max lse), in split order 0 .. num_split - 1, normalised.  Two ways to run it:

* two kernels: `decode_split` (one program per (split, kv head, batch)) writes each split's
  partial output and base-2 log-sum-exp, `decode_combine` (one program per (batch, head))
  combines them;
* one kernel, `decode_fused`: the same split programs write their partials, then count
  themselves in on a per-(batch, kv head) counter, and the last to arrive combines the
  `groups` heads of its kv head and resets the counter to 0 for the next call (no memset per
  call).  Which program comes last varies from run to run; the result does not, since the
  combine reads every split, its own included, from memory in split order.  Without a split
  (`num_split=1`) the program writes the fp16 output itself.

Why the last program sees the other programs' partials (PTX memory model, sm_90):
1. every thread of a split program stores its part of the partials (weak `st.global`: element
   stores inside `T.Parallel`, never a TMA store, which the barrier would not order), then
   `T.sync_threads()` (`bar.sync 0`) orders those stores before thread 0's next operation;
2. thread 0 alone runs the counter's `atom.global.gpu.acq_rel.add` (a scalar atomic is one
   thread's in Triton's lowering): a release at gpu scope, cumulative over what the barrier
   ordered before it, and an acquire;
3. the counter's atomics form one read-modify-write chain, so each program's release
   synchronises with the acquire of every later arrival: the last arrival's thread 0 has all
   num_split programs' stores before it in causality order;
4. thread 0 hands the atomic's result to the other threads through shared memory and a second
   `bar.sync` (Triton's lowering again), which orders its acquire before every thread's loads.
The counter's reset needs nothing more: the last arrival saw all num_split increments of the call
before its own, and the next call's kernel starts after this one ends (stream order).
By causality order the combine's loads cannot return a value older than the partials:
plain `ld.global` suffices.  (ptxas implements it so: `MEMBAR.ALL.GPU` before the atomic,
`CCTL.IVALL` - the SM's L1 invalidated - after it, before the barrier, so no stale L1 line
serves the loads.)  What would not be covered: loads through the non-coherent path
(`ld.global.nc`) or through the async proxy (TMA, `cp.async.bulk`) without a proxy fence.  The
combine therefore reads the partials with element reads inside `T.Parallel`, which both
backends emit as plain masked loads, never as TMA.  tests/test_kernels_flash_decoding.py checks
all of this on the sm_90 PTX and SASS of both backends.  The counters and partials of a
decoder are kept per device and CUDA stream (`decoder`): calls on two streams do not share them.

Runs on CUDA when available, else on the CPU reference interpreter with small sizes.
Run: ``python examples/flash_decoding.py``.
"""
import torch

import tritile
import tritile.language as T

LOG2E = 1.44269504
FUSED = True  # `gqa_decode`'s default: one kernel (`decode_fused`) rather than split + combine


def keys_per_split(seq: int, num_split: int, block_N: int) -> int:
    """Keys per split: whole `block_N`-key tiles, so splits never share one."""
    return -(-(-(-seq // num_split)) // block_N) * block_N


def split_keys(seq: int, num_split: int, block_N: int) -> int:
    """`keys_per_split`, where a split count that would leave the last split without a key is a
    ValueError (its log-sum-exp would be -inf and its output 0 / 0)."""
    if num_split < 1:
        raise ValueError(f"num_split must be at least 1, not {num_split}")
    chunk = keys_per_split(seq, num_split, block_N)
    if (num_split - 1) * chunk >= seq:
        raise ValueError(f"num_split={num_split} leaves split {num_split - 1} without keys "
                         f"(seq={seq} in splits of {chunk} keys: block_N={block_N} tiles)")
    return chunk


def split_attention(heads, kv_heads, seq, dim, num_split, block_N, block_H, num_stages):
    """The split programs' attention as a `@T.macro` of (Q, K, V, sid, hid, bid): the online
    softmax of query heads hid * groups .. + block_H (the first `groups` real) over keys
    [sid * chunk, min((sid + 1) * chunk, seq)) of kv head `hid`, batch `bid`.  Returns the
    unnormalised output `acc_o`, the denominators `logsum` and the row maxima `scores_max`
    (scores in base 2, scaled by log2(e) / sqrt(dim)), each of `block_H` rows."""
    scale = (1.0 / dim) ** 0.5 * LOG2E
    groups = heads // kv_heads
    chunk = split_keys(seq, num_split, block_N)
    dtype, accum_dtype = "float16", "float"

    @T.macro
    def attend(Q, K, V, sid, hid, bid):
        Q_shared = T.alloc_shared([block_H, dim], dtype)
        K_shared = T.alloc_shared([block_N, dim], dtype)
        V_shared = T.alloc_shared([block_N, dim], dtype)
        acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
        acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
        acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
        scores_max = T.alloc_fragment([block_H], accum_dtype)
        scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
        scores_scale = T.alloc_fragment([block_H], accum_dtype)
        scores_sum = T.alloc_fragment([block_H], accum_dtype)
        logsum = T.alloc_fragment([block_H], accum_dtype)

        T.copy(Q[bid, hid * groups:hid * groups + block_H, :], Q_shared)
        T.fill(acc_o, 0)
        T.fill(logsum, 0)
        T.fill(scores_max, -T.infinity(accum_dtype))
        start = sid * chunk
        for k in T.Pipelined(T.ceildiv(T.min(chunk, seq - start), block_N), num_stages=num_stages):
            T.copy(K[bid, hid, start + k * block_N:start + (k + 1) * block_N, :], K_shared)
            T.clear(acc_s)
            T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, block_N):  # keys past the cache's end
                acc_s[i, j] = T.if_then_else(start + k * block_N + j < seq, acc_s[i, j], -T.infinity(accum_dtype))
            T.copy(scores_max, scores_max_prev)
            T.reduce_max(acc_s, scores_max, dim=1, clear=False)
            for i in T.Parallel(block_H):
                scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
            for i, j in T.Parallel(block_H, block_N):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
            T.reduce_sum(acc_s, scores_sum, dim=1)
            for i in T.Parallel(block_H):
                logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
            T.copy(acc_s, acc_s_cast)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] *= scores_scale[i]
            T.copy(V[bid, hid, start + k * block_N:start + (k + 1) * block_N, :], V_shared)
            T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
        return acc_o, logsum, scores_max

    return attend


def store_partial(heads, kv_heads, dim, block_H):
    """A `@T.macro` of (acc_o, logsum, scores_max, O_partial, LSE_partial, sid, hid, bid): the
    split's normalised output and base-2 log-sum-exp of its `groups` real rows, written to
    O_partial[bid, head, sid, :] and LSE_partial[bid, head, sid]."""
    scale = (1.0 / dim) ** 0.5 * LOG2E
    groups = heads // kv_heads

    @T.macro
    def store(acc_o, logsum, scores_max, O_partial, LSE_partial, sid, hid, bid):
        for i, j in T.Parallel(block_H, dim):
            if i < groups:  # the rows of this kv head's query heads
                O_partial[bid, hid * groups + i, sid, j] = acc_o[i, j] / logsum[i]
        for i in T.Parallel(block_H):
            if i < groups:
                LSE_partial[bid, hid * groups + i, sid] = T.log2(logsum[i]) + scores_max[i] * scale

    return store


def combine_heads(rows, num_split, dim):
    """A `@T.macro` of (O_partial, LSE_partial, Output, bid, head): heads head .. head + rows - 1
    of batch `bid` combined from their splits' partials - weights exp2(lse - max lse), the
    weighted outputs added in split order 0 .. num_split - 1, divided by the weights' sum - and
    written to Output in fp16.  The partials are read element by element inside `T.Parallel`:
    plain loads on every backend (never TMA), which the fused kernel's memory-ordering argument
    needs (module docstring).  Each lane computes its split's weight from the log-sum-exp it
    reads (the same exp2 as the weights' sum), so the splits' loads depend on nothing but
    the max and may all be in flight at once."""
    accum_dtype = "float"

    @T.macro
    def combine(O_partial, LSE_partial, Output, bid, head):
        weights = T.alloc_fragment([rows, num_split], accum_dtype)
        lse_max = T.alloc_fragment([rows], accum_dtype)
        weight_sum = T.alloc_fragment([rows], accum_dtype)
        out = T.alloc_fragment([rows, dim], accum_dtype)
        for h, s in T.Parallel(rows, num_split):
            weights[h, s] = LSE_partial[bid, head + h, s]
        T.reduce_max(weights, lse_max, dim=1)
        for h, s in T.Parallel(rows, num_split):
            weights[h, s] = T.exp2(weights[h, s] - lse_max[h])
        T.reduce_sum(weights, weight_sum, dim=1)
        T.clear(out)
        for s in T.unroll(num_split):
            for h, j in T.Parallel(rows, dim):
                out[h, j] += O_partial[bid, head + h, s, j] * T.exp2(LSE_partial[bid, head + h, s] - lse_max[h])
        for h, j in T.Parallel(rows, dim):
            out[h, j] /= weight_sum[h]
        T.copy(out, Output[bid, head:head + rows, :])

    return combine


@tritile.jit(out_idx=[3, 4])
def decode_split(batch, heads, kv_heads, seq, dim, num_split, block_N=128, block_H=64, num_stages=2, threads=128):
    attend = split_attention(heads, kv_heads, seq, dim, num_split, block_N, block_H, num_stages)
    store = store_partial(heads, kv_heads, dim, block_H)

    @T.prim_func
    def main(Q: T.Tensor([batch, heads, dim], "float16"), K: T.Tensor([batch, kv_heads, seq, dim], "float16"),
             V: T.Tensor([batch, kv_heads, seq, dim], "float16"),
             O_partial: T.Tensor([batch, heads, num_split, dim], "float"),
             LSE_partial: T.Tensor([batch, heads, num_split], "float")):
        with T.Kernel(num_split, kv_heads, batch, threads=threads) as (sid, hid, bid):
            acc_o, logsum, scores_max = attend(Q, K, V, sid, hid, bid)
            store(acc_o, logsum, scores_max, O_partial, LSE_partial, sid, hid, bid)

    return main


@tritile.jit(out_idx=[2])
def decode_combine(batch, heads, num_split, dim, threads=128):
    combine = combine_heads(1, num_split, dim)

    @T.prim_func
    def main(O_partial: T.Tensor([batch, heads, num_split, dim], "float"),
             LSE_partial: T.Tensor([batch, heads, num_split], "float"), Output: T.Tensor([batch, heads, dim], "float16")):
        with T.Kernel(heads, batch, threads=threads) as (hid, bid):
            combine(O_partial, LSE_partial, Output, bid, hid)

    return main


def unsplit_attention(attend, batch, heads, kv_heads, seq, dim, block_H, threads):
    """`decode_fused` without a split: (Q, K, V) -> Output, each program writing the fp16
    output of its kv head's `groups` heads itself."""
    groups = heads // kv_heads
    q_shape, kv_shape = [batch, heads, dim], [batch, kv_heads, seq, dim]

    @T.prim_func
    def main(Q: T.Tensor(q_shape, "float16"), K: T.Tensor(kv_shape, "float16"), V: T.Tensor(kv_shape, "float16"),
             Output: T.Tensor(q_shape, "float16")):
        with T.Kernel(1, kv_heads, batch, threads=threads) as (sid, hid, bid):
            acc_o, logsum, _ = attend(Q, K, V, sid, hid, bid)
            for i, j in T.Parallel(block_H, dim):
                if i < groups:
                    Output[bid, hid * groups + i, j] = acc_o[i, j] / logsum[i]

    return main


@tritile.jit(out_idx=[-1])
def decode_fused(batch, heads, kv_heads, seq, dim, num_split, block_N=128, block_H=64, num_stages=2, threads=128):
    """One kernel: (Q, K, V, O_partial, LSE_partial, Count) -> Output, the last of a (batch, kv
    head)'s `num_split` programs combining its heads (module docstring); Count (batch, kv_heads)
    int32 must be 0 before the first call and is 0 again after each.  With `num_split=1`:
    (Q, K, V) -> Output, written by the one program."""
    attend = split_attention(heads, kv_heads, seq, dim, num_split, block_N, block_H, num_stages)
    if num_split == 1:
        return unsplit_attention(attend, batch, heads, kv_heads, seq, dim, block_H, threads)
    groups = heads // kv_heads
    q_shape, kv_shape = [batch, heads, dim], [batch, kv_heads, seq, dim]
    store = store_partial(heads, kv_heads, dim, block_H)
    combine = combine_heads(groups, num_split, dim)

    @T.prim_func
    def main(Q: T.Tensor(q_shape, "float16"), K: T.Tensor(kv_shape, "float16"), V: T.Tensor(kv_shape, "float16"),
             O_partial: T.Tensor([batch, heads, num_split, dim], "float"),
             LSE_partial: T.Tensor([batch, heads, num_split], "float"), Count: T.Tensor([batch, kv_heads], "int32"),
             Output: T.Tensor(q_shape, "float16")):
        with T.Kernel(num_split, kv_heads, batch, threads=threads) as (sid, hid, bid):
            acc_o, logsum, scores_max = attend(Q, K, V, sid, hid, bid)
            store(acc_o, logsum, scores_max, O_partial, LSE_partial, sid, hid, bid)
            T.sync_threads()  # every thread's partial stored before thread 0 counts the program in
            arrived = T.atomic_add(Count[bid, hid], 1, memory_order="acq_rel", return_prev=True)
            if arrived == num_split - 1:  # the last split of (bid, hid): all partials are stored
                combine(O_partial, LSE_partial, Output, bid, hid * groups)
                Count[bid, hid] = 0

    return main


def tile_config(device_type: str, batch: int, kv_heads: int, seq: int) -> dict:
    """Small tiles for the CPU interpreter (two splits).  On CUDA: 128-key tiles, and as many
    splits (a power of two, up to 16) as it takes for batch * kv_heads * splits to cover the
    H100's 132 SMs; three stages without a split, two with (an H100 sweep, bench/NOTES.md session
    16: 2.92 against 2.71 TB/s unsplit at 64x32/8x8192x128; at 8x64/8x32768 four splits, 2.79).
    Either way halved while the last split would get no key (short caches)."""
    if device_type != "cuda":
        block_N, splits = 32, 2
    else:
        block_N, splits = 128, 1
        while splits < 16 and batch * kv_heads * splits < 132 and seq // (splits * 2) >= 128:
            splits *= 2
    while splits > 1 and (splits - 1) * keys_per_split(seq, splits, block_N) >= seq:
        splits //= 2
    if device_type != "cuda":
        return dict(block_N=block_N, block_H=16, num_split=splits, num_stages=1)
    return dict(block_N=block_N, block_H=64, num_split=splits, num_stages=3 if splits == 1 else 2)


def decoder(batch, heads, kv_heads, seq, dim, device_type="cuda", fused=None, rebuild=None, **tiles):
    """The decoding call `(q, k, v) -> out` for these sizes: `tile_config`'s tiles, any of them
    replaced by `tiles` (num_split, block_N, block_H, num_stages, threads); one kernel (`fused`,
    default `FUSED`) or split + combine.  The fused call keeps its partials and counters per
    device and CUDA stream, allocated at the first call there (the counters zeroed once).
    `rebuild(jit_function)` may replace the example's `@tritile.jit` functions before they are
    built (bench/bench_h100.py: the same functions on another backend)."""
    config = {**tile_config(device_type, batch, kv_heads, seq), **tiles}
    fused = FUSED if fused is None else fused
    rebuild = rebuild or (lambda jit_function: jit_function)
    num_split = config["num_split"]
    if fused:
        kernel = rebuild(decode_fused)(batch, heads, kv_heads, seq, dim, **config)
        if num_split == 1:
            return kernel
        workspaces = {}

        def run(q, k, v):
            key = (q.device, torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else None)
            if key not in workspaces:
                workspaces[key] = (torch.empty(batch, heads, num_split, dim, device=q.device),
                                   torch.empty(batch, heads, num_split, device=q.device),
                                   torch.zeros(batch, kv_heads, dtype=torch.int32, device=q.device))
            return kernel(q, k, v, *workspaces[key])

        return run
    split = rebuild(decode_split)(batch, heads, kv_heads, seq, dim, **config)
    if num_split == 1:  # one split is already normalised: nothing to combine
        return lambda q, k, v: split(q, k, v)[0][:, :, 0].to(q.dtype)
    combine = rebuild(decode_combine)(batch, heads, num_split, dim)
    return lambda q, k, v: combine(*split(q, k, v))


DECODERS = {}  # (sizes, device type, fused) -> decoder: `gqa_decode`'s, built at the first call


def gqa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused=None) -> torch.Tensor:
    """Attention of one query token per sequence: q (batch, heads, dim), k / v (batch, kv_heads, seq, dim)."""
    batch, heads, dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    fused = FUSED if fused is None else fused
    key = (batch, heads, kv_heads, seq, dim, q.device.type, fused)
    if key not in DECODERS:
        DECODERS[key] = decoder(batch, heads, kv_heads, seq, dim, q.device.type, fused)
    return DECODERS[key](q, k, v)


def ref_program(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1).float(), v.repeat_interleave(groups, dim=1).float()
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), k) / q.shape[-1] ** 0.5
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v).to(q.dtype)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, kv_heads, seq, dim = (8, 32, 8, 8192, 128) if device == "cuda" else (2, 8, 2, 200, 32)
    q = torch.randn(batch, heads, dim, dtype=torch.float16, device=device)
    k, v = (torch.randn(batch, kv_heads, seq, dim, dtype=torch.float16, device=device) for _ in range(2))
    ref = ref_program(q, k, v)
    for fused in (True, False):
        out = gqa_decode(q, k, v, fused=fused)
        error = (out.float() - ref.float()).abs().max().item()
        print(f"gqa decode ({'one kernel' if fused else 'split + combine'}) b={batch} h={heads} h_kv={kv_heads} "
              f"s={seq} d={dim} on {device}: max |tritile - torch| = {error:.3e}")
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
