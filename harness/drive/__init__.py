"""Execution: the runner and cell scheduler, the cell process, launchers, the fork server, the role host."""
