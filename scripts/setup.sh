#!/usr/bin/env bash
# Create .venv with torch (CPU), a pinned sglang for the disaggregation modules,
# the real transfer engines and pdconform itself.  Called by `make setup`;
# re-running it with nothing changed returns in well under a second (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
TORCH_VERSION=2.13.0
NFQUEUE_VERSION=1.1.0  # NetfilterQueue: the network faults' reader on kernels without netem (optional)
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
req_sglang=requirements/sglang-${SGLANG_VERSION}.txt
if [[ ! -f $req_sglang ]]; then
  echo "setup: no pinned package set for sglang $SGLANG_VERSION ($req_sglang missing)" >&2
  echo "setup: available: $(ls requirements/sglang-*.txt | sed 's/.*sglang-//; s/.txt//' | tr '\n' ' ')" >&2
  exit 2
fi

# The stamp covers every input that changes what gets installed; a stamped environment
# must also still work (a moved or broken .venv keeps its stamp but not its interpreter).
stamp_key=$( { echo "$SGLANG_VERSION $TORCH_VERSION"; cat "$req_sglang" requirements/engines.txt requirements/harness.txt pyproject.toml; } | sha256sum | cut -c1-16)
stamp=$VENV/.pdconform-setup-$stamp_key
works() {
  "$VENV/bin/python" -c "import importlib.metadata as m, harness, harness.implementations as i
m.version('sglang'); m.version('pdconform'); i.registered()" >/dev/null 2>&1
}
if [[ ${1:-} == --check ]]; then  # say whether the environment is set up and works; change nothing
  if [[ -f $stamp ]] && works; then echo "setup: $VENV works"; exit 0; fi
  [[ -f $stamp ]] && echo "setup: $VENV is set up but no longer works" >&2 || echo "setup: $VENV is not set up" >&2
  exit 1
fi
if [[ -f $stamp ]]; then
  if works; then
    exit 0
  fi
  echo "setup: $VENV is set up but no longer works (moved, or broken); setting it up again" >&2
  rm -f "$VENV"/.pdconform-setup-*
  if ! "$VENV/bin/python" -c "" >/dev/null 2>&1; then
    rm -rf "$VENV"  # its interpreter is gone: a venv this script made (it carried our stamp), made again
  fi
fi

# Mooncake's engine.so links libibverbs.so.1 even for TCP.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing libibverbs1 (needed by Mooncake's engine, even for TCP)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
  else
    echo "setup: WARNING libibverbs.so.1 missing and not root: mooncake will be reported unusable;" >&2
    echo "setup:         install the Debian package libibverbs1 (pdconform doctor says the same)" >&2
  fi
fi

# index.html's test opens the report in headless Chromium (selenium + Debian's chromium-driver);
# without them that one test is skipped, saying so.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium and chromium-driver (for the HTML report's browser test)"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver >/dev/null; } || echo "setup: WARNING could not install chromium; its test will be skipped" >&2
  else
    echo "setup: note: chromium/chromedriver missing and not root: the HTML report's browser test will be skipped" >&2
  fi
fi

# The network nemesis (run --hosts netns:N) cuts one path, or loses packets, with nftables;
# without nft those network cells are UNSUPPORTED, saying so.
if ! command -v nft >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing nftables (for the network faults of run --hosts netns:N)"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        nftables >/dev/null; } || echo "setup: WARNING could not install nftables; network faults on one path will be UNSUPPORTED" >&2
  fi
fi

# Delay, jitter, duplication and reordering use tc netem; on a kernel without it they go
# through an iptables NFQUEUE rule and a reader on NetfilterQueue (harness/hosts/nfqueue.py),
# which compiles against libnetfilter-queue.  Without them those cells are UNSUPPORTED, saying so.
if ! command -v iptables >/dev/null || [[ ! -f /usr/include/libnetfilter_queue/libnetfilter_queue.h ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing iptables and libnetfilter-queue-dev (network delay on kernels without netem)"
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        iptables libnetfilter-queue-dev >/dev/null; } \
      || echo "setup: WARNING could not install iptables/libnetfilter-queue-dev; without netem, network delay will be UNSUPPORTED" >&2
  fi
fi

if [[ ! -x $VENV/bin/python ]]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV"
fi
# pip warns once per package about this machine's configured local index folders
# that do not exist; drop only those lines, keep every other message.
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
echo "setup: torch $TORCH_VERSION (CPU)"
pip_install "torch==$TORCH_VERSION"
echo "setup: sglang $SGLANG_VERSION and its import-time runtime set (--no-deps)"
pip_install --no-deps -r "$req_sglang"
echo "setup: transfer engines (--no-deps)"
pip_install --no-deps -r requirements/engines.txt
echo "setup: pdconform and its own dependencies"
pip_install --no-deps -r requirements/harness.txt
pip_install --no-deps --no-build-isolation -e .
if [[ -f /usr/include/libnetfilter_queue/libnetfilter_queue.h ]]; then
  echo "setup: NetfilterQueue $NFQUEUE_VERSION (optional: network delay without netem)"
  pip_install "NetfilterQueue==$NFQUEUE_VERSION" \
    || echo "setup: WARNING could not build NetfilterQueue; without netem, network delay will be UNSUPPORTED" >&2
else
  echo "setup: note: no libnetfilter-queue-dev: without netem, network delay will be UNSUPPORTED" >&2
fi
rm -f "$VENV"/.pdconform-setup-*
echo "$SGLANG_VERSION" > "$stamp"
echo "setup: done ($VENV)"
