# Two entry points for a new user: `make demo` and `make test` (`make check` is its quick form while you work).
# Each creates .venv on first use (Python 3.11+ and a C compiler are all it needs).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The malloc tunables of jgpt.runtime.process_settings (docs/process-settings.md) for every command below: the user's
# own GLIBC_TUNABLES first, then those it does not name.
export GLIBC_TUNABLES := $(shell $(PYTHON) -m jgpt.runtime.process_settings)

.PHONY: demo check test lint hooks bench clean chromium

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jgpt needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.runtime
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

demo: $(VENV)/.runtime
	$(BIN)/python -m experiments demo

# The report test renders the HTML report in headless Chromium (Debian's package).
chromium:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium for the report test"; \
	  $$([ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq chromium >/dev/null'; }

# ruff (defects, import order and the formatter's layout) over the tree, mypy over every package,
# all configured in pyproject.toml; then tools/commit_subjects.py: commit subjects of at most 72 characters.
lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python tools/commit_subjects.py

# The commit-msg hook: a subject over 72 characters is refused before the commit is made.
hooks:
	git config core.hooksPath .githooks

# The edit-test loop: lint, then the fast tier, every test not marked slow (tests/conftest.py lists the slow ones);
# under 3 minutes on 2 cores. `make test` is the whole suite, what CI runs: run it before you push.
check: lint chromium
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test: lint chromium
	$(BIN)/python -m pytest -q -n 2

bench: $(VENV)/.test
	$(BIN)/python bench/train_step.py
	$(BIN)/python bench/decode.py --kernel
	$(BIN)/python bench/speculative.py
	$(BIN)/python bench/kvsim.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/serving.py
	$(BIN)/python bench/results_page.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
