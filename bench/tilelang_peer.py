"""TileLang itself as a column of bench_h100.py: its GEMM and FlashAttention forward, written with
`import tilelang` and `tilelang.language`, compiled by TileLang's own (TVM) compiler.

TileLang is not a dependency of tritile.  It is imported from the directory `TILELANG_SITE` names
(an unpacked site-packages holding tilelang, tvm_ffi, z3 and torch_c_dlpack_ext), put first on
`sys.path` only when that variable is set, and only once tritile is imported, so nothing of
tritile's can resolve to it.  Its programs: GEMM, FP8 GEMM and FlashAttention forward.  The import must give the package inside `TILELANG_SITE`: a process
where `tilelang` is tritile under an alias (TileLang's example runner installs one) or another
install gets no TileLang column, with the reason.  `status()` says whether TileLang is there (and
why not); `gemm(...)` / `attention(...)` return a compiled kernel, or None when it is not.
"""
import glob
import importlib
import os
import subprocess
import sys
import tempfile

EXPECTED_VERSION = "0.1.15"

_loaded = None  # (module or None, reason or None), the first import's answer


def _load():
    global _loaded
    if _loaded is None:
        _loaded = _import_from_site(os.environ.get("TILELANG_SITE"))
    return _loaded


def _import_from_site(site):
    """(tilelang module, None), or (None, why there is none)."""
    if not site:
        return None, "TILELANG_SITE is not set (the directory of an unpacked TileLang site-packages)"
    site = os.path.realpath(site)
    if not os.path.isdir(os.path.join(site, "tilelang")):
        return None, f"TILELANG_SITE={site} holds no tilelang package"
    _find_z3_library(site)
    # a trial import in a child first: an install that crashes its importer must not end the benchmark
    probe = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {site!r}); import tilelang"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return None, f"import tilelang failed in a child (exit {probe.returncode}): {probe.stderr.strip()[-300:]}"
    import tritile  # noqa: F401  (imported before the site is on the path: it cannot shadow tritile's modules)

    if site not in sys.path:
        sys.path.insert(0, site)
    try:
        module = importlib.import_module("tilelang")
    except Exception as err:  # a broken or incompatible install: no column, the reason recorded
        return None, f"import tilelang failed: {type(err).__name__}: {str(err)[:300]}"
    where = os.path.realpath(getattr(module, "__file__", None) or "")
    if not where.startswith(site + os.sep):
        return None, (f"import tilelang gave {module.__name__} from {where or 'nowhere'}, not the package in "
                      f"{site} (an alias such as tilelang -> tritile, or another install, came first)")
    return module, None


def _find_z3_library(site: str) -> None:
    """z3 (which TileLang imports) loads `libz3.so` from its `lib` directory, then from
    `Z3_LIBRARY_PATH`, then the system's; an unpacked wheel may hold only `libz3.so.<version>`,
    and a system libz3 of another version fails on a missing symbol.  Point `Z3_LIBRARY_PATH` at a
    private directory where `libz3.so` is a link to the site's own library."""
    lib = os.path.join(site, "z3", "lib")
    versioned = sorted(glob.glob(os.path.join(lib, "libz3.so.*")))
    if os.path.exists(os.path.join(lib, "libz3.so")) or not versioned:
        return
    links = tempfile.mkdtemp(prefix="tilelang_peer_z3_")
    os.symlink(versioned[-1], os.path.join(links, "libz3.so"))
    os.environ["Z3_LIBRARY_PATH"] = os.pathsep.join(filter(None, (links, os.environ.get("Z3_LIBRARY_PATH"))))


def status() -> dict:
    """What the benchmark records about its TileLang column."""
    module, reason = _load()
    if module is None:
        return {"available": False, "reason": reason}
    version = str(getattr(module, "__version__", "unknown"))
    out = {"available": True, "version": version, "path": os.path.dirname(module.__file__)}
    if not version.startswith(EXPECTED_VERSION):
        out["note"] = f"expected TileLang {EXPECTED_VERSION}"
    # TileLang builds its kernels with nvcc: without a CUDA toolkit they fail (recorded per row)
    out["cuda_home"] = str(getattr(getattr(module, "env", None), "CUDA_HOME", "") or "") or None
    return out


def gemm_config(M: int, N: int, K: int) -> dict:
    """TileLang's tuned H100 configuration (128x256x64, three stages, two warpgroups, rasterised in
    panels of 10: 1.04-1.05x cuBLAS at 8192^3 in the issue's run) wherever its tiles fill the GPU;
    its example's defaults (128x128x32, 3 stages, 128 threads) for smaller problems.  The example's
    defaults at 4096^3 read 373 TFLOP/s (bench/NOTES.md), no fair peer."""
    if M >= 2048 and N >= 2048:
        return dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256, panel=10)
    return dict(block_M=128, block_N=128, block_K=32, num_stages=3, threads=128, panel=0)


def attention_config(dim: int) -> dict:
    """The tile of TileLang's FlashAttention example's tuning list (its only entry)."""
    return dict(block_M=128, block_N=128, num_stages=2, threads=256)


def gemm_fp8_config() -> dict:
    """TileLang's FP8 tile on the H100 as the issue measured it (1316 / 1308 TFLOP/s at 4096^3 /
    8192^3): 128x256x128, four stages, two warpgroups, B K-major; no promotion of the partial sums."""
    return dict(block_M=128, block_N=256, block_K=128, num_stages=4, threads=256, panel=10)


