"""`BaseTemplate` (TileLang's `tilelang/carver/template/base.py`): a computation plus the device it
is planned for, answering `recommend_hints(topk)`.

Mirrored: `with_arch`, `has_arch`, `arch`, `is_volta_arch` / `is_ampere_arch` / `is_cdna_arch`,
`equivalent_function`, `set_function`, `initialize_function` (run after construction),
`get_hardware_aware_configs`, `recommend_hints`.  Simplified: the function is a tritile
`@T.prim_func` (a tiled program of the computation), not a TVM TE PrimFunc the roller analyses;
no output nodes.  The default device is `auto_infer_current_arch()` (an H100 without a GPU).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tritile.carver.arch import TileDevice, auto_infer_current_arch, is_ampere_arch, is_cdna_arch, is_volta_arch


@dataclass
class BaseTemplate(ABC):
    _arch: TileDevice = field(default_factory=auto_infer_current_arch, init=False, repr=False)
    _func: object = field(default=None, init=False, repr=False)

    @abstractmethod
    def get_hardware_aware_configs(self, arch: TileDevice = None, topk: int = 10) -> list:
        """The `Hint`s recommended for `arch`, best first."""

    def with_arch(self, arch: TileDevice) -> "BaseTemplate":
        self._arch = arch
        return self

    def has_arch(self) -> bool:
        return self._arch is not None

    def is_volta_arch(self) -> bool:
        return self._arch is not None and is_volta_arch(self._arch)

    def is_ampere_arch(self) -> bool:
        return self._arch is not None and is_ampere_arch(self._arch)

    def is_cdna_arch(self) -> bool:
        return self._arch is not None and is_cdna_arch(self._arch)

    def is_rdna_arch(self) -> bool:
        return False  # no RDNA device here

    def equivalent_function(self):
        """The template's computation as a tritile `PrimFunc`."""
        return self._func

    def initialize_function(self) -> None:
        raise NotImplementedError("initialize_function is not implemented")

    def set_function(self, func) -> "BaseTemplate":
        self._func = func
        return self

    def recommend_hints(self, topk: int = 10) -> list:
        return self.get_hardware_aware_configs(self._arch, topk)

    @property
    def arch(self) -> TileDevice:
        return self._arch

    def __post_init__(self):
        self.initialize_function()
