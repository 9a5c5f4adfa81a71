"""TileLang's layout functions, `T.Layout` and `T.Fragment`, for `T.annotate_layout`.

Contract
--------
* `Layout(shape, forward_fn)`: element ``(i0, i1, ...)`` of a buffer of `shape` is placed at
  ``forward_fn(i0, i1, ...)`` (one index or a list of them).  `Fragment(shape, forward_fn=...
  | forward_thread_fn=..., replicate=1, forward_index_fn=...)` also names the thread that holds
  each element (TileLang's signatures).  The functions are plain Python over indices: they are
  evaluated on ints, on IR expressions, or vectorised on torch integer tensors.
* `map_forward_index(indices)` / `map_forward_thread(indices)` / calling the layout apply them;
  `get_input_shape()` is `shape`; `get_output_shape()` the extent of each output index
  (evaluated over every element, vectorised).
* What tritile does with an annotation: on shared / fragment buffers a layout is a placement
  hint (tritile infers its own; an element's value never depends on where it lives).  On a
  global tensor tritile keeps logical addressing, in the interpreter and in generated code
  alike: a program gets TileLang's results wherever the tensor is written and read by kernels
  that annotate the same layout (FlashAttention backward's dQ accumulator and its
  post-processing kernel); a caller reading the raw tensor in between would see the logical
  order, not TileLang's permuted one.
"""
from __future__ import annotations

import torch


class Layout:
    """A map from a buffer's indices to the indices of where each element is placed."""

    def __init__(self, shape, forward_fn):
        self.shape = tuple(shape)
        self.forward_fn = forward_fn

    def get_input_shape(self) -> tuple:
        return self.shape

    def map_forward_index(self, indices) -> list:
        out = self.forward_fn(*indices)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def __call__(self, *indices) -> list:
        return self.map_forward_index(indices)

    def _grid(self) -> list:
        """Index tensors covering every element (broadcast against each other)."""
        ndim = len(self.shape)
        return [torch.arange(int(n)).view([-1 if d == k else 1 for d in range(ndim)])
                for k, n in enumerate(self.shape)]

    def get_output_shape(self) -> tuple:
        return tuple(int(torch.as_tensor(x).max()) + 1 for x in self.map_forward_index(self._grid()))

    def __repr__(self) -> str:
        return f"T.Layout({list(self.shape)}, {getattr(self.forward_fn, '__name__', 'fn')})"


class Fragment(Layout):
    """A layout of a register fragment: each element's thread and its index in that thread."""

    def __init__(self, shape, forward_fn=None, forward_thread_fn=None, replicate=1, forward_index_fn=None):
        if forward_fn is None and forward_thread_fn is None:
            raise ValueError("T.Fragment needs forward_fn or forward_thread_fn")
        self.replicate = replicate
        self.forward_thread_fn = forward_thread_fn
        self.forward_index_fn = forward_index_fn
        self.both_fn = forward_fn
        super().__init__(shape, self._index)

    def _extra(self, rep):
        return (rep,) if self.replicate > 1 else ()

    def _index(self, *indices):
        if self.both_fn is not None:
            return self.both_fn(*indices, *self._extra(0))[1]
        return self.forward_index_fn(*indices) if self.forward_index_fn is not None else []

    def map_forward_thread(self, indices, rep=0):
        if self.both_fn is not None:
            return self.both_fn(*indices, *self._extra(rep))[0]
        return self.forward_thread_fn(*indices, *self._extra(rep))

    def get_thread_size(self) -> int:
        threads = [torch.as_tensor(self.map_forward_thread(self._grid(), rep)).max() for rep in range(self.replicate)]
        return int(max(threads)) + 1

    def __repr__(self) -> str:
        return f"T.Fragment({list(self.shape)}, replicate={self.replicate})"
