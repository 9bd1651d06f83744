"""Loopback port blocks for cells: each running cell gets PORT_BLOCK consecutive ports
that no other running cell holds (its prefills' bootstrap ports start there)."""

from __future__ import annotations

import random
import socket
import threading

PORT_BLOCK = 8


def block_free(base: int, size: int = PORT_BLOCK) -> bool:
    """Whether ``size`` loopback TCP ports from ``base`` can all be bound now."""
    sockets = []
    try:
        for port in range(base, base + size):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in sockets:
            s.close()


def free_port_block(size: int = PORT_BLOCK, rng: random.Random | None = None) -> int:
    """First port of ``size`` consecutive loopback TCP ports that are free now; RuntimeError when none is found."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - size)
        if block_free(base, size):
            return base
    raise RuntimeError("no block of free loopback ports found")


class PortBlocks:
    """Hands out blocks of PORT_BLOCK loopback ports to concurrent cells: never the same
    block to two running cells, each free when handed out, all below the kernel's
    ephemeral range (where the roles' own random ports come from)."""

    LOW, HIGH = 20000, 32000

    def __init__(self):
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        self._rng = random.Random()  # not the run's seed: two runs at once must not draw the same blocks

    def acquire(self) -> int:
        """A free block's first port; RuntimeError when none is found."""
        with self._lock:
            for _ in range(500):
                base = self.LOW + PORT_BLOCK * self._rng.randrange((self.HIGH - self.LOW) // PORT_BLOCK)
                if base not in self._in_use and block_free(base):
                    self._in_use.add(base)
                    return base
        raise RuntimeError("no block of free loopback ports found")

    def release(self, base: int) -> None:
        with self._lock:
            self._in_use.discard(base)
