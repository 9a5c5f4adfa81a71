"""Pending what-if (issue #19, not yet run on a GPU): examples/gemm_fp8.py's CUDA kernel with its B
tile loaded once per 2-CTA cluster by TMA multicast, against the same kernel unpatched and
cuBLASLt (`torch._scaled_mm`), interleaved in one process.

Gluon 3.6 has no multicast TMA (3.7 adds it) and Triton 3.6's TMA lowering says "NYI: Support
multicast", so the what-if patches the PTX of the persistent, warp-specialized FP8 kernel
(`multicast_ptx`) and launches it on clusters of two CTAs (Triton's launcher takes `num_ctas` from
the packed metadata: gridDimX = gridX * num_ctas, cluster dim x = num_ctas):
* the persistent programs 2c and 2c+1 always hold the tiles 2m and 2m+1 of a round (the rounds
  alternate direction over an even program count, and the tile count is even); with the panel
  order of `T.use_swizzle`, whose panels are an even number of tile rows, those two tiles share
  their column of B (`bx`), and differ in A's rows;
* each CTA loads half of B's rows (the TMA box halved in the descriptor) into its own offset of
  the slot, multicast into both CTAs: each CTA's full barrier still receives the whole tile's bytes;
* each slot's empty barrier counts the consumer releases of both CTAs (a remote arrive through
  `mapa` per release), so neither producer overwrites a slot the partner still reads;
* the mbarriers are initialised at the kernel's top by all threads' first instructions and made
  visible to the cluster (`fence.mbarrier_init` and a cluster barrier) before any partition runs;
  a cluster barrier before `ret` keeps a CTA alive while its partner may still arrive on it.
What it measures: whether fewer L2 -> SM bytes (B's half) close the 8192³ gap, where the H100 is
power-bound (bench/NOTES.md, session 23: cuBLASLt runs 2-CTA clusters with multicast there).

usage: PYTHONPATH=$PWD python bench/multicast_whatif.py OUT_JSON [SIZE ...]   (a CUDA GPU; default 8192 4096)
       PYTHONPATH=$PWD python bench/multicast_whatif.py --programs N OUT_JSON [SIZE ...]   (N persistent programs)
       PYTHONPATH=$PWD python bench/multicast_whatif.py --dry                 (CPU: the patch applies and assembles)
"""
import ctypes
import json
import os
import re
import sys
import tempfile
import time

import torch
from triton import knobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
from gemm_fp8 import gemm_fp8, quantize, tile_config  # noqa: E402
from tritile.codegen.gluon import compiler as gluon_compiler  # noqa: E402
from tritile.lowering import persistent_tiles  # noqa: E402

B_DESC_PARAM = 14  # main(A, B, Scales, C, C_desc, A_desc, B_desc): a descriptor takes 5 parameters
B_TILE_ROWS, B_ROW_BYTES = 256, 128  # tile_config's block_N x block_K of e4m3
CONSUMER_PARTITIONS = 2  # each slot's empty barrier counts this many releases in one CTA

_INIT = re.compile(r"^\s*@%p\d+ mbarrier\.init\.shared::cta\.b64 \[(%r\d+)\], (\d+);\s*$", re.M)
_ARRIVE = re.compile(r"^(\s*)(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];\s*$", re.M)
_TMA = re.compile(r"^(\s*)(@%p\d+ )?cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes "
                  r"\[(%r\d+)\], \[(%rd\d+), \{(%r\d+), (%r\d+)\}\], \[(%r\d+)\];\s*$", re.M)


