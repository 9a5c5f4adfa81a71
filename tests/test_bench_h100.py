"""bench/bench_h100.py and bench/tilelang_peer.py on the CPU: the rows the GPU run assembles (every
candidate checked against torch, errors recorded, ratios), the TileLang column's import rules, and
TileLang's GEMM / FlashAttention programs themselves - run through tritile's TileLang front end
and interpreter at small sizes, so a wrong program is caught before it reaches TileLang on a GPU."""
import json
import os
import sys

import pytest
import torch

import tritile
import tritile.language

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")


@pytest.fixture
def bench(monkeypatch):
    """bench_h100 and tilelang_peer with CUDA tensors made on the CPU and a timer that calls once
    and reports 1 ms; TileLang's programs compiled by tritile (a stand-in for the real package)."""
    monkeypatch.syspath_prepend(BENCH)
    import bench_h100
    import tilelang_peer

    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, **kw: randn(*shape, **kw))
    monkeypatch.setattr(bench_h100, "bench", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(tilelang_peer, "_loaded", (tritile, None))
    monkeypatch.setitem(sys.modules, "tilelang", tritile)
    monkeypatch.setitem(sys.modules, "tilelang.language", tritile.language)
    return bench_h100


def test_gemm_row_checks_every_candidate_and_gives_both_ratios(bench):
    torch.manual_seed(0)
    [row] = bench.gemm_rows([(256, 256, 128)], [torch.float16], lambda r: None, {"available": True})
    for name in ("cublas", "tilelang", "tritile", "tritile_triton"):  # right results, timed
        assert row[name + "_rel_err"] < 1e-3 and row[name] == pytest.approx(2 * 256 * 256 * 128 / 1e-3 / 1e12)
    assert row["triton"] == 0.0 and "triton_error" in row  # Triton's TMA GEMM cannot run on the CPU
    assert row["ratio"] == pytest.approx(1.0) and row["gluon_over_triton"] == pytest.approx(1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_row_without_tilelang_reads_not_run(bench, causal):
    torch.manual_seed(1)
    [row] = bench.attention_rows([(1, 2, 128, 64, causal)], lambda r: None, {"available": False})
    assert row["tilelang"] is None and "tilelang_rel_err" not in row
    assert row["tritile_rel_err"] < 1e-3 and row["tritile_triton_rel_err"] < 1e-3
    assert "n/a" in bench.summary([row])


@pytest.mark.filterwarnings("ignore:pass_configs key 'tl.enable_fast_math'")  # TileLang's option, no-op in tritile
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_tilelang_attention_program_matches_torch(bench, dim, causal):
    import tilelang_peer
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 256, dim, dtype=torch.float16) for _ in range(3))
    kernel = tilelang_peer.attention(1, 2, 256, dim, causal)
    ref = sdpa(q.float(), k.float(), v.float(), is_causal=causal)
    assert bench.rel_err(kernel(q, k, v), ref) < 2e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tilelang_gemm_tuned_tile_matches_torch(bench, monkeypatch, dtype):
    import tilelang_peer

    tuned = tilelang_peer.gemm_config(8192, 8192, 8192)
    assert (tuned["block_M"], tuned["block_N"], tuned["block_K"], tuned["threads"]) == (128, 256, 64, 256)
    monkeypatch.setattr(tilelang_peer, "gemm_config", lambda M, N, K: tuned)
    a, b = torch.randn(256, 128, dtype=dtype), torch.randn(128, 512, dtype=dtype)
    assert bench.rel_err(tilelang_peer.gemm(256, 512, 128, dtype)(a, b), a.float() @ b.float()) < 1e-2


def test_finish_row_marks_failures_zero_and_absent_candidates_null(bench):
    row = bench.finish_row({}, {"cublas": 2.0, "tritile": 1.0}, 2e12, bench.GEMM_LIBRARIES, ("tilelang",))
    assert (row["tilelang"], row["triton"], row["tritile_triton"]) == (None, 0.0, 0.0)
    assert row["ratio"] == pytest.approx(2.0) and row["gluon_over_triton"] is None


