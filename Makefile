# pdconform: the two commands a new machine needs are `make matrix` and `make test`.
SGLANG_VERSION ?= 0.5.23
VENV ?= .venv
PDCONFORM = $(VENV)/bin/pdconform

.PHONY: setup matrix test doctor clean

setup:
	@SGLANG_VERSION=$(SGLANG_VERSION) VENV=$(VENV) scripts/setup.sh

matrix: setup
	$(PDCONFORM) run

test: setup
	$(VENV)/bin/python -m pytest -q

doctor: setup
	$(PDCONFORM) doctor

clean:
	rm -rf $(VENV) reports/out
