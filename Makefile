# The commands of the README: `make demo` (set up, run the main job), `make test` (set up, run the tests) and
# `make test-fast` (the tests without Ray or real weights, for the edit loop). All are idempotent: the
# virtual environment is rebuilt only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On machines without CUDA the CPU build of torch is installed before anything that depends on torch;
# otherwise pip would pull several GB of CUDA wheels. GPU machines keep pip's default (CUDA) build.
TORCH_CPU ?= torch==2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# Each step of the set-up that can take long says what it does before, and how long it took after
# (`$(call timed,WHAT)` after a command: "  WHAT (N s)", N counted from `began`).
timed = echo "  $(1) ($$(( $$(date +%s) - began )) s)"

.PHONY: setup browser demo lint bytecode test test-fast bench bench-smoke clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "setting up $(VENV): pip installs torch, transformers, Ray and the rest (about 1.9 GB); this may take a few minutes"
	@test -x $(BIN)/python || { echo "creating $(VENV) ($(PYTHON) -m venv; up to a minute)"; began=$$(date +%s); \
	  $(PYTHON) -m venv $(VENV) && $(call timed,created); }
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "pip install $(TORCH_CPU), the CPU build (about 190 MB; a minute or more, longer when it downloads)"; \
	  began=$$(date +%s); $(BIN)/pip install --quiet "$(TORCH_CPU)" && $(call timed,torch installed); fi
	@echo "pip install -e '.[test]': this package, transformers, Ray, pyarrow and the test tools (a few minutes)"
	@began=$$(date +%s); $(BIN)/pip install --quiet -e '.[test]' && $(call timed,installed)
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: setup
	$(BIN)/python examples/antibody_demo.py --output out/demo --overwrite --ray
	@echo "dscore is installed in $(BIN): run '. $(BIN)/activate' to call it as dscore (or call $(BIN)/dscore)"

# The audit report is checked in a real headless browser: Chromium from Debian, installed when missing
# and this is root on a Debian machine (as in CI); elsewhere that one test is skipped, and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "installing Chromium with apt-get for the audit report's browser test (a minute or so)" && \
	  began=$$(date +%s) && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null && $(call timed,Chromium installed); } || \
	  echo "chromium could not be installed: the report's browser test will be skipped"

# The checks that take seconds, before any test: the import contracts (pyproject.toml [tool.importlinter]: the
# layers may not reach across), then ruff's lint (import order included) and format ([tool.ruff]).
lint: setup
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check
	$(BIN)/ruff format --check

# Bytecode of the package, its tests and jobs, written before the tests: where the environment sets
# PYTHONDONTWRITEBYTECODE (as these machines do), every Ray worker and subprocess driver would otherwise
# compile the package again from source. compileall writes only what is stale; git ignores __pycache__.
bytecode: setup
	$(BIN)/python -m compileall -q distributed_scoring tests jobs

# The full suite, as CI runs it (.ci/run): the fast part (below) first, then the tests that start or use
# Ray or load real weights, and the slow sweeps, one after another (they start Ray clusters and subprocess drivers sized for the
# machine's cores, which two at once would fight over).
test: test-fast
	$(BIN)/python -m pytest -m "ray or weights or slow"

# The suite less the tests marked ray (they start or use a Ray instance), weights (real offline models) or slow:
# tests/conftest.py marks them from the fixtures they use. Two pytest workers (pytest-xdist), each with one
# torch thread, so that the two never ask for more threads than there are cores (the thread cliff,
# docs/ray.md); measured 3.4 min against 5.8 min for one worker on 2 quiet cores.
test-fast: setup browser lint bytecode
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -m "not ray and not weights and not slow"

# Throughput side by side with naive scoring and minicons (its own venv, made on first use), then the
# Ray pipeline against the number of actors, then pairwise joints; on a quiet machine (about 45 minutes
# on 2 cores).
bench: setup
	$(BIN)/python benchmarks/compare.py --update-results benchmarks/RESULTS.md
	$(BIN)/python benchmarks/scaling.py --update-results benchmarks/RESULTS.md
	$(BIN)/python benchmarks/joints_speed.py --update-results benchmarks/RESULTS.md

bench-smoke: setup
	$(BIN)/python benchmarks/compare.py --preset smoke --out out/bench-smoke

clean:
	rm -rf $(VENV) out