def test_quick_run_covers_tilelangs_tuned_shape():
    sys.path.insert(0, BENCH)
    import bench_h100

    quick = bench_h100.cases(quick=True)
    assert (8192, 8192, 8192) in quick["gemm"] and quick["dtypes"] == [torch.float16]
    assert len(quick["attention"]) == 1
    full = bench_h100.cases(quick=False)
    assert full["attention_bwd"] and full["fp8"] == [4096, 8192] and full["decode"]


def test_attention_backward_row_checks_the_gradients_of_both_backends(bench):
    torch.manual_seed(3)
    [row] = bench.attention_bwd_rows([(1, 2, 96, 32, True)], lambda r: None)
    assert row["tritile_rel_err"] < 1e-2 and row["tritile_triton_rel_err"] < 1e-2
    assert row["tritile"] == pytest.approx(2.5 * 4 * 2 * 96 * 96 * 32 * 0.5 / 1e-3 / 1e12)
    assert "cudnn_error" in row  # SDPA's cuDNN backward needs a GPU
    assert "attn bwd 1x2x96x32 causal" in bench.summary([row])


def test_fp8_row_measures_accuracy_against_fp64(bench):
    torch.manual_seed(4)
    [row] = bench.fp8_rows([64], lambda r: None, {"available": True})
    for name in ("tilelang", "tritile", "tritile_triton"):
        assert row[name + "_rel_err"] < 1e-2 and row[name + "_max_err"] < 2e-2, (name, row)
    assert row["tilelang_config"]["block_N"] == 256


def test_fp8_sweep_checks_and_times_every_variant(bench, monkeypatch, tmp_path):
    """bench/gemm_fp8_h100.py --variants on the CPU (640^3: five k-steps, more than any sweep
    kernel's stages, and ragged 128x256 tiles; the interpreter running the sweep's CUDA tiles):
    every variant of SWEEP, TileLang's kernel and cuBLASLt's `torch._scaled_mm` checked against
    the fp64 product, timed together (one timer call each per rotation) and written."""
    import gemm_fp8_h100

    timed = []
    monkeypatch.setattr(gemm_fp8_h100, "bench", lambda fn: (timed.append(fn), 1.0)[1])  # each was run when built
    torch.manual_seed(7)
    out = tmp_path / "variants.json"
    gemm_fp8_h100.main(["--variants", "--sizes", "640", "--out", str(out)])
    [row] = json.loads(out.read_text())["rows"]
    assert [entry["variant"] for entry in row["tritile"]] == gemm_fp8_h100.SWEEP
    for entry in row["tritile"]:
        assert "error" not in entry and entry["ms"] == 1.0 and entry["over_best_library"] == 1.0, entry
        if not entry["variant"].startswith("plain"):
            assert entry["max_rel_to_max"] < 2e-3 and entry["producer"], entry
            assert entry["released_ahead"] == entry["variant"].endswith("-ahead"), entry
    assert row["cublaslt"]["max_rel_to_max"] < 2e-3 and row["tilelang"]["max_rel_to_max"] < 2e-2
    assert len(timed) == bench.ROTATIONS * (len(gemm_fp8_h100.SWEEP) + 2)  # every candidate, every round


def test_decode_row_reads_bandwidth_and_the_copy(bench):
    torch.manual_seed(5)
    [row] = bench.decode_rows([(2, 8, 2, 256, 32)], lambda r: None)
    assert row["tritile_rel_err"] < 1e-2 and row["tritile_triton_rel_err"] < 1e-2
    cache_bytes = 2 * 2 * 2 * 256 * 32 * 2
    assert row["tritile"] == pytest.approx(cache_bytes / 1e-3 / 1e12) and row["of_copy"] == pytest.approx(1.0)


