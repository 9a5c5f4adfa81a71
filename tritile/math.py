"""`tilelang.math` under its TileLang name: integer helpers for host-side tile arithmetic."""


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1), as TileLang's."""
    return 1 << (x - 1).bit_length() if x > 1 else 1


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers."""
    return (a + b - 1) // b
