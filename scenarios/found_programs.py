"""Programs ``pdconform explore`` found (harness.explore.found): each found file of the corpus
folders (scenarios/found/, and those ``PDCONFORM_FOUND_DIRS`` names) registered as a scenario of
its id, nightly-only; and a program file's path accepted wherever a scenario id is."""

from __future__ import annotations

import sys

from harness.explore.found import SUFFIX, found_files, load_file
from harness.spec.scenario import register, register_file_loader

register_file_loader(SUFFIX, load_file)
for _path in found_files():
    try:
        register(load_file(_path))
    except Exception as exc:  # noqa: BLE001 - one bad found file is named, never fatal to every other scenario
        print(f"pdconform: skipped found program {_path.name!r}: {type(exc).__name__}: {str(exc)[:200]!r}",
              file=sys.stderr)
