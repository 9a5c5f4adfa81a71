"""`tilelang.carver` under its TileLang name: only `arch.driver`'s device queries."""
