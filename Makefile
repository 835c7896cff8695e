# rollout-stream developer entry points. `make test` is what CI runs (.ci/run).
#   make venv   create .venv (Python 3.11) and install the package editable with its test extras
#   make jars   prefetch the pinned Kafka broker jars into ${ROLLOUT_STREAM_CACHE:-~/.cache/rollout-stream}
#   make test   the whole test suite; the Kafka tests start a local broker (or use KAFKA_BOOTSTRAP_SERVERS)
#   make demo   local broker + worker + synthetic producer, with live progress

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv jars test demo

venv: $(VENV)/.installed

# Reinstalled whenever pyproject.toml changes (new dependency, new entry point). Wheels are kept in a
# wheelhouse under the user cache so that a fresh clone installs without downloading torch (~3 GB) again.
WHEELHOUSE ?= $(HOME)/.cache/rollout-stream/wheels
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	mkdir -p $(WHEELHOUSE)
	$(BIN)/pip download -q -d $(WHEELHOUSE) --find-links $(WHEELHOUSE) setuptools wheel '.[test]'
	$(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE) -e '.[test]'
	touch $@

jars: venv
	$(BIN)/rollout-stream broker fetch-jars

test: venv jars
	$(BIN)/pytest -q

demo: venv jars
	$(BIN)/rollout-stream demo
