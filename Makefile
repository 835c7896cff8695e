# rollout-stream developer entry points. `make test` is what CI runs (.ci/run).
#   make venv   create .venv (Python 3.11) and install the product in it: the package editable with its C
#               extensions (setup.py; without a C compiler the stage runs their Python, docs/compiled.md)
#   make test-venv  the venv plus what the suite needs: the test extras (pytest, ruff, mypy, ...), TRL and verl
#   make jars   prefetch the pinned Kafka broker jars into ${ROLLOUT_STREAM_CACHE:-~/.cache/rollout-stream}
#   make promtool  Prometheus' promtool (checks deploy/prometheus/) into the same cache, unless on PATH
#   make compose   Debian's docker-compose (validates docker-compose.yml in tests/test_compose.py), unless on PATH
#   make lint   ruff check on the whole tree, mypy (strict) on core/, codec/ and stream/; `make test` runs it first
#   make test   the test suite (CI's); the Kafka tests start a local broker (or use KAFKA_BOOTSTRAP_SERVERS)
#   make test-long  the long tier: the client variants `make test` leaves out
#   make demo   local broker + worker + synthetic producer, with live progress

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test-venv jars promtool compose lint test test-long demo

venv: $(VENV)/.installed
test-venv: $(VENV)/.installed-test

# Reinstalled whenever pyproject.toml changes (new dependency, new entry point), or setup.py or a C source
# (the C extensions are built in place by the editable install). Wheels are kept in a wheelhouse under the
# user cache so that a fresh clone installs without downloading torch (~3 GB) again.
WHEELHOUSE ?= $(HOME)/.cache/rollout-stream/wheels
PIP_DOWNLOAD := $(BIN)/pip download -q -d $(WHEELHOUSE) --find-links $(WHEELHOUSE)
PIP_INSTALL := $(BIN)/pip install -q --no-index --find-links $(WHEELHOUSE)
# The product alone: what `make demo` (and `make jars`) needs, without the suite's tools and frameworks.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard core/*.c codec/*.c)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	mkdir -p $(WHEELHOUSE)
	$(PIP_DOWNLOAD) setuptools wheel .
	$(PIP_INSTALL) -e .
	touch $@

# The suite's: the test extras, and the trainer frameworks its integration tests need: TRL (the [trl] extra,
# with its requirements) and verl, which comes without its requirements and with only what the imported modules
# need (tests/requirements-verl.txt): +176 MB of downloads, ~25 s of installs (docs/integrations.md).
FRAMEWORKS := -c tests/constraints-frameworks.txt
VERL_TEST := tests/requirements-verl.txt
$(VENV)/.installed-test: $(VENV)/.installed $(VERL_TEST) tests/constraints-frameworks.txt
	$(PIP_DOWNLOAD) $(FRAMEWORKS) setuptools wheel '.[test,trl]'
	$(PIP_DOWNLOAD) --no-deps -r $(VERL_TEST)
	$(PIP_INSTALL) $(FRAMEWORKS) -e '.[test,trl]'
	$(PIP_INSTALL) --no-deps -r $(VERL_TEST)
	touch $@

jars: venv
	$(BIN)/rollout-stream broker fetch-jars

# promtool comes from Debian's `prometheus` package: only the binary is unpacked from the .deb into the cache
# (installing the package would add a Prometheus server and its service, which nothing here needs). The
# package lists are refreshed only when apt cannot find the package (a fresh machine). Tests look for
# $PROMTOOL, then promtool on PATH, then this file.
ROLLOUT_STREAM_CACHE ?= $(HOME)/.cache/rollout-stream
PROMTOOL := $(ROLLOUT_STREAM_CACHE)/bin/promtool
APT_DOWNLOAD := -q -o APT::Sandbox::User=root download prometheus  # into a private temporary directory
promtool: $(PROMTOOL)
$(PROMTOOL):
	@mkdir -p $(dir $@)
	@if command -v promtool >/dev/null 2>&1; then ln -sf "$$(command -v promtool)" $@; exit 0; fi; \
	set -e; tmp=$$(mktemp -d); chmod 755 $$tmp; trap 'rm -rf "$$tmp"' EXIT; cd $$tmp; \
	echo "promtool: unpacking it from Debian's prometheus package into $@"; \
	apt-get $(APT_DOWNLOAD) >/dev/null 2>&1 || { apt-get update -qq && apt-get $(APT_DOWNLOAD); }; \
	dpkg-deb -x prometheus_*.deb root; install -m 755 root/usr/bin/promtool $@.tmp; mv $@.tmp $@
	$@ --version | head -1

# docker-compose validates docker-compose.yml (`config`, every profile) in the suite: Debian's package, as
# root (as CI runs); the package lists are refreshed only when apt cannot find it (a fresh machine).
compose:
	@command -v docker-compose >/dev/null 2>&1 || { \
	  echo "compose: installing Debian's docker-compose (validates docker-compose.yml in the tests)"; \
	  apt-get install -y -q docker-compose >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -q docker-compose >/dev/null; }; }
	@docker-compose version | head -1

# mypy reads the package in its installed shape: rollout_stream/ linking stream/'s entries, core/ and codec/.
TYPECHECK := .build/typecheck/rollout_stream
lint: test-venv
	$(BIN)/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)
	for entry in stream/*; do ln -s "$(CURDIR)/$$entry" $(TYPECHECK)/; done
	ln -s "$(CURDIR)/core" "$(CURDIR)/codec" $(TYPECHECK)/
	$(BIN)/mypy

# Lint first: a lint error fails CI (.ci/run) before the broker starts.
# The core and codec tests run twice: on the Python path (the reference, and what runs where the C
# extensions are not built), then with everything else on the C extensions. Both runs spread over worker
# processes (pytest-xdist), which share one broker; a file's tests stay in one worker (tests/conftest.py).
# Most Kafka tests wait on the broker more than they compute, so more workers than cores pay off, up to a
# point (the measured counts: docs/development.md).
TEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The pure-Python pass runs core's and codec's tests on the Python paths of the C extensions; the folds
# (admission, prompts, pacing, checkpoints) have no C path, so they run once, in the main pass. It runs beside
# the main pass at the lowest priority, on the CPU the Kafka tests leave idle while they wait on the broker
# (it took a minute before the main pass began), and its output follows the main pass's.
NO_C_PATH := test_admission.py test_admission_index.py test_prompts.py test_pacing.py test_checkpoint.py \
	test_dead_letter_limit.py test_offsets.py
PURE_LOG := .build/test-pure-python.log
test: lint jars promtool compose
	@mkdir -p .build
	@ROLLOUT_STREAM_COMPILED=0 nice -n 19 $(PYTEST) -p no:cacheprovider --basetemp=.build/pure-python-tmp \
	  -m "not long" tests/core tests/codec $(addprefix --ignore=tests/core/,$(NO_C_PATH)) >$(PURE_LOG) 2>&1 & \
	pure=$$!; echo "the pure-Python pass (core, codec) runs beside the main pass: $(PURE_LOG)"; \
	$(PYTEST) -m "not long" --durations=15; main=$$?; \
	wait $$pure; pure_status=$$?; echo "== the pure-Python pass (core, codec; exit $$pure_status) =="; \
	cat $(PURE_LOG); test $$main -eq 0 -a $$pure_status -eq 0

# The long tier: every `any_client` test on the clients `make test` leaves out, and what takes minutes
# alone. Not in CI; run it before a release or after changing a client.
test-long: test-venv jars
	$(PYTEST) -m long

demo: venv jars
	$(BIN)/rollout-stream demo
