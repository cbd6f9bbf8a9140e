# `make demo` and `make test` do all set-up on a fresh machine (see scripts/setup.sh).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fxviz-setup
# the tiers (markers in pyproject.toml): test-fast leaves out what needs a browser, a notebook
# kernel, a package build, a subprocess or a big model
FAST   := not slow and not browser and not notebook

.PHONY: setup web demo test test-fast test-web lint bench clean

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh web/package-lock.json
	./scripts/setup.sh
	@touch $@

setup: $(STAMP)

# the report's script bundle; a no-op when it matches web/ (scripts/build_web.py)
web: $(STAMP)
	@./scripts/build_web.sh >/dev/null

demo: web
	$(VENV)/bin/fxviz demo

# everything: what CI runs (.ci/run, with CI=true: a skipped test fails the run there)
test: web test-web
	$(PY) -m pytest

# the quick loop: under a minute on a 2-core machine
test-fast: web test-web
	$(PY) -m pytest -m "$(FAST)"

# the report's pure logic (web/src/model.js), with Node's own test runner
test-web:
	node --test --test-reporter=spec web/tests/

lint: $(STAMP)
	$(VENV)/bin/ruff check fxviz tests bench
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/capture.py

clean:
	rm -rf $(VENV) build dist *.egg-info
