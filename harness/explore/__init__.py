"""Explore: generated lifecycle programs against an implementation's real roles, judged by
the spec's checks, failing ones shrunk and written out as scenarios that replay
(``pdconform explore``; harness.explore.program, harness.explore.found, harness.explore.session)."""
