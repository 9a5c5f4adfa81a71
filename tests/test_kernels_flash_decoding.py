"""examples/flash_decoding.py: the one-kernel path (`decode_fused`: the last split program of
each (batch, kv head) combines, then resets its counter) and the two-kernel path against
torch's SDPA, at small sizes with ragged key counts (not multiples of the key tile nor of the
split size) and several split counts; the fused kernel's counters back at 0 after every call,
its result independent of which program arrives last, and its sm_90 code: one kernel, every
partial stored before a `bar.sync` before the counter's acq_rel atomic, the combine's loads
plain `ld.global` after it (module docstring of the example: why that is enough)."""
import itertools
import random
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
import triton
from torch.nn.functional import scaled_dot_product_attention as sdpa

from triton.backends.nvidia.compiler import get_ptxas

import tritile
from tritile.interpreter import executor
from test_kernels_examples import load_example

D = load_example("flash_decoding")
BATCH, HEADS, KV_HEADS, DIM = 2, 8, 2, 32
TILES = dict(block_N=32, block_H=16, num_stages=1)


def inputs(seq: int, device: str, batch: int = BATCH, heads: int = HEADS, kv_heads: int = KV_HEADS, dim: int = DIM):
    q = torch.randn(batch, heads, dim, dtype=torch.float16, device=device)
    k, v = (torch.randn(batch, kv_heads, seq, dim, dtype=torch.float16, device=device) for _ in range(2))
    return q, k, v


def reference(q, k, v):
    return sdpa(q[:, :, None].float(), k.float(), v.float(), enable_gqa=True)[:, :, 0].half()


def workspaces(num_split: int, device: str, batch: int = BATCH, heads: int = HEADS, kv_heads: int = KV_HEADS,
               dim: int = DIM):
    """decode_fused's partials and counters (zeroed once)."""
    return (torch.empty(batch, heads, num_split, dim, device=device), torch.empty(batch, heads, num_split, device=device),
            torch.zeros(batch, kv_heads, dtype=torch.int32, device=device))


# 200 keys: split sizes 128 / 96 / 64 keys for 2 / 3 / 4 splits, each a ragged last split and a
# ragged last tile; 256: whole tiles
@pytest.mark.parametrize("seq", [200, 256])
@pytest.mark.parametrize("num_split", [1, 2, 3, 4])
def test_fused_matches_sdpa_and_resets_its_counters(device, assert_close, seq, num_split):
    kernel = D.decode_fused(BATCH, HEADS, KV_HEADS, seq, DIM, num_split=num_split, **TILES)
    o_partial, lse_partial, count = workspaces(num_split, device)
    for _ in range(2):  # the second call needs the counters the first one reset
        q, k, v = inputs(seq, device)
        out = kernel(q, k, v) if num_split == 1 else kernel(q, k, v, o_partial, lse_partial, count)
        assert_close(out, reference(q, k, v))
        assert not count.any()


@pytest.mark.parametrize("num_split", [1, 2, 3])
def test_two_kernel_path_matches_sdpa(device, assert_close, num_split):
    run = D.decoder(BATCH, HEADS, KV_HEADS, 200, DIM, device, fused=False, num_split=num_split, **TILES)
    q, k, v = inputs(200, device)
    assert_close(run(q, k, v), reference(q, k, v))


def test_gqa_decode_calls_in_a_row_reuse_the_workspaces(device, assert_close):
    """The example's default entry point, both paths, three calls on fresh inputs; the fused
    decoder's counters (allocated at its first call) are reused by the later ones."""
    for fused in (True, False):
        for _ in range(3):
            q, k, v = inputs(200, device)
            assert_close(D.gqa_decode(q, k, v, fused=fused), reference(q, k, v))


def test_fused_result_does_not_depend_on_arrival_order(monkeypatch, gluon_backend):
    """The interpreter runs the programs in shuffled orders (each (batch, kv head) combined by
    another split's program): the outputs are bit-identical to launch order's and the counters
    end at 0."""
    kernel = tritile.compile(D.decode_fused.fn(BATCH, HEADS, KV_HEADS, 200, DIM, num_split=4, **TILES), out_idx=[-1])
    q, k, v = inputs(200, "cpu")
    o_partial, lse_partial, count = workspaces(4, "cpu")
    in_launch_order = kernel(q, k, v, o_partial, lse_partial, count)
    orders = []
    for seed in range(3):
        shuffle = random.Random(seed)

        def shuffled_product(*iterables):
            blocks = list(itertools.product(*iterables))
            shuffle.shuffle(blocks)
            orders.append(blocks)
            return blocks

        monkeypatch.setattr(executor, "itertools", type("shuffled", (), {"product": staticmethod(shuffled_product)}))
        assert torch.equal(kernel(q, k, v, o_partial, lse_partial, count), in_launch_order)
        assert not count.any()
    assert len(orders) == 3 and len(orders[0]) == 4 * KV_HEADS * BATCH  # the grid ran in those orders
    torch.testing.assert_close(in_launch_order, reference(q, k, v), rtol=1e-2, atol=1e-2)


