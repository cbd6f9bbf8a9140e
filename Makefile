# `make demo` and `make test` do all set-up on a fresh machine (see scripts/setup.sh).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fxviz-setup

.PHONY: setup web demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh web/package-lock.json
	./scripts/setup.sh
	@touch $@

setup: $(STAMP)

# the report's script bundle; a no-op when it is newer than web/src
web: $(STAMP)
	@./scripts/build_web.sh >/dev/null

demo: web
	$(VENV)/bin/fxviz demo

test: web
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check fxviz tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/capture.py

clean:
	rm -rf $(VENV) build dist *.egg-info
