# The two commands (each sets up .venv the first time; see README):
#   make ablation   the whole tiny ablation on this CPU: Table 1 and figures in results/tiny/report/
#   make test       the test suite (start the contributor services first: `make services`, as root)
SHELL := /bin/bash
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export DS_ACCELERATOR ?= cpu

.PHONY: setup ablation test services stop-services lint
setup:
	@bash scripts/bootstrap.sh

ablation: setup
	snakemake --cores all all_ablations $(ARGS)

test: setup
	python -m pytest $(ARGS)

services:            ## a one-node SLURM cluster (with accounting) and Chromium, for the integration tests
	bash scripts/services.sh start

stop-services:
	bash scripts/services.sh stop

lint: setup             ## ruff's checks and ruff format (120 columns, pyproject.toml), as CI runs them
	ruff check .
	ruff format --check .
