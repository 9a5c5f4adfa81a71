"""Library kernels written in the T language, exposed as torch operators (`torch.ops.tritile.*`).

Importing `tritile.ops.matmul` registers `torch.ops.tritile.mm`."""
