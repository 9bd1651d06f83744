# pdconform: the two commands a new machine needs are `make matrix` and `make test`.
SGLANG_VERSION ?= 0.5.23
VENV ?= .venv
PDCONFORM = $(VENV)/bin/pdconform
# The shipped expected verdicts for this sglang (docs/sglang-bugs.md explains each).
EXPECTATIONS ?= $(wildcard expectations/sglang-$(SGLANG_VERSION).toml)
# Cells at once: cells mostly wait on sglang's timers, so 8 per core (docs/performance.md).
JOBS ?= $(shell echo $$(( 8 * $$(nproc) )))

.PHONY: setup matrix test doctor bench soak mutants nightly clean

setup:
	@SGLANG_VERSION=$(SGLANG_VERSION) VENV=$(VENV) scripts/setup.sh

# p1-d1 and the default topology set (TP, PP, DP shapes), cells on warm role pairs (harness/drive/warm.py;
# --isolated runs each in a fresh process, as repro does)
matrix: setup
	$(PDCONFORM) run --jobs $(JOBS) --topology p1-d1 --topology default $(if $(EXPECTATIONS),--expectations $(EXPECTATIONS))

# two workers per core (pytest-xdist): the tests mostly wait on role processes and timers;
# worksteal, as test durations run from 0.01 s to half a minute (docs/performance.md); the tests
# marked nightly (minute-long runs across network namespaces, bench's own test) run in `make nightly`
TEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))
test: setup
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not nightly"

# Benchmarks and long property runs: not part of `make test`.
bench: setup
	$(PDCONFORM) bench --jobs $(JOBS)

# Verdict stability: the full matrix SOAK_RUNS times at make matrix's --jobs (docs/reliability.md);
# twice the load: make soak SOAK_RUNS=10 JOBS=$$((12 * $$(nproc))).
SOAK_RUNS ?= 50
soak: setup
	$(PDCONFORM) soak --runs $(SOAK_RUNS) --jobs $(JOBS)

# every planted-bug mutant of the reference against the scenarios (docs/mutants.md); not part of make test
mutants: setup
	$(PDCONFORM) mutants

# the wide topology set, the scenarios only a nightly run takes (layout-pairs, 24 pairs), then
# generated programs against each backend (docs/explore.md; exit 1 while a found program fails),
# then the network scenarios across two network namespaces (root)
EXPLORE_BUDGET ?= 10m
nightly: setup
	PDCONFORM_HYPOTHESIS_PROFILE=nightly $(VENV)/bin/python -m pytest -q
	$(VENV)/bin/pdconform simulate --seeds 100000
	PDCONFORM_LAYOUT_PAIRS=24 $(PDCONFORM) run --jobs $(JOBS) --topology nightly $(if $(EXPECTATIONS),--expectations $(EXPECTATIONS))
	$(PDCONFORM) explore --impl mooncake --impl nixl --impl mori --budget $(EXPLORE_BUDGET)
	@# prefill and decode on two hosts (network namespaces; docs/cluster.md): needs root
	if [ "$$(id -u)" = 0 ]; then $(PDCONFORM) run --hosts netns:2 --jobs $(JOBS) --out reports/out/hosts \
	  --scenario happy-path --scenario network-partition; \
	  else echo "nightly: the runs across hosts need root (network namespaces): skipped"; fi

doctor: setup
	$(PDCONFORM) doctor

clean:
	rm -rf $(VENV) reports/out reports/artifacts
