"""Where a role's KV and aux pools live (``run --pool-device``): the setting alone, without
torch, so the ``pdconform`` process that checks the option and passes it to every cell
(harness.session) does not import torch for it (about 0.9 s of CPU per run)."""

from __future__ import annotations

import os

POOL_DEVICE_ENV = "PDCONFORM_POOL_DEVICE"  # run --pool-device: where a role's pools live
POOL_DEVICES = ("cpu", "cuda")


def pool_device() -> str:
    """The device this role's pools are allocated on: ``cpu`` (default) or ``cuda`` (the
    current CUDA device; sglang's schedulers keep KV there), from :data:`POOL_DEVICE_ENV`.
    ValueError for any other value."""
    value = os.environ.get(POOL_DEVICE_ENV) or "cpu"
    if value not in POOL_DEVICES:
        raise ValueError(f"{POOL_DEVICE_ENV}={value[:20]!r}: one of {', '.join(POOL_DEVICES)}")
    return value
