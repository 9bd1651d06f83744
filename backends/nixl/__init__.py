"""NIXL: sglang's ``NixlKVManager`` on a real NIXL agent (UCX over TCP on ``lo``, KV as DRAM).

Registered as the ``nixl`` implementation (pyproject.toml entry point); the adapter is
backends/nixl/adapter.py.  Its one engine setting, the agent's progress-thread delay,
is declared here (the adapter's docstring says why the harness does not keep nixl's
busy loop).
"""

from backends.sglang_releases import COMMON_PRELOAD, SGLANG_COMMON_RANGE
from harness.implementations import EngineSetting, Implementation

#: the environment variable a NIXL role reads its progress-thread delay from (microseconds)
PROGRESS_DELAY_ENV = "PDCONFORM_NIXL_PROGRESS_DELAY_US"
#: pdconform's default: about 2 % of a core while idle, instead of 100 %
DEFAULT_PROGRESS_DELAY_US = 100

#: UCX over TCP on loopback (its shared-memory transports fail at backend creation here)
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}

PROGRESS_DELAY = EngineSetting(
    name="nixl_progress_delay_us", env=PROGRESS_DELAY_ENV, default=DEFAULT_PROGRESS_DELAY_US, sglang_value=0,
    as_sglang="NIXL progress thread: busy loop, as sglang runs it",
    changed="NIXL progress thread: sleeps {value} us between polls (sglang: busy loop; --engine-setting nixl_progress_delay_us=0)",
    maximum=1_000_000,  # one second between polls: beyond it every transfer would wait out the scenarios' timeouts
)

IMPLEMENTATION = Implementation(
    "nixl",
    "backends.nixl.adapter:NixlRole",
    "sglang NixlKVManager on a real NIXL agent (UCX over TCP on lo, DRAM)",
    rank=20,
    sglang_range=SGLANG_COMMON_RANGE,
    preload=(*COMMON_PRELOAD, "sglang.srt.disaggregation.nixl.conn", "backends.nixl.adapter"),
    own_fork_server="backends.nixl.adapter:load_ucx_plugin",
    probe="backends.nixl:probe",
    engine_settings=(PROGRESS_DELAY,),
    tools={"engine_bench": "backends.nixl.engine_bench:SIDES"},
    role_env=UCX_ENV,
)


def probe() -> tuple[str, str]:
    """A NIXL agent with the UCX backend starts over TCP on ``lo``."""
    IMPLEMENTATION.apply_role_env()
    from nixl._api import nixl_agent, nixl_agent_config

    nixl_agent("pdconform-doctor", nixl_agent_config(backends=["UCX"]))
    return "real", "NIXL agent with the UCX backend starts (UCX_TLS=tcp, lo)"
