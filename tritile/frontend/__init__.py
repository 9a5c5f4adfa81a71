"""Python AST → tile IR."""
