"""TileLang's `tilelang.tools.plot_layout(layout, save_directory="./tmp", name="layout", ...)`: a grid
of a `T.Layout` (each input element labelled with its output index) or a `T.Fragment` (each element
labelled with its thread and local index), saved through matplotlib.  Without matplotlib it raises
an ImportError saying so; `layout_table(layout)` gives the labels it would draw."""
from __future__ import annotations

import itertools

from tritile.language.layout import Fragment, Layout


def layout_table(layout) -> dict:
    """{input index tuple: label}: a Fragment's (thread, local index), a Layout's output indices."""
    if not isinstance(layout, Layout):
        raise TypeError(f"Expected T.Layout or T.Fragment, but got {type(layout).__name__}.")
    table = {}
    for index in itertools.product(*[range(int(n)) for n in layout.get_input_shape()]):
        out = tuple(int(v) for v in layout.map_forward_index(index))
        if isinstance(layout, Fragment):
            table[index] = (int(layout.map_forward_thread(index)), out)
        else:
            table[index] = out
    return table


def plot_layout(layout, save_directory="./tmp", name: str = "layout", colormap: str = None, verbose: bool = False,
                formats="pdf", view: str = "input", grid_shape=None) -> None:
    table = layout_table(layout)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("tilelang.tools.plot_layout draws with matplotlib, which is not installed "
                          "(pip install matplotlib); layout_table(layout) of tritile.tools.plot_layout gives the "
                          "mapping it would draw") from None
    import os

    shape = [int(n) for n in layout.get_input_shape()]
    rows = shape[0] if len(shape) > 1 else 1
    cols = len(table) // rows
    if grid_shape is not None:
        rows, cols = grid_shape
    fig, ax = plt.subplots(figsize=(max(4, cols * 0.6), max(3, rows * 0.6)))
    cmap = plt.get_cmap(colormap or ("RdPu" if isinstance(layout, Fragment) else "Spectral"))
    labels = list(table.values())
    for n, label in enumerate(labels):
        r, c = divmod(n, cols)
        key = label[0] if isinstance(layout, Fragment) else n
        ax.add_patch(plt.Rectangle((c, r), 1, 1, color=cmap((hash(key) % 16) / 16), ec="black"))
        text = f"T{label[0]}\nL{','.join(map(str, label[1]))}" if isinstance(layout, Fragment) \
            else ",".join(map(str, label))
        ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=6)
        if verbose:
            print(list(table)[n], "->", label)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    os.makedirs(save_directory, exist_ok=True)
    wanted = ["pdf", "png", "svg"] if formats == "all" else [f.strip() for f in str(formats).split(",")]
    for fmt in wanted:
        path = os.path.join(save_directory, f"{name}.{fmt}")
        fig.savefig(path, bbox_inches="tight")
        print(f"Saved {fmt} format into {path}")
    plt.close(fig)
