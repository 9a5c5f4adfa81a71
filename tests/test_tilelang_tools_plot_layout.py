"""TileLang's `tilelang.tools.plot_layout` (examples/plot_layout/layout_transform.py): the mapping it
draws, and without matplotlib a clear ImportError."""
import importlib.util

import pytest
import torch

import tritile.language as T
from tritile.tools import plot_layout
from tritile.tools.plot_layout import layout_table


def test_layout_table_and_plot(tmp_path):
    perm = torch.randperm(8).tolist()
    layout = T.Layout([2, 4, 8], lambda i, j, k: (perm[k], i * 4 + j))
    table = layout_table(layout)
    assert len(table) == 64 and table[(1, 2, 5)] == (perm[5], 6)
    frag = T.Fragment([4, 8], forward_thread_fn=lambda i, j: i * 2 + j // 4, forward_index_fn=lambda i, j: j % 4)
    assert layout_table(frag)[(3, 6)] == (7, (2,))
    with pytest.raises(TypeError, match="Expected T.Layout or T.Fragment"):
        layout_table(3)
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ImportError, match="plot_layout draws with matplotlib, which is not installed"):
            plot_layout(layout, save_directory=str(tmp_path), name="x")
    else:
        plot_layout(layout, save_directory=str(tmp_path), name="x", formats="png")
        assert (tmp_path / "x.png").exists()
