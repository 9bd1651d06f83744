"""pdconform's reference implementation of the Common protocol: the oracle, written from docs/protocol.md.

Registered as the ``reference`` implementation (pyproject.toml entry point); its
roles import no sglang.
"""

from harness.implementations import Implementation

IMPLEMENTATION = Implementation(
    "reference",
    "backends.reference.adapter:ReferenceRole",
    "pdconform's reference cores (docs/protocol.md) on ZMQ, HTTP and torch pools",
    rank=0,
    preload=("torch", "zmq", "backends.reference.adapter", "backends.reference.mutants"),
    probe="backends.reference:probe",
    tools={"simulator": "backends.reference.simulator", "mutants": "backends.reference.mutants:MUTANTS"},
)


def probe() -> tuple[str, str]:
    """The reference's engine: ZMQ frames into torch pools, nothing to probe beyond its imports."""
    import torch  # noqa: F401
    import zmq  # noqa: F401

    return "reference", "pdconform's own cores: ZMQ control and data frames, torch pools"
