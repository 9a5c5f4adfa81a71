"""FlashAttention forward, written the TileLang way (example_mha_fwd_bhsd style).

The kernel is `examples/flash_attention.py`'s `flashattn` (lazy style, `out_idx=[3]`): online
softmax with a running max (`T.reduce_max(..., clear=False)`), `T.exp2` with the scale folded
together with log2(e), causal masking with `T.if_then_else`, pipelined K/V loop.  Checked on the
`device` fixture's tensors (CPU: the reference interpreter; CUDA: the Gluon kernel) against a
float32 torch softmax(QK^T / sqrt(d)) V.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flash_attention.py"


def load_example():
    spec = importlib.util.spec_from_file_location("tritile_example_flash_attention", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flash_attention = load_example()


@pytest.mark.parametrize("num_stages", [1, 2])
@pytest.mark.parametrize("seq_q, seq_kv", [(128, 128), (64, 192)])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_flash_attention_forward(is_causal, seq_q, seq_kv, num_stages, device, assert_close):
    batch, heads, dim = 2, 2, 64
    kernel = flash_attention.flashattn(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=64,
                                       block_N=64, num_stages=num_stages)
    q = torch.randn(batch, heads, seq_q, dim, dtype=torch.float16, device=device)
    k = torch.randn(batch, heads, seq_kv, dim, dtype=torch.float16, device=device)
    v = torch.randn(batch, heads, seq_kv, dim, dtype=torch.float16, device=device)
    assert_close(kernel(q, k, v), flash_attention.ref_program(q, k, v, is_causal))


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80 (the test's
# batch=2, heads=2, dim=64 shapes).
COMPILE_CASES = {
    f"flashattn-{'causal' if causal else 'full'}-{sq}x{skv}-s{stages}": (
        lambda causal=causal, sq=sq, skv=skv, stages=stages: flash_attention.flashattn(
            2, 2, sq, skv, 64, causal, block_M=64, block_N=64, num_stages=stages))
    for causal in (False, True) for sq, skv in ((128, 128), (64, 192)) for stages in (1, 2)
}