def test_flash_decoding_fused_dry_run_checks_and_times_every_candidate(monkeypatch, tmp_path):
    """bench/flash_decoding_h100.py --fused --dry: the one-kernel comparison at tiny shapes on the
    interpreter - every tritile candidate checked against SDPA and timed, cuDNN's failure on the
    CPU recorded, the json written with its rows."""
    monkeypatch.syspath_prepend(BENCH)
    import bench_h100
    import flash_decoding_h100

    monkeypatch.setattr(bench_h100, "bench", bench_h100.bench)  # --dry replaces it; restored after the test
    torch.manual_seed(6)
    out = tmp_path / "fused.json"
    rows = flash_decoding_h100.main(["--fused", "--dry", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == rows and len(rows) == len(flash_decoding_h100.DRY_SHAPES)
    names = {"two_kernel", "fused", "fused_num_split1", "fused_num_split3"}
    for row in rows:
        assert set(row["configs"]) == names and row["configs"]["fused_num_split3"]["num_split"] == 3
        for name in names:
            assert row[name + "_rel_err"] < 1e-2 and row["ms"][name] > 0 and name in row["of_copy"], (name, row)
        assert "cudnn_error" in row and row["ratio_to_cudnn"] is None


@pytest.fixture
def peer(monkeypatch, tmp_path):
    """tilelang_peer with its import forgotten and a fake TileLang site at tmp_path."""
    monkeypatch.syspath_prepend(BENCH)
    import tilelang_peer

    monkeypatch.setattr(tilelang_peer, "_loaded", None)
    monkeypatch.delitem(sys.modules, "tilelang", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "tilelang").mkdir()
    (tmp_path / "tilelang" / "__init__.py").write_text("__version__ = '0.1.15'\n")
    return tilelang_peer


def test_tilelang_column_without_a_site_is_not_available(peer, monkeypatch):
    monkeypatch.delenv("TILELANG_SITE", raising=False)
    status = peer.status()
    assert not status["available"] and "TILELANG_SITE" in status["reason"], status
    assert peer.gemm(128, 128, 128, torch.float16) is None and peer.attention(1, 1, 128, 64, False) is None


def test_tilelang_from_the_site_is_imported(peer, monkeypatch, tmp_path):
    monkeypatch.setenv("TILELANG_SITE", str(tmp_path))
    status = peer.status()
    assert status["available"] and status["version"] == "0.1.15", status
    assert sys.modules["tilelang"].__file__.startswith(str(tmp_path))
    assert not tritile.__file__.startswith(str(tmp_path))


def test_tilelang_alias_to_tritile_is_refused(peer, monkeypatch, tmp_path):
    monkeypatch.setenv("TILELANG_SITE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "tilelang", tritile)  # TileLang's example runner's alias
    status = peer.status()
    assert not status["available"] and "alias" in status["reason"], status


def test_tilelang_whose_import_crashes_is_not_available(peer, monkeypatch, tmp_path):
    (tmp_path / "tilelang" / "__init__.py").write_text("import os\nos.abort()\n")
    monkeypatch.setenv("TILELANG_SITE", str(tmp_path))
    status = peer.status()
    assert not status["available"] and "child" in status["reason"], status
    json.dumps(status)


def test_z3_of_the_site_is_found_when_it_holds_only_a_versioned_library(peer, monkeypatch, tmp_path):
    (tmp_path / "z3" / "lib").mkdir(parents=True)
    (tmp_path / "z3" / "lib" / "libz3.so.4.15").write_bytes(b"")
    monkeypatch.delenv("Z3_LIBRARY_PATH", raising=False)
    peer._find_z3_library(str(tmp_path))
    link = os.path.join(os.environ["Z3_LIBRARY_PATH"].split(os.pathsep)[0], "libz3.so")
    assert os.path.realpath(link) == str((tmp_path / "z3" / "lib" / "libz3.so.4.15").resolve())


def test_unknown_section_is_refused_with_the_list(capsys):
    sys.path.insert(0, BENCH)
    import bench_h100

    with pytest.raises(SystemExit):
        bench_h100.main(["--sections", "gemm,attn"])
    assert "unknown section(s) attn" in capsys.readouterr().err

