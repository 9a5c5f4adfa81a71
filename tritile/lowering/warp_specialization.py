"""warp_specialization: give the TMA copies of a kernel's software-pipelined loops to a
producer warp (sm_90).

Assumes
-------
`pipeline_injection` ran: each software-pipelined loop is one `Seq` (prologue, steady
``For(pipelined_from=S)``, epilogue) whose async copies carry iteration tags and whose
steady-state body commits its copies as one group per time step.

Guarantees
----------
The IR is unchanged (warp specialization is a schedule of the same program, so the
interpreter runs the result as is); when the kernel qualifies,
``func.attrs["warp_specialization"]`` is a `WarpSpecialization` (printed as a comment at the
top of the kernel, so it is part of every later stage's text and of the compile-cache key).
The Gluon backend (codegen/gluon/warp_specialize.py) then runs every pipelined loop's async
copies in a producer partition of `producer_warps` warps with `producer_registers` registers
(``setmaxnreg``), which walks the loop's commit groups g = 0, 1, ... and, per group, waits
until the consumers released its slot (an "empty" mbarrier per slot), then issues the
expect and the TMA copies on the slot's "full" mbarrier.  The rest of the kernel runs in the
default partition (the user's warps), where each group's copies become the release of the
slot the group refills, at the point pipeline injection placed them (after every gemm
reading the slot retired), and the waits stay as they are.  The consumers therefore never
issue TMA copies or expects, and Triton's barrier analysis no longer puts CTA barriers
between the producer's and the consumers' barrier operations.

The producer also takes the kernel's *tile loads* (``WarpSpecialization.tile_loads``):
synchronous global -> shared copies at the top level of the kernel body, before its first
pipelined loop, that TMA can serve, whose coordinates the producer can recompute and whose
buffer no other statement writes and no TMA store reads (its release would not wait for the
store; FlashAttention's Q tile qualifies).  The producer issues them once per tile ahead of
the loops' groups; the consumers wait for them where the copy stood and release the buffer
right after its last read of the tile retired, so that under persistent tiles the next
tile's load runs under this tile's last iterations and epilogue.

A kernel qualifies when
* the target has TMA and tensor-core wgmma (sm_90) and it has at least one pipelined loop;
* every pipelined loop is at the top level of the kernel body (nested only in `Seq`s: the
  producer walks the loops in program order, once each);
* every async copy is one TMA can serve (`instructions.uses_tma`), with an iteration tag;
* in each steady-state body every async copy comes before the body's single `CommitGroup`
  and none is under an `If`;
* each loop's trip count, each copy's global coordinates and its shared slot depend only on
  block indices, runtime dims, the loop variable and top-level `Let`s of those, reading no
  buffer (the producer recomputes them; a one-stage loop's slot variable lives in the
  consumers).
When: ``TRITILE_WARP_SPECIALIZE`` (read when the pass runs) = ``1`` always, ``0`` never, and by
default (``auto``) where the CTA has several consumer warpgroups: those that
`consumer_partitions` splits into a partition each, and those that cooperate on one tile (the
GEMM's 128x256).  One-warpgroup CTAs keep their own copies: there the producer's extra
warpgroup halves the CTAs per SM (FlashAttention 64x64 tiles: 0.5x on an H100).  Nor does
a CTA get a producer whose fragments take more registers per thread (`fragment_registers`,
all fragments together) than setmaxnreg leaves its consumers (240 with two consumer
warpgroups, where 255 without a producer): the FlashAttention backward's dK / dV / P / dS /
dQ tiles (256 registers a thread at head dim 128, 288 at 64) spilled 448 bytes under 240
registers at head dim 64, 16 without the producer (ptxas for sm_90, bench/NOTES.md session
18).  Nor does a CTA whose shared buffers do not fit when all are allocated before the fork
(the producer and consumers must agree on every address, so no buffer reuses another's bytes):
without the producer, buffers used only after the loops take the bytes of those used only in
them (TileLang's attention-sink backward: dK / dV staging of 64 KB each after a loop over
104 KB of operands, 238 KB with a producer, 232 KB available).  Measured on an H100 (bench/NOTES.md): with the consumers split, FlashAttention's
128x128 tile ran 1.19-1.28x faster, causal 1.04x; a producer warp alone was neutral for the GEMM (0.98-1.04x)
until it also made the GEMM persistent (`persistent_tiles`), the producer loading the next
tile under the epilogue: 1.012x at 4096^3, 1.016x at 8192^3 (three interleaved rounds each).
"""
from __future__ import annotations

import dataclasses
import math

from tritile.ir import instructions as isel
from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, walk, written_buffer
from tritile.lowering import consumer_partitions
from tritile.lowering.shared_memory_budget import allocated_at_once_bytes
from tritile.switches import schedule_switch

PRODUCER_WARPS = 1
# a TMA producer holds a few coordinates and barrier addresses; 24 is setmaxnreg's minimum
PRODUCER_REGISTERS = 24
# registers of a consumer thread under setmaxnreg: FlashAttention-3 gives its two consumer
# warpgroups 240; with more of them, an even share of the 64K registers the producer leaves
CONSUMER_REGISTERS = 240
REGISTER_FILE = 64 * 1024


