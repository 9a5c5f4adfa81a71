"""TileLang's `tilelang.utils` paths; the helpers live where tritile uses them."""
