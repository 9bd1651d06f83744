"""Blind planted bugs: mutants of the reference written by someone who had read docs/protocol.md
and sglang's code but not pdconform's checks (harness/judge/), its scenarios or the other
mutants, so their score measures the checks, not the taste of whoever wrote them
(docs/mutants.md).  Each entry of :data:`SPECS` is the keyword arguments of
``backends.reference.mutants.Mutant``: ``id``, ``requirement`` (the docs/protocol.md ID it
breaks), ``bug``, ``like`` (where a real backend had a bug of its kind), ``apply`` (a function
that patches the reference classes in the calling process) and ``blind`` (the set's name).
"""

from __future__ import annotations

SPECS: list[dict] = []


def planted(blind_set: str):
    """The decorator of set ``blind_set``'s mutants: ``@spec(id, requirement, bug, like)``
    registers the decorated function as the ``apply`` of mutant ``id`` in :data:`SPECS`."""
    def spec(id: str, requirement: str, bug: str, like: str):
        def register(fn):
            SPECS.append(dict(id=id, requirement=requirement, bug=bug, like=like, apply=fn, blind=blind_set))
            return fn
        return register
    return spec


# the sets, each as its writer left it (blind6_*: as written, 2026-12-07; blind5_*: as written, 2026-12-07; blind4_*: as written, 2026-12-06; blind3_* and blind2_*: as written, 2026-12-05; blind1_*: split in modules by subject, and its own copies of
# _base's PlantedLoopDeath and wrap replaced by those, after scoring; 2026-12-05)
from backends.reference.mutants import blind1_transfer  # noqa: E402,F401  (it registers)
from backends.reference.mutants import blind1_liveness  # noqa: E402,F401,I001
from backends.reference.mutants import blind2_transfer  # noqa: E402,F401,I001
from backends.reference.mutants import blind2_liveness  # noqa: E402,F401,I001
from backends.reference.mutants import blind3_transfer  # noqa: E402,F401,I001
from backends.reference.mutants import blind3_liveness  # noqa: E402,F401,I001
from backends.reference.mutants import blind4_transfer  # noqa: E402,F401,I001
from backends.reference.mutants import blind4_liveness  # noqa: E402,F401,I001
from backends.reference.mutants import blind5_transfer  # noqa: E402,F401,I001
from backends.reference.mutants import blind5_liveness  # noqa: E402,F401,I001
from backends.reference.mutants import blind6_transfer  # noqa: E402,F401,I001
from backends.reference.mutants import blind6_liveness  # noqa: E402,F401,I001
