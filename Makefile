# `make demo` and `make test` do all set-up on a fresh machine (see scripts/setup.sh).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fxviz-setup

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	./scripts/setup.sh
	@touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxviz demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check fxviz tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/capture.py

clean:
	rm -rf $(VENV) build dist *.egg-info
