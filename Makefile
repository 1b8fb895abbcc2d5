# The two commands (each sets up .venv the first time; see README):
#   make ablation   the whole tiny ablation on this CPU: Table 1 and figures in results/tiny/report/
#   make test       the test suite (start the contributor services first: `make services`, as root)
SHELL := /bin/bash
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)
# CPU-only defaults for the tests and the tiny ablation. DAPO_CPU_DEFAULTS names the ones set here (not those the
# user exported before `make`): the workflow keeps exactly those out of the jobs of any other preset, which the
# SLURM profile would otherwise copy into every GPU job (--export=ALL; workflow/rules/common.smk).
ifeq ($(origin HF_HUB_OFFLINE),undefined)
export HF_HUB_OFFLINE := 1
DAPO_CPU_DEFAULTS += HF_HUB_OFFLINE
endif
ifeq ($(origin DS_ACCELERATOR),undefined)
export DS_ACCELERATOR := cpu
DAPO_CPU_DEFAULTS += DS_ACCELERATOR
endif
export DAPO_CPU_DEFAULTS

.PHONY: setup ablation test services stop-services lint peers
setup:
	@bash scripts/bootstrap.sh

ablation: setup
	snakemake --cores all all_ablations $(ARGS)

# The suite on TEST_WORKERS pytest-xdist workers (0: one process). Each test module runs whole on one worker (its
# module fixtures set up once; the SLURM tests, all in one module, one after another): much of the suite waits (on
# a scheduler, a server, a subprocess's imports), and two workers overlap that waiting. tests/conftest.py orders them.
# OpenMP threads that sleep when idle instead of spinning: with two workers, a spinning thread takes the core another
# process needs (on a shared machine two OpenMP threads ran 5-10x slower than one: tiny.build_threads' help).
TEST_WORKERS ?= 2
test: export OMP_WAIT_POLICY ?= PASSIVE
test: setup
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

peers: setup         ## verl's loss code beside the venv (.peers/verl), for tests/test_peer_parity.py
	bash scripts/peers.sh

services:            ## a 3-node SLURM cluster (network namespaces, with accounting) and Chromium, for the integration tests
	bash scripts/services.sh start

stop-services:
	bash scripts/services.sh stop

lint: setup             ## ruff's checks and ruff format (120 columns, pyproject.toml), as CI runs them
	ruff check .
	ruff format --check .
