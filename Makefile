# Two commands for a new user: `make demo` and `make test`. Both build .venv first if needed.
PYTHON ?= python3
# Where the environment turns bytecode off, every Python that a run starts (each daemon of a
# testnet, each tool; make test starts hundreds) compiles the project's modules again: ~0.2 s of
# CPU each. Written once into __pycache__ (git-ignored), they are read back.
unexport PYTHONDONTWRITEBYTECODE
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-quick lint format bench bench-learning bench-scool bench-heterogeneous bench-memory bench-scale bench-report clean

venv: $(STAMP)

# Rebuilt when the dependency list or the pins change. The constraints file keeps torch on the
# local CPU wheel (an unpinned torch would pull several GB of CUDA packages).
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "p2pnode needs Python >= 3.11; run: make PYTHON=python3.11 ...")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	@touch $@

# Ten daemons of the default algorithm learning over TCP on real MNIST digits (the testnet 251 s), then Local simulated
# on the same nodes (36 s; 5 minutes in all on 2 cores: BENCHMARKS.md, "`make demo`"); tools/demo.py --baselines adds Oracle.
demo: venv
	$(BIN)/python -m tools.demo --out demo-out

# Test files spread over TEST_WORKERS processes, each file whole on one (its module fixtures,
# the testnets most files share among their tests, then run once), the longest files first
# (tests/conftest.py, LONGEST_FIRST; xdist's own reordering off); TEST_WORKERS=0: one process.
# Three on two cores: a fifth of the suite's time is spent waiting on daemons, which a third
# process fills (BENCHMARKS.md, "`make test`").
TEST_WORKERS ?= 3
test: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The edit-run loop: the modules marked quick (no daemons, no training; tests/conftest.py).
test-quick: venv
	$(BIN)/python -m pytest --quick -q

# Formatting and lint rules (pyproject.toml, [tool.ruff]); `make format` applies the formatter.
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv
	$(BIN)/p2pnode bench protocol
	$(BIN)/p2pnode bench transport

# The learning benchmark of BENCHMARKS.md: 5 methods x 2 scenarios x 3 evaluation seeds (Scenario 1's
# 15 runs took 38 minutes on 2 cores, other jobs beside them for part of it, 2026-11-26; finished runs of the same commit are reused).
bench-learning: venv
	$(BIN)/python -m tools.bench.learning --out bench-out/learning --save learning

# The heterogeneous-learning benchmark of BENCHMARKS.md (issue #13): MAPL-Dual against Local, 3 evaluation
# seeds, 2 scenarios, 5 and 10 samples per class (finished runs of the same commit are reused).
bench-heterogeneous: venv
	$(BIN)/python -m tools.bench.heterogeneous --out bench-out/heterogeneous --methods local mapl-dual --save heterogeneous

# The SCooL benchmark of BENCHMARKS.md (24 runs, 33 minutes of run time, 23 minutes on the 2-core machine).
bench-scool: venv
	$(BIN)/python -m tools.bench.scool --out bench-out/scool --save scool

# The daemon-memory benchmark of BENCHMARKS.md (issue #15): four 4-daemon testnets of 25 rounds.
bench-memory: venv
	$(BIN)/python -m tools.bench.memory --out bench-out/memory --save memory
	$(BIN)/python -m tools.bench.memory --stages --save memory-stages

# The discovery scaling table of BENCHMARKS.md (issue #16): testnets of 10, 30 and 100 daemons
# with a bounded view (on 2 cores the 100 daemons' views were all at target 249 s after the start, then held 30 s).
bench-scale: venv
	$(BIN)/python -m tools.bench.scale --out bench-out/scale --nodes 10 30 100 --save scale

# The testnet-against-simulator table of BENCHMARKS.md (issue #5): 10 daemons launched with
# `p2pnode testnet --check` beside the simulator on the same spec, MAPL in Scenarios 1 and 2 and
# mapl-nocgl in Scenario 1, seeds 1 and 2: the simulations first, 2 at a time, then the 6 testnets
# one after the other (each 70 s on a quiet 2-core machine, over 3 minutes on a busy one).
.PHONY: bench-parity
bench-parity: venv
	$(BIN)/python -m tools.bench.parity --preset learning --seeds 1 2 --out bench-out/parity --save parity-learning

# Redraw BENCHMARKS.md's tables from their result files (tools/bench/results/); a test fails
# when a table and its file disagree.
bench-report: venv
	$(BIN)/python -m tools.bench.render

clean:
	rm -rf $(VENV) demo-out bench-out .pytest_cache .hypothesis *.egg-info