def gemm_fp8(M: int, N: int, K: int):
    """TileLang's kernel for C = (A @ B^T) * Scales[0] * Scales[1] in fp16, A [M, K] and B [N, K]
    e4m3 (its example_tilelang_gemm_fp8.py with the tuned tile, per-tensor scales and an fp16
    output as torch._scaled_mm has them), or None."""
    tilelang, _ = _load()
    if tilelang is None:
        return None
    import tilelang.language as T

    cfg = gemm_fp8_config()
    block_M, block_N, block_K, threads = cfg["block_M"], cfg["block_N"], cfg["block_K"], cfg["threads"]
    num_stages, panel = cfg["num_stages"], cfg["panel"]

    @T.prim_func
    def matmul(A: T.Tensor((M, K), "float8_e4m3"), B: T.Tensor((N, K), "float8_e4m3"),
               Scales: T.Tensor((2,), "float32"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float8_e4m3")
            B_shared = T.alloc_shared((block_N, block_K), "float8_e4m3")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.use_swizzle(panel_size=panel)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] = C_local[i, j] * (Scales[0] * Scales[1])
            T.copy(C_local, C[by * block_M, bx * block_N])

    return tilelang.compile(matmul, out_idx=[3], target="cuda")


def gemm(M: int, N: int, K: int, dtype):
    """TileLang's kernel for C = A @ B (A [M, K], B [K, N], dtype a torch half type), or None."""
    tilelang, _ = _load()
    if tilelang is None:
        return None
    import tilelang.language as T

    cfg = gemm_config(M, N, K)
    block_M, block_N, block_K, threads = cfg["block_M"], cfg["block_N"], cfg["block_K"], cfg["threads"]
    num_stages, panel = cfg["num_stages"], cfg["panel"]
    dt = str(dtype).replace("torch.", "")

    @T.prim_func
    def matmul(A: T.Tensor((M, K), dt), B: T.Tensor((K, N), dt), C: T.Tensor((M, N), dt)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dt)
            B_shared = T.alloc_shared((block_K, block_N), dt)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            if panel > 0:  # a Python bool: TVMScript takes no other compile-time condition
                T.use_swizzle(panel_size=panel)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return tilelang.compile(matmul, out_idx=[2], target="cuda")


def attention(batch: int, heads: int, seq: int, dim: int, causal: bool):
    """TileLang's FlashAttention forward for fp16 q, k, v [batch, heads, seq, dim] (softmax scale
    1/sqrt(dim)), fast math on as in TileLang's example, or None."""
    tilelang, _ = _load()
    if tilelang is None:
        return None
    import tilelang.language as T

    cfg = attention_config(dim)
    block_M, block_N, num_stages, threads = cfg["block_M"], cfg["block_N"], cfg["num_stages"], cfg["threads"]
    shape = [batch, heads, seq, dim]
    causal = bool(causal)  # a compile-time branch below
    scale = dim ** -0.5 * 1.44269504  # exp(x) = exp2(x * log2(e))
    dt, acc = "float16", "float32"

    @T.prim_func
    def flash(Q: T.Tensor(shape, dt), K: T.Tensor(shape, dt), V: T.Tensor(shape, dt), O: T.Tensor(shape, dt)):
        with T.Kernel(T.ceildiv(seq, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared([block_M, dim], dt)
            K_s = T.alloc_shared([block_N, dim], dt)
            V_s = T.alloc_shared([block_N, dim], dt)
            O_s = T.alloc_shared([block_M, dim], dt)
            s = T.alloc_fragment([block_M, block_N], acc)
            p = T.alloc_fragment([block_M, block_N], dt)
            o = T.alloc_fragment([block_M, dim], acc)
            m = T.alloc_fragment([block_M], acc)
            m_prev = T.alloc_fragment([block_M], acc)
            rescale = T.alloc_fragment([block_M], acc)
            row_sum = T.alloc_fragment([block_M], acc)
            denom = T.alloc_fragment([block_M], acc)

            T.copy(Q[bz, by, bx * block_M:(bx + 1) * block_M, :], Q_s)
            T.fill(o, 0)
            T.fill(denom, 0)
            T.fill(m, -T.infinity(acc))
            steps = (T.min(T.ceildiv(seq, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if causal
                     else T.ceildiv(seq, block_N))
            for kb in T.Pipelined(steps, num_stages=num_stages):
                T.copy(K[bz, by, kb * block_N:(kb + 1) * block_N, :], K_s)
                if causal:
                    for i, j in T.Parallel(block_M, block_N):
                        s[i, j] = T.if_then_else(bx * block_M + i >= kb * block_N + j, 0, -T.infinity(acc))
                else:
                    T.clear(s)
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m, m_prev)
                T.reduce_max(s, m, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    m[i] = T.max(m[i], m_prev[i])
                for i in T.Parallel(block_M):
                    rescale[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    s[i, j] = T.exp2(s[i, j] * scale - m[i] * scale)
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    denom[i] = denom[i] * rescale[i] + row_sum[i]
                T.copy(s, p)
                for i, j in T.Parallel(block_M, dim):
                    o[i, j] *= rescale[i]
                T.copy(V[bz, by, kb * block_N:(kb + 1) * block_N, :], V_s)
                T.gemm(p, V_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                o[i, j] /= denom[i]
            T.copy(o, O_s)
            T.copy(O_s, O[bz, by, bx * block_M:(bx + 1) * block_M, :])

    return tilelang.compile(flash, out_idx=[3], target="cuda",
                            pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