def consumer_registers(consumer_warpgroups: int, producer_registers: int = PRODUCER_REGISTERS) -> int:
    threads = consumer_partitions.WARPGROUP_THREADS
    share = (REGISTER_FILE - threads * producer_registers) // (consumer_warpgroups * threads)
    return min(CONSUMER_REGISTERS, share // 8 * 8)


def fragment_registers(kernel: ir.Kernel) -> int:
    """32-bit registers per thread that the kernel's fragments take, all of them together (an
    upper bound of what is live at once)."""
    total = 0
    for node in walk(kernel.body):
        if isinstance(node, ir.Alloc) and node.buffer.scope == "fragment" and node.buffer.view_of is None:
            bits = math.prod(node.buffer.shape) * node.buffer.dtype.bits
            total += -(-bits // (32 * kernel.threads))
    return total


def mode() -> str:
    """"on", "off" or "auto" (the default), from TRITILE_WARP_SPECIALIZE."""
    return schedule_switch("TRITILE_WARP_SPECIALIZE")


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    chosen = mode()
    if chosen == "off" or getattr(target, "kind", None) != "cuda" or not target.has_tma:
        return func
    loops = qualifying_loops(func, target)
    if not loops:
        return func
    if chosen == "auto" and not (consumer_partitions.several_warpgroups(func.kernel)
                                 and fragment_registers(func.kernel) <= consumer_registers(
                                     func.kernel.threads // consumer_partitions.WARPGROUP_THREADS)
                                 and allocated_at_once_bytes(func, warp_specialized=True)
                                 <= target.shared_memory_limit):
        return func
    plan = ir.WarpSpecialization(PRODUCER_WARPS, PRODUCER_REGISTERS, tuple(loop.var.name for loop in loops),
                                 tuple(copy.dst.buffer.name for copy in tile_loads(func, target)))
    return dataclasses.replace(func, attrs={**func.attrs, "warp_specialization": plan})


def tile_loads(func: ir.PrimFunc, target) -> list:
    """The copies the producer can issue once per tile (see the module docstring)."""
    body = func.kernel.body
    top = top_level(body)
    writers = {}
    for node in walk(body):
        written = written_buffer(node)
        if written is not None:
            writers[id(written)] = writers.get(id(written), 0) + 1
    stored_by_tma = isel.tma_store_sources(func, target)
    known = {id(v) for v in func.kernel.block_vars} | {id(v) for v in func.runtime_vars}
    out = []
    for s in top:
        if _is_pipelined(s):
            break
        if isinstance(s, ir.Let) and _free_vars(s.value) <= known:
            known.add(id(s.var))
        if (isinstance(s, ir.Copy) and isel.uses_tma(s, target) and writers[id(s.dst.buffer)] == 1
                and id(s.dst.buffer) not in stored_by_tma and all(_free_vars(e) <= known for e in s.src.starts)):
            out.append(s)
    return out


def qualifying_loops(func: ir.PrimFunc, target) -> list:
    """The kernel's pipelined loops in program order when the kernel qualifies, else []."""
    body = func.kernel.body
    top = top_level(body)
    loops = [s for s in top if _is_pipelined(s)]
    if not loops or sum(_is_pipelined(n) for n in walk(body)) != len(loops):
        return []
    copies = [n for n in walk(body) if isinstance(n, ir.AsyncCopy)]
    if not copies or any(c.iteration is None or not isel.uses_tma(c, target) for c in copies):
        return []
    known = {id(v) for v in func.kernel.block_vars} | {id(v) for v in func.runtime_vars}
    for s in top:
        if isinstance(s, ir.Let) and _free_vars(s.value) <= known:
            known.add(id(s.var))
        if _is_pipelined(s) and not _steady_state_ok(s, known):
            return []
    return loops


def _steady_state_ok(loop: ir.For, known: set) -> bool:
    stmts = loop.body.stmts
    commits = [i for i, s in enumerate(stmts) if isinstance(s, ir.CommitGroup)]
    if len(commits) != 1:
        return False
    for i, s in enumerate(stmts):
        inside = [n for n in walk(s) if isinstance(n, ir.AsyncCopy)]
        if not inside:
            continue
        if not isinstance(s, ir.AsyncCopy) or i > commits[0]:
            return False
    allowed = known | {id(loop.var)}
    copies = [s for s in stmts if isinstance(s, ir.AsyncCopy)]
    exprs = [loop.stop] + [e for c in copies for e in (*c.src.starts, *c.dst.starts, c.iteration)]
    # the producer recomputes each of these; a value read from a buffer (a one-stage loop's
    # `<name>_slot` variable, which the consumers keep) it cannot
    return all(_free_vars(e) <= allowed and not _reads_buffer(e) for e in exprs)


def _is_pipelined(s) -> bool:
    return isinstance(s, ir.For) and s.pipelined_from > 0


def _reads_buffer(e) -> bool:
    return isinstance(e, ir.Expr) and any(isinstance(n, ir.Load) for n in walk(e))


def _free_vars(e) -> set:
    if not isinstance(e, ir.Expr):  # a static int
        return set()
    return {id(n) for n in walk(e) if isinstance(n, ir.Var)}
