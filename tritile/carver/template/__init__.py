"""`tilelang.carver.template`: computations the carver recommends schedules for.  Only
`MatmulTemplate`; TileLang's GEMV / elementwise / reduction / flash-attention / conv templates are
not provided."""
from tritile.carver.template.base import BaseTemplate  # noqa: F401
from tritile.carver.template.matmul import MatmulTemplate, matmul_program  # noqa: F401