def multicast_ptx(ptx: str) -> str:
    """The FP8 kernel's PTX with B multicast across a 2-CTA cluster (the module docstring)."""
    half_rows = B_TILE_ROWS // 2
    half_bytes = half_rows * B_ROW_BYTES
    inits = []
    for m in _INIT.finditer(ptx):
        reg, count = m.group(1), int(m.group(2))
        offset = int(re.search(rf"add\.s32 \s*{re.escape(reg)}, %r\d+, (\d+);", ptx).group(1))
        inits.append((offset, 2 * count if count == CONSUMER_PARTITIONS else count))
    assert inits, "no mbarrier inits"
    ptx = _INIT.sub("\t// multicast what-if: initialised at the kernel's top", ptx)
    top = ["{", "\t.reg .b32 %mc_base, %mc_addr, %mc_tid;", "\t.reg .pred %mc_first;",
           "\tmov.b32 %mc_base, global_smem;", "\tmov.u32 %mc_tid, %tid.x;", "\tsetp.eq.u32 %mc_first, %mc_tid, 0;"]
    for offset, count in inits:
        top += [f"\tadd.s32 %mc_addr, %mc_base, {offset};",
                f"\t@%mc_first mbarrier.init.shared::cta.b64 [%mc_addr], {count};"]
    top += ["\tfence.mbarrier_init.release.cluster;", "\tbarrier.cluster.arrive.release.aligned;",
            "\tbarrier.cluster.wait.acquire.aligned;", "}"]
    assert "// %bb.0:\n" in ptx
    ptx = ptx.replace("// %bb.0:\n", "// %bb.0:\n" + "\n".join(top) + "\n", 1)

    def remote_release(m):
        indent, guard, reg = m.group(1), m.group(2) or "", m.group(3)
        return (f"{m.group(0).rstrip()}\n{indent}{{ .reg .b32 %mc_rank, %mc_remote; mov.u32 %mc_rank, %cluster_ctarank; "
                f"xor.b32 %mc_rank, %mc_rank, 1; mapa.shared::cluster.u32 %mc_remote, {reg}, %mc_rank; "
                f"{guard}mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%mc_remote]; }}")
    ptx, releases = _ARRIVE.subn(remote_release, ptx)
    assert releases, "no consumer releases"

    param = re.search(rf"mov\.b64 \s*(%rd\d+), main_param_{B_DESC_PARAM};", ptx).group(1)
    desc = re.search(rf"cvta\.param\.u64 \s*(%rd\d+), {re.escape(param)};", ptx).group(1)

    def multicast(m):
        indent, guard, dst, d, inner, outer, bar = m.groups()
        if d != desc:
            return m.group(0)
        return (f"{indent}{{ .reg .b32 %mc_rank, %mc_dst, %mc_row; .reg .b16 %mc_mask; mov.u32 %mc_rank, %cluster_ctarank; "
                f"mad.lo.s32 %mc_dst, %mc_rank, {half_bytes}, {dst}; mad.lo.s32 %mc_row, %mc_rank, {half_rows}, {outer}; "
                f"mov.b16 %mc_mask, 3; {guard or ''}cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                f".multicast::cluster [%mc_dst], [{d}, {{{inner}, %mc_row}}], [{bar}], %mc_mask; }}")
    ptx = _TMA.sub(multicast, ptx)
    assert ".multicast::cluster" in ptx, "no load of B found"
    assert ptx.count("\tret;") == 1
    return ptx.replace("\tret;", "\tbarrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n\tret;")


def gluon_kernels(kernel) -> tuple:
    """(unpatched, patched) GluonKernel of tritile JITKernel `kernel`; the patched one compiled
    into a private Triton cache, so no later process loads it as the unpatched kernel."""
    func = kernel._all_stages(kernel._plain)[-1][1]
    plain = gluon_compiler.compile_kernel(func, kernel.plan_target)

    def hook(backend, stages, options, language, capability):
        if "ptx" in stages:
            make = stages["ptx"]
            stages["ptx"] = lambda src, metadata: multicast_ptx(make(src, metadata))

    knobs.runtime.add_stages_inspection_hook = hook
    with tempfile.TemporaryDirectory() as private, knobs.cache.scope():
        knobs.cache.dir = private
        try:
            patched = gluon_compiler._compile(func, kernel.plan_target, f"multicast_{time.time_ns()}", True)
        finally:
            knobs.runtime.add_stages_inspection_hook = None
    return plain, patched


