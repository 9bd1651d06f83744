"""Port blocks for cells, on the run's listen address (loopback unless ``run --bind``): each
running cell gets PORT_BLOCK consecutive ports that no other running cell holds (its
prefills' bootstrap ports start there)."""

from __future__ import annotations

import random
import socket
import threading

from harness.target.role_context import bind_address

PORT_BLOCK = 16  # draft-kv-layout: a bootstrap port per prefill it starts, a rendezvous per PP prefill


def block_free(base: int, size: int = PORT_BLOCK, host: str | None = None) -> bool:
    """Whether ``size`` TCP ports of ``host`` (default: bind_address()) from ``base`` can all be bound now."""
    sockets = []
    try:
        for port in range(base, base + size):
            s = socket.socket()
            sockets.append(s)
            s.bind((host or bind_address(), port))
        return True
    except OSError:
        return False
    finally:
        for s in sockets:
            s.close()


def free_port_block(size: int = PORT_BLOCK, rng: random.Random | None = None, host: str | None = None) -> int:
    """First port of ``size`` consecutive TCP ports of ``host`` (default: bind_address()) that
    are free now, below the kernel's ephemeral range as :class:`PortBlocks` hands out (a block
    inside it can be taken by any process's outgoing connection or random bind between this
    check and the cell's use: "Address already in use" under load); RuntimeError when none is found."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(PortBlocks.LOW, PortBlocks.HIGH - size)
        if block_free(base, size, host):
            return base
    raise RuntimeError("no block of free ports found")


class PortBlocks:
    """Hands out blocks of PORT_BLOCK ports to concurrent cells: never the same
    block to two running cells, each free when handed out, all below the kernel's
    ephemeral range (where the roles' own random ports come from); on ``host`` (default:
    bind_address())."""

    LOW, HIGH = 20000, 32000

    def __init__(self, host: str | None = None):
        self.host = host
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        self._rng = random.Random()  # not the run's seed: two runs at once must not draw the same blocks

    def acquire(self) -> int:
        """A free block's first port; RuntimeError when none is found."""
        with self._lock:
            for _ in range(500):
                base = self.LOW + PORT_BLOCK * self._rng.randrange((self.HIGH - self.LOW) // PORT_BLOCK)
                if base not in self._in_use and block_free(base, host=self.host):
                    self._in_use.add(base)
                    return base
        raise RuntimeError("no block of free ports found")

    def release(self, base: int) -> None:
        with self._lock:
            self._in_use.discard(base)


def check_bind_address(addr: str) -> str:
    """``addr`` when it is an IPv4 address of this machine that a role can listen on (for
    ``run --bind``); ValueError saying why not otherwise (not IPv4, or not assigned here)."""
    import ipaddress

    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        raise ValueError(f"--bind takes an IPv4 address of this machine, got {addr!r}") from None
    with socket.socket() as s:
        try:
            s.bind((str(ip), 0))
        except OSError as exc:
            raise ValueError(f"--bind {ip}: cannot listen there ({exc.strerror or exc})") from None
    return str(ip)
