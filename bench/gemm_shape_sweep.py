"""tritile.mm against cuBLAS (torch.mm) on the GEMMs of bench/torch_compile_h100.py's train step
(bf16, M = 8 x 2048 tokens): each forward X @ W, and the backward's dY @ W^T (B transposed in
place) and X^T @ dY (A transposed in place), for a few tile configurations; the ratio is cuBLAS
time / tritile time (> 1: tritile faster).  Writes $OUT/gemm_sweep.json (or --out).

    python bench/gemm_shape_sweep.py
"""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from tritile.ops.matmul import matmul, tile_config, _as_operand, SUPPORTED_DTYPES
from timing import median_ms

M = 16384
shapes = []
for K, N in ((1024, 3072), (1024, 1024), (1024, 4096), (4096, 1024)):
    shapes.append(("fwd", M, N, K, False, False))     # X @ W
    shapes.append(("dX", M, K, N, False, True))       # dY @ W^T  (W stored (K, N))
    shapes.append(("dW", K, N, M, True, False))       # X^T @ dY
configs = [dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256),
           dict(block_M=128, block_N=256, block_K=64, num_stages=4, threads=256),
           dict(block_M=256, block_N=128, block_K=64, num_stages=3, threads=256),
           dict(block_M=128, block_N=128, block_K=64, num_stages=4, threads=256),
           dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=384)]
out = []
for name, m, n, k, ta, tb in shapes:
    a = (torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if ta else torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if tb else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
    ref = median_ms(lambda: torch.mm(a, b), 30)
    (aa, fa), (bb, fb) = _as_operand(a), _as_operand(b)
    row = {"shape": [name, m, n, k, ta, tb], "cublas_ms": round(ref, 4), "configs": []}
    for cfg in configs:
        try:
            f = lambda: matmul(aa, bb, dtype=SUPPORTED_DTYPES[a.dtype], trans_A=fa, trans_B=fb, **cfg)
            got = f(); torch.cuda.synchronize()
            err = (got.float() - (a.float() @ b.float())).abs().max().item()
            t = median_ms(f, 30)
            row["configs"].append({**cfg, "ms": round(t, 4), "ratio": round(ref / t, 3), "maxerr": round(err, 3)})
        except Exception as exc:
            row["configs"].append({**cfg, "error": str(exc)[:120]})
    best = max((c for c in row["configs"] if "ms" in c), key=lambda c: c["ratio"], default=None)
    print(name, m, n, k, ta, tb, "cublas", round(ref, 3), "default", row["configs"][0].get("ratio"), "best", best and (best["ratio"], best["block_M"], best["block_N"], best["num_stages"], best["threads"]), flush=True)
    out.append(row)
path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.path.join(os.environ["OUT"], "gemm_sweep.json")
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": out}, open(path, "w"), indent=1)
