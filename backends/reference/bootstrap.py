"""The reference's bootstrap server: where a decode learns a prefill's control endpoints.

A prefill is one role process, or one per pipeline stage and attention-TP rank.  Rank 0 of
stage 0 serves HTTP on the bootstrap port (``bind_address()``)::

    GET  /health     -> 200 "ok"
    GET  /bootstrap  -> 200 {"stages": [{"pp_rank", "tp_rank", "endpoint", "layout"}, ...]} in
                        (stage, rank) order, 503 until every one of the prefill's ranks registered
    POST /register   <- {"pp_rank", "tp_rank", "endpoint", "layout"} (rank 0 of stage 0 registers itself)

as sglang's bootstrap server answers a decode's ``/route`` only once every prefill rank
has registered (common/conn.py ``CommonKVBootstrapServer._is_ready``).  Every wait on it
is bounded (tenacity).  The decode's heartbeat probes stage 0's ``/health`` only, as
sglang's decode probes a prefill's bootstrap address: a stage > 0 that dies alone is seen
through its writes failing or the waiting timeout, not R-HB-1 (no scenario kills one stage).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from harness.spec.protocol import Layout
from harness.target.role_context import bind_address

POLL_S = 0.05  # between two tries of a bootstrap call (seconds)
CALL_TIMEOUT_S = 2.0  # one HTTP call (seconds)
REGISTER_TIMEOUT_S = 15.0  # a stage > 0 waits this long (seconds) for stage 0's server to take its registration


class NotReady(OSError):
    """The bootstrap server answered, but not every stage has registered yet."""


class BootstrapServer:
    """Stage 0's HTTP bootstrap server for a prefill of ``dp_size`` DP engines of ``pp_size``
    stages of ``tp_size`` attention-TP ranks each, on ``port``; ``thread`` serves it.
    OSError when the port cannot be bound."""

    def __init__(self, port: int, pp_size: int, tp_size: int = 1, dp_size: int = 1):
        self.pp_size, self.tp_size, self.dp_size = pp_size, tp_size, dp_size
        self.stages: dict[tuple[int, int, int], dict] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                if self.path == "/health":
                    self._reply(200, b"ok")
                elif self.path == "/bootstrap":
                    with server.lock:
                        ready = len(server.stages) == server.pp_size * server.tp_size * server.dp_size
                        body = json.dumps({"stages": [server.stages[r] for r in sorted(server.stages)]}).encode()
                    self._reply(200 if ready else 503, body if ready else b"stages still registering")
                else:
                    self._reply(404, b"")

            def do_POST(self):  # noqa: N802
                try:
                    stage = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                    rank, endpoint, layout = int(stage["pp_rank"]), str(stage["endpoint"]), dict(stage["layout"])
                    tp_rank, dp_rank = int(stage.get("tp_rank", 0)), int(stage.get("dp_rank", 0))
                    Layout(**layout)  # a layout the decode could not read is refused here, not there
                except (ValueError, KeyError, TypeError, AttributeError):
                    self._reply(400, b"not a stage registration")
                    return
                if self.path != "/register" or not 0 <= rank < server.pp_size or not 0 <= tp_rank < server.tp_size \
                        or not 0 <= dp_rank < server.dp_size:
                    self._reply(400, b"no such stage")
                    return
                server.register(rank, endpoint, layout, tp_rank, dp_rank)
                self._reply(200, b"ok")

            def _reply(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer((bind_address(), port), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, name="reference-bootstrap-http", daemon=True)

    def register(self, pp_rank: int, endpoint: str, layout: dict, tp_rank: int = 0, dp_rank: int = 0) -> None:
        """Rank ``tp_rank`` of stage ``pp_rank`` of DP engine ``dp_rank`` is served at ``endpoint``
        with ``layout`` (rank 0 of stage 0 of engine 0 itself, or a rank's POST /register)."""
        with self.lock:
            self.stages[(dp_rank, pp_rank, tp_rank)] = {"dp_rank": dp_rank, "pp_rank": pp_rank, "tp_rank": tp_rank,
                                                        "endpoint": endpoint, "layout": layout}

    def shutdown(self) -> None:
        """Stop serving and close the listening socket."""
        self.http.shutdown()
        self.http.server_close()


def _retrying(timeout_s: float) -> Retrying:
    """Tries until ``timeout_s``: while the server is not up (OSError) or not ready (503), never
    after a refusal (another HTTP error, which is raised at once)."""
    def worth_retrying(exc: BaseException) -> bool:
        return isinstance(exc, OSError) and not (isinstance(exc, urllib.error.HTTPError) and exc.code != 503)

    return Retrying(stop=stop_after_delay(timeout_s), wait=wait_fixed(POLL_S), reraise=True,
                    retry=retry_if_exception(worth_retrying))


def register_stage(bootstrap_addr: str, pp_rank: int, endpoint: str, layout: dict, timeout_s: float,
                   tp_rank: int = 0, dp_rank: int = 0) -> None:
    """Register rank ``tp_rank`` of stage ``pp_rank`` of DP engine ``dp_rank`` with the server at
    ``bootstrap_addr`` (host:port), trying until it answers; OSError when it has not within
    ``timeout_s`` seconds."""
    body = json.dumps({"pp_rank": pp_rank, "tp_rank": tp_rank, "dp_rank": dp_rank, "endpoint": endpoint,
                       "layout": layout}).encode()

    def once() -> None:
        request = urllib.request.Request(f"http://{bootstrap_addr}/register", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as reply:
            reply.read()

    _retrying(timeout_s)(once)


def room_engine(stages: list[dict], room: int) -> list[dict]:
    """The stages of the prefill DP engine that serves ``room``: engine ``room mod DP`` (R-DP-1)."""
    dp = 1 + max((int(st.get("dp_rank", 0)) for st in stages), default=0)
    return [st for st in stages if int(st.get("dp_rank", 0)) == room % dp]


def fetch_stages(bootstrap_addr: str, timeout_s: float) -> list[dict]:
    """The stages of the prefill at ``bootstrap_addr`` (every DP engine's), in stage order, once all have
    registered; TimeoutError when that has not happened within ``timeout_s`` seconds,
    urllib.error.HTTPError when the server refused the request."""
    def once() -> list[dict]:
        try:
            with urllib.request.urlopen(f"http://{bootstrap_addr}/bootstrap", timeout=CALL_TIMEOUT_S) as reply:
                return json.loads(reply.read())["stages"]
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise
            raise NotReady(f"bootstrap answered {exc.code}: stages still registering") from exc

    try:
        return _retrying(timeout_s)(once)
    except urllib.error.HTTPError:  # refused at once (not 503): not a timeout
        raise
    except OSError as exc:
        raise TimeoutError(f"prefill bootstrap at {bootstrap_addr} did not answer within {timeout_s:.0f} s "
                           f"({exc})") from exc
