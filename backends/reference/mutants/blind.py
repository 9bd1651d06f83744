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
