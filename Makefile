# Two entry points: `make demo` (the tiny Kimi model in real SGLang on CPU) and `make test` (the test suite).
# Both create .venv when missing and install everything into it; re-running skips the install.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.sglang-kimi-installed
SGLANG_VERSION := 0.5.23

.PHONY: install demo test test-unit test-statistical test-e2e gpu-bundle clean

$(STAMP): pyproject.toml requirements/sglang-cpu.txt requirements/constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -r requirements/sglang-cpu.txt -c requirements/constraints.txt
	$(PIP) --no-deps --no-warn-conflicts sglang==$(SGLANG_VERSION)
	$(PIP) --no-warn-conflicts -e ".[eval,test]" -c requirements/constraints.txt
	@# Mooncake's CPU build (PD disaggregation's KV transfer in the tests) links libibverbs: Debian's, unpacked here
	$(PY) scripts/fetch_rdma_libs.py $(VENV)/rdma-libs
	@# SpecForge's own export code, in a folder of its own (the tests run it there): its pins (torch 2.11, sglang 0.5.14,
	@# transformers 5.8.1) have no CPU build on the registry, so it runs on this environment's torch and transformers
	$(PIP) --no-deps --upgrade --target $(VENV)/specforge specforge==0.2.0
	@# sglang was installed without its GPU requirements on purpose: say so once, and show any other conflict.
	@unmet=$$($(PY) -m pip check 2>/dev/null | grep -c '^sglang '); \
	  echo "note: sglang $(SGLANG_VERSION) is installed without $$unmet of its requirements (CUDA wheels, torch 2.14.1):" \
	       "expected, its CPU serving path needs only requirements/sglang-cpu.txt"
	@$(PY) -m pip check 2>/dev/null | grep -v -e '^sglang ' -e '^No broken requirements' || true
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/sglang-kimi demo

test: install
	@start=$$(date +%s); $(PY) -m pytest -n 2 -q -ra --durations=15 tests/unit tests/statistical tests/e2e; status=$$?; \
	  elapsed=$$(( $$(date +%s) - start )); echo "make test: $$((elapsed / 60))m$$((elapsed % 60))s"; exit $$status

test-unit: install
	$(PY) -m pytest -q -ra tests/unit

test-statistical: install
	$(PY) -m pytest -q -ra tests/statistical

test-e2e: install
	$(PY) -m pytest -q -ra tests/e2e

# What a lent GPU machine lacks (SGLang and the packages its serving path imports), as wheels in .gpu-bundle/, and
# the paths that must travel with the tree (docs/gpu.md, "The deciding run").
gpu-bundle: install
	$(PY) scripts/build_gpu_bundle.py

clean:
	rm -rf $(VENV) build dist *.egg-info
