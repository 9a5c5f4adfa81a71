"""Library kernels written in the T language, exposed as torch operators (`torch.ops.tritile.*`).

Importing `tritile.ops.matmul` registers `torch.ops.tritile.mm` and `torch.ops.tritile.bmm`;
`tritile.ops.linear` registers `torch.ops.tritile.linear` (a GEMM with a fused epilogue);
`tritile.ops.attention` registers `torch.ops.tritile.attention` and its backward."""
