"""Device queries of `tilelang.carver.arch.driver`: the current CUDA device's properties."""
from __future__ import annotations

import torch


def _properties(device_id=None):
    return torch.cuda.get_device_properties(torch.cuda.current_device() if device_id is None else device_id)


def get_num_sms(device_id=None) -> int:
    """Streaming multiprocessors of the device (132 on an H100 SXM)."""
    return _properties(device_id).multi_processor_count


def get_device_name(device_id=None) -> str:
    return _properties(device_id).name
