"""``pdconform agent``: one per host, started by the cluster's own launcher (harness.hosts.agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.cli import _usage_error, app, err


@app.command()
def agent(
    coordinator: str = typer.Option(..., "--coordinator", help="HOST:PORT the coordinator listens on "
                                    "(`pdconform run --hosts N --listen ADDRESS`)."),
    rank: Optional[int] = typer.Option(None, "--rank", min=0, max=4096, help="This host's rank (default: the launcher's: "
                                       "torchrun's GROUP_RANK, srun's SLURM_NODEID, a Kubernetes indexed Job's "
                                       "JOB_COMPLETION_INDEX; else the next free one)."),
    address: Optional[str] = typer.Option(None, "--address", help="The address this host's roles listen on and "
                                          "advertise (default: the interface that routes to the coordinator)."),
    join_timeout: float = typer.Option(60.0, "--join-timeout", min=1.0, max=3600.0, help="Seconds to reach the coordinator."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Folder for the roles' logs and ready files "
                                           "(default: a temporary one, removed at the end)."),
) -> None:
    """Serve one host's roles for a coordinator: join its rendezvous, start the roles it
    places here, stop when it says so or goes away.

    Exit 0 when the run ended, 2 on bad input or an unreachable coordinator.
    """
    import ipaddress

    import zmq

    from harness.cli import _stop_on_signals
    from harness.hosts.agent import HostsError, parse_address, run_agent

    try:
        parse_address(coordinator)
        if address is not None:
            ipaddress.ip_address(address)
    except ValueError as exc:
        raise _usage_error(f"--coordinator/--address: {exc}")
    _stop_on_signals()  # srun, torchrun and Kubernetes stop an agent with SIGTERM: its roles and folder go too
    try:
        code = run_agent(coordinator, rank, address, join_timeout, str(workdir) if workdir else None)
    except HostsError as exc:
        raise _usage_error(str(exc))
    except OSError as exc:
        raise _usage_error(f"agent: {exc.strerror or exc}")
    except zmq.ZMQError as exc:  # the address to serve on is not this host's
        raise _usage_error(f"agent: cannot serve on {address or 'the address towards the coordinator'}: {exc}")
    except KeyboardInterrupt:
        err.print("agent: interrupted; its roles were stopped")
        raise typer.Exit(code=130)
    raise typer.Exit(code=code)