def test_a_split_without_keys_is_a_value_error():
    with pytest.raises(ValueError, match=r"num_split=8 leaves split 7 without keys \(seq=200 in splits of 32 keys"):
        D.decode_fused(BATCH, HEADS, KV_HEADS, 200, DIM, num_split=8, **TILES)
    with pytest.raises(ValueError, match="num_split=8 leaves split 7 without keys"):
        D.decoder(BATCH, HEADS, KV_HEADS, 200, DIM, "cpu", fused=False, num_split=8, **TILES)


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_tile_config_leaves_no_split_without_keys(device_type):
    """Short caches take fewer splits (1 x 8 kv heads x 2100 keys would have asked for 16 splits of
    256 keys, 9 of them empty)."""
    for batch, kv_heads, seq in [(1, 8, 2100), (1, 1, 20), (1, 8, 130), (2, 1, 33), (8, 8, 32768)]:
        config = D.tile_config(device_type, batch, kv_heads, seq)
        D.split_keys(seq, config["num_split"], config["block_N"])
    assert D.tile_config("cuda", 1, 8, 2100)["num_split"] == 4 and D.tile_config("cpu", 1, 1, 20)["num_split"] == 1


def test_gqa_decode_of_a_cache_shorter_than_two_splits(device, assert_close):
    q, k, v = inputs(20, device)
    assert_close(D.gqa_decode(q, k, v), reference(q, k, v))


def after_the_counter(ptx: str) -> str:
    """The PTX from the counter's atomic on, checked that every partial store comes before a
    bar.sync that comes before the atomic."""
    assert ptx.count(".entry ") == 1
    assert ptx.count("atom.global.gpu.acq_rel.add") == 1
    atomic = ptx.index("atom.global.gpu.acq_rel.add")
    last_store = ptx.rfind("st.global", 0, atomic)
    assert 0 <= last_store < ptx.rfind("bar.sync", 0, atomic)
    # no partial leaves through a bulk (TMA) store, which the barrier would not order
    assert not re.search(r"cp\.async\.bulk\S*\.global\.shared", ptx[:atomic])
    return ptx[atomic:]


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_fused_kernel_on_sm90_orders_partials_counter_and_combine(backend):
    kernel = tritile.compile(D.decode_fused.fn(8, 64, 8, 32768, 128, **D.tile_config("cuda", 8, 8, 32768)),
                             out_idx=[-1], target="cuda:90", backend=backend)
    combine = after_the_counter(kernel.get_source("ptx"))
    broadcast, first_load = combine.find("bar.sync"), combine.find("ld.global")
    assert 0 <= broadcast < first_load  # thread 0's acquire reaches every thread through the barrier
    loads = re.findall(r"ld\.global\S*", combine)
    assert len(loads) >= 4 and all(".nc" not in load for load in loads), loads  # coherent loads of 4 splits
    assert not re.findall(r"cp\.async\S*\.shared\S*\.global", combine)  # no async-proxy (TMA / cp.async) reads
    sass = sass_from_the_counter(kernel.get_source("ptx"))
    # ptxas's release and acquire: a gpu-scope fence before the atomic, the SM's L1 invalidated
    # after it and before the barrier that lets the other threads load
    assert re.search(r"MEMBAR\.ALL\.GPU[^\n]*\n(.*\n){0,6}.*ATOMG\.E\.ADD\.STRONG\.GPU", sass["before"]), sass["before"]
    invalidate, barrier = sass["after"].find("CCTL.IVALL"), sass["after"].find("BAR.SYNC")
    assert 0 <= invalidate < barrier < sass["after"].find("LDG"), sass["after"][:2000]
    assert "CONSTANT" not in sass["after"]  # no load through the non-coherent (read-only) path


def sass_from_the_counter(ptx: str) -> dict:
    """The sm_90a SASS (ptxas and cuobjdump of Triton's toolchain) of `ptx`, split at the counter's
    atomic: "before" holds the lines up to and including it, "after" the rest."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        subprocess.run([get_ptxas(90).path, "-arch=sm_90a", str(src), "-o", str(cubin)], check=True)
        sass = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    lines = sass.splitlines()
    [atomic] = [i for i, line in enumerate(lines) if "ATOMG" in line]
    return {"before": "\n".join(lines[max(0, atomic - 8):atomic + 1]), "after": "\n".join(lines[atomic + 1:])}


def test_fused_kernel_without_a_split_has_no_counter():
    config = D.tile_config("cuda", 64, 8, 8192)
    assert config["num_split"] == 1
    ptx = tritile.compile(D.decode_fused.fn(64, 32, 8, 8192, 128, **config), out_idx=[-1],
                          target="cuda:90", backend="gluon").get_source("ptx")
    assert ptx.count(".entry ") == 1 and "atom." not in ptx and "wgmma" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_config_calls_are_bit_identical_whoever_arrives_last(fused):
    """The CUDA tiles (4 splits of 128-key tiles, wgmma) at a ragged cache length: 30 calls in a
    row, in which the last-arriving split of each kv head varies, give the same bits, close to
    SDPA."""
    batch, heads, kv_heads, seq, dim = 8, 64, 8, 4000, 128
    q, k, v = inputs(seq, "cuda", batch, heads, kv_heads, dim)
    run = D.decoder(batch, heads, kv_heads, seq, dim, "cuda", fused=fused)
    first = run(q, k, v)
    torch.testing.assert_close(first, reference(q, k, v), rtol=1e-2, atol=1e-2)
    for _ in range(30):
        assert torch.equal(run(q, k, v), first)