def runner(gk, cluster: bool):
    """`run(A, B, Scales, C)` launching GluonKernel `gk` directly; `cluster`: on 2-CTA clusters,
    B's TMA box halved."""
    from tritile.runtime.launcher import DescriptorSpec, DirectLaunch, kernel_launcher

    names = [p.name for p in gk.func.params]
    descriptors = list(gk.descriptors)
    if cluster:
        meta = gk.compiled.metadata.tensordesc_meta[2]  # the box the launcher encodes (one message)
        assert meta["block_size"] == [B_TILE_ROWS, B_ROW_BYTES], meta
        meta["block_size"] = [B_TILE_ROWS // 2, B_ROW_BYTES]
        descriptors[2] = DescriptorSpec((B_TILE_ROWS // 2, B_ROW_BYTES), descriptors[2].layout)
    direct = kernel_launcher(gk.compiled, descriptors, names)
    assert isinstance(direct, DirectLaunch), type(direct)  # Triton's own path would launch no cluster
    if not cluster:
        return lambda *args: gk._host_launch(direct, *args)
    warps, _, shared = gk.compiled.packed_metadata
    gk.compiled.packed_metadata = (warps, 2, shared)

    def launch(grid, *rest):
        assert grid[0] % 2 == 0, grid
        direct((grid[0] // 2, grid[1], grid[2]), *rest)

    return lambda *args: gk._host_launch(launch, *args)


def max_active_clusters(gk, programs: int) -> int:
    """cuOccupancyMaxActiveClusters of the patched kernel on clusters of 2 (negative: the error)."""
    class Attr(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]

    class Config(ctypes.Structure):
        _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("num_attrs", ctypes.c_uint)]

    attr = Attr(id=4)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value[0], attr.value[1], attr.value[2] = 2, 1, 1
    warps, _, shared = gk.compiled.packed_metadata
    config = Config((ctypes.c_uint * 3)(programs, 1, 1), (ctypes.c_uint * 3)(warps * 32, 1, 1), shared, None,
                    ctypes.pointer(attr), 1)
    count = ctypes.c_int(-1)
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters(
        ctypes.byref(count), ctypes.c_void_p(gk.compiled.function), ctypes.byref(config))
    return count.value if rc == 0 else -rc


def dry_run() -> None:
    """On any machine: both kernels compile for sm_90 and the patched PTX is the multicast one."""
    for size in (4096, 8192):
        plain, patched = gluon_kernels(gemm_fp8(size, size, size, **tile_config("cuda")))
        assert ".multicast::cluster" in patched.asm["ptx"] and ".multicast::cluster" not in plain.asm["ptx"]
        assert plain.compiled.metadata.tensordesc_meta[2]["block_size"] == [B_TILE_ROWS, B_ROW_BYTES]
        print(f"{size}: patched PTX assembled ({len(patched.asm['cubin'])} bytes of cubin)")


def main(out_path: str, sizes: list) -> None:
    from triton.testing import do_bench

    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "rows": []}
    for size in sizes:
        M = N = K = size
        a8, sa = quantize(torch.randn(M, K, device="cuda"))
        b8, sb = quantize(torch.randn(N, K, device="cuda"))
        scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
        plain_gk, patched_gk = gluon_kernels(gemm_fp8(M, N, K, **tile_config("cuda")))
        programs = persistent_tiles.num_sms(None)
        row = {"size": size, "programs": programs, "max_active_clusters": max_active_clusters(patched_gk, programs)}
        print(row, flush=True)
        plain, multicast = runner(plain_gk, False), runner(patched_gk, True)
        c0 = torch.empty(M, N, dtype=torch.float16, device="cuda")
        c1 = torch.full((M, N), 7.0, dtype=torch.float16, device="cuda")
        plain(a8, b8, scales, c0)
        torch.cuda.synchronize()
        multicast(a8, b8, scales, c1)
        torch.cuda.synchronize()
        exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
        row["bit_equal"] = bool(torch.equal(c0, c1))
        row["error_plain"] = ((c0.double() - exact).abs().max() / exact.abs().max()).item()
        row["error_multicast"] = ((c1.double() - exact).abs().max() / exact.abs().max()).item()
        print(row, flush=True)
        candidates = {"tritile": lambda: plain(a8, b8, scales, c0),
                      "tritile_multicast": lambda: multicast(a8, b8, scales, c1),
                      "cublaslt": lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa.float(), scale_b=sb.float(),
                                                           out_dtype=torch.float16)}
        names, samples = list(candidates), {name: [] for name in candidates}
        for rotation in range(5):  # the order rotated: a rested GPU runs its first timing faster
            for name in names[rotation % 3:] + names[:rotation % 3]:
                samples[name].append(do_bench(candidates[name], warmup=50, rep=300, return_mode="median"))
        for name, times in samples.items():
            ms = sorted(times)[len(times) // 2]
            row[name] = {"ms": ms, "tflops": 2 * M * N * K / ms / 1e9, "samples_ms": times}
        row["multicast_over_plain"] = row["tritile"]["ms"] / row["tritile_multicast"]["ms"]
        row["multicast_over_cublaslt"] = row["cublaslt"]["ms"] / row["tritile_multicast"]["ms"]
        row["plain_over_cublaslt"] = row["cublaslt"]["ms"] / row["tritile"]["ms"]
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:] == ["--dry"]:
        dry_run()
    else:
        args = sys.argv[1:]
        if args[0] == "--programs":  # fewer persistent programs than SMs: clusters that all fit at once
            programs = int(args[1])
            persistent_tiles.num_sms = lambda target: programs
            args = args[2:]
        main(args[0], [int(s) for s in args[1:]] or [8192, 4096])
