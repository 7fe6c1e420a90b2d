# servesim: `make demo` and `make test` each build .venv from nothing and run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench docs clean gpu-check

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/servesim run examples/infermax-default.yaml --out out/demo
	@echo
	@echo "next: source .venv/bin/activate   (puts servesim on your PATH; then docs/guide/getting-started.md)"

# Serial on purpose: on a 2-core machine pytest-xdist's `-n 2` was slower (624 s against 452 s serial, the cores shared
# with other work; 402 s serial in a quieter moment) and a CPU-timing test failed under it. The dots are pytest's
# progress, one per test.
test: $(STAMP)
	@echo "make test: about 1,070 tests, 5-16 minutes on 2 cores (272-656 s, 963 s pinned to one busy core); one dot per passing test"
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/speed.py

# The documentation site: MkDocs + Material into .venv (the `docs` extra), the generated reference pages, then a
# strict build (a broken link or anchor fails it) into out/site.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/python docs/gen_tables.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "site: out/site/index.html (or: $(BIN)/mkdocs serve)"

# On a machine with a CUDA GPU and PyTorch (no venv: the GPU image's python3 has torch): profile Llama-2-7B and
# Llama-3-8B with the engine kernels, Mixtral's experts and FP8 GEMMs, a compiled batch-1 decode as the yardstick,
# calibrate, check against the shipped model; report.md, summary.json and the CSVs land in out/gpu-check.
gpu-check:
	PYTHONPATH=. $(PY) -m profiles.gpu_check --out out/gpu-check

clean:
	rm -rf $(VENV) out .pytest_cache
