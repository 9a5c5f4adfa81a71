"""Integrations of tritile with other frameworks (`torch_backend`: a `torch.compile` backend)."""
