# Quick start:  make run   (the app on the bundled weights)   |   make test   (the whole suite)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: run test test-kernels lint bench clean chromium

# --retries 0: requirements.txt names PyTorch's CPU index; on a machine that reaches PyPI
# alone pip would retry that host 5 times for every package (~8 minutes), and asks once.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --retries 0 -r requirements-dev.txt
	touch $@

run: $(VENV)/.installed
	$(PY) app.py

# Debian's chromium for the browser tests: installed when missing and allowed, else a message.
chromium:
	scripts/install-chromium.sh

test: chromium $(VENV)/.installed
	$(PY) -m pytest -q

# The quick numerical tests under several CPU kernel settings (ATen's and MKL's AVX-512,
# AVX2 and plain loops), as other CPUs would run them: scripts/test-kernels.sh.
test-kernels: $(VENV)/.installed
	PY=$(PY) scripts/test-kernels.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_model.py
	$(PY) benchmarks/bench_generate.py

clean:
	rm -rf $(VENV) .venv-peer .pytest_cache test-output
