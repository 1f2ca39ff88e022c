# bsresearch: two commands do all setup on a fresh machine (Debian, Python 3.11, no GPU needed):
#   make test   create .venv, install the package with its dev extras, run the tests
#   make demo   the same environment, then the main job on the built-in MNIST-1D default
#
# torch: an exact version is installed only when the environment has no torch yet. Here
# `pip install torch==2.13.0` takes the local CPU build; an unpinned torch would pull several GB of
# CUDA packages. A GPU user installs their CUDA build of torch first (see README) and it is reused.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install data test test-slow test-fast lint typecheck demo lab test-browser docs docs-serve clean-notebooks bench bench-gpu reproduce reproduce-confirm reproduce-mechanism reproduce-gpu clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || { \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "reusing the torch installed for $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; }
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[dev,docs,hf,lightning]" 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import bsresearch, torch, papermill, mnist1d; print('bsresearch', bsresearch.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
	@# the kernel the notebooks name, inside the venv: papermill and JupyterLab run them with this Python
	$(BIN)/python -m ipykernel install --sys-prefix --name bsresearch --display-name "bsresearch (.venv)" >/dev/null
	@if $(BIN)/pip list 2>/dev/null | grep -qi '^nvidia-' && \
	    ! $(BIN)/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
	  echo "error: CUDA packages are installed on a machine without a usable GPU; see README (GPU)"; exit 1; fi
	@touch $@

# Offline data from Debian's packages, where apt is usable (root): Fashion-MNIST (dataset-fashion-mnist) and the
# English text of the language-model example (fortunes: /usr/share/games/fortunes). Carries on without them (the
# tests that need them skip, and `bsresearch datasets` says how to get Fashion-MNIST).
FORTUNES := /usr/share/games/fortunes/cookie
DEBIAN_DATA := $(if $(wildcard $(FASHION_MNIST)),,dataset-fashion-mnist) $(if $(wildcard $(FORTUNES)),,fortunes)
data:
	@if [ -n "$(strip $(DEBIAN_DATA))" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q $(DEBIAN_DATA) >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(DEBIAN_DATA) >/dev/null 2>&1; } || \
	    echo "note: could not install$(DEBIAN_DATA); the tests that need them will skip"; \
	  else echo "note:$(DEBIAN_DATA) not found; as root: apt-get install$(DEBIAN_DATA)"; fi; fi

# The test files spread over the cores (pytest-xdist), each file's tests in one process, in order. Tests marked
# exhaustive (slow variants of what a faster test covers) are left to test-slow (docs/testing.md says which).
test: install data
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not exhaustive"

# The exhaustive variants alone: `make test` and `make test-slow` together are every test.
test-slow: install data
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m exhaustive

# The tests marked neither slow (papermill end-to-end runs are) nor exhaustive: a quick check while editing.
test-fast: install data
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow and not exhaustive"

# ruff (pyflakes, pycodestyle, bugbear, isort, pyupgrade) and mypy, configured in pyproject.toml.
LINT_PATHS := bsresearch tests benchmarks notebooks/*.py
lint: install
	$(BIN)/ruff check $(LINT_PATHS)

typecheck: install
	$(BIN)/mypy

# The main job: a Keskar-style sweep on MNIST-1D through papermill (one worker per core), then its report.
demo: install
	@start=$$(date +%s); \
	$(BIN)/bsresearch sweep experiments/demo.yaml && \
	$(BIN)/bsresearch report experiments/demo.yaml && \
	echo "demo: $$(( $$(date +%s) - start )) s; figures and tables in reports/demo/"

# JupyterLab on notebooks/ with the project's kernel "bsresearch (.venv)"; a notebook saves with its .py (jupytext reads
# jupytext.toml from the server's root: the project)
LAB_STAMP := $(VENV)/.lab-installed
$(LAB_STAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[dev,lab]" 2>&1 | grep -v "^WARNING: Location" || true
	@touch $@
lab: $(LAB_STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=. --FileContentsManager.preferred_dir=notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# A real browser runs notebooks/01_train.ipynb in JupyterLab (tests/browser); Debian's chromium, apt where root
test-browser: $(LAB_STAMP)
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >/dev/null 2>&1 || \
	    echo "note: could not install chromium; the browser test will skip"; \
	  else echo "note: chromium not found and not root; the browser test will skip (as root: apt-get install chromium)"; fi; fi
	$(BIN)/pip install -q -e ".[dev,lab,browser]" 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -m pytest -q -rs tests/browser

# The documentation site (mkdocs.yml): docs/, the API from the docstrings, and the findings gallery made from
# reports/ at build time (docs/hooks/gallery.py). Strict: a broken link or anchor, a page left out, an unresolved
# docstring reference fails it. Into site/ (git-ignored); docs-serve rebuilds on every change, at 127.0.0.1:8000.
# NO_MKDOCS_2_WARNING silences Material's end-of-life banner (docs/about-docs.md says what it says).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The run notebook's parameters cell regenerated from the field comments in bsresearch/config.py (fieldhelp.py); each notebooks/*.ipynb rewritten
# from its .py, or the .py from the .ipynb, whichever is newer; outputs removed
clean-notebooks: install
	$(BIN)/python -c "import pathlib, bsresearch.fieldhelp as c; p = pathlib.Path('notebooks/01_train.py'); \
	  p.write_text(c.template_with_parameters(p.read_text()))"
	$(BIN)/jupytext --sync notebooks/[0-9]*.py
	$(BIN)/jupyter nbconvert --clear-output --inplace --log-level=WARN --ClearMetadataPreprocessor.enabled=True \
	  --ClearMetadataPreprocessor.preserve_cell_metadata_mask=tags --ClearMetadataPreprocessor.preserve_nb_metadata_mask=kernelspec \
	  --ClearMetadataPreprocessor.preserve_nb_metadata_mask=jupytext notebooks/[0-9]*.ipynb

# CPU benchmarks; results (CSV, figures) in benchmarks/results/, named with the machine.
bench: install
	$(BIN)/python benchmarks/loop_vs_dataloader.py
	$(BIN)/python benchmarks/measure_noise_vmap_vs_loop.py --examples 1000 --chunk-sizes 64,256,1000 --repeats 3
	$(BIN)/python benchmarks/measure_lanczos_vs_power.py --ks 1,3 --tol 1e-4 --train-epochs 5 --repeats 3
	$(BIN)/python benchmarks/curvature.py --repeats 3 --long-repeats 2
	$(BIN)/python benchmarks/sweep_overhead.py
	$(BIN)/bsresearch bench --preset cpu --memory-budget 256MiB --out benchmarks/results --quiet

# On a CUDA machine (about 8 minutes on an H100): throughput, memory, largest batch and FLOP/s for cnn1d, convnet,
# resnet and the language-model example at fp32, bf16 and fp16; the loop against a DataLoader loop; fused runs; a real
# out-of-memory in a sweep and the accumulation plan after it (benchmarks/gpu_check.sh; `make test` runs the tests).
bench-gpu: install data
	PYTHON=$(BIN)/python bash benchmarks/gpu_check.sh benchmarks/results 3000 "bench loop fused oom"

# Every reproduction (reports/README.md): the sweeps in order (later ones reuse earlier runs' results),
# then the reports into reports/<finding>/. The sweeps call the library directly (--engine library: the
# same runs and numbers as through the run template notebook, without papermill's ~6 s per run).
# Finished runs are kept in runs/ and skipped on a rerun; a failed run does not stop the others.
# Reports get 2 h per notebook cell: steps_to_target_fashion's exact B_simple at 60 checkpoints takes ~35 min.
# Protocol v5 (docs/protocols.md#v5): B/N or steps, lr/B at a common loss, the language-model tests at a deciding size
V5_SPECS := bn_budget_goyal lr_over_b_mnist1d lr_over_b_fashion lm_cbs_long lm_small_batch_v5
# with the sweeps their rules added (edge and seeds extensions, docs/protocols.md's record), which the reports read
V5_SWEEPS := bn_budget_bcrit bn_budget_hoffer $(V5_SPECS) lm_small_batch_sgd_v5 \
             bn_budget_goyal_ext bn_budget_goyal_seeds bn_budget_goyal_seeds_ext \
             lm_small_batch_sgd_v5_ext lm_small_batch_v5_seeds lm_small_batch_sgd_v5_seeds bn_budget_goyal_ext2 \
             bn_budget_goyal_ext3 bn_budget_bcrit_ext
# Protocol v6 (docs/protocols.md#v6), its CPU specs (with the sweeps of the edge-of-stability test's lr rule and of
# the own-setting B_crit, which its reports read); the GPU ones are in benchmarks/gpu_check.sh's reproduce stage
V6_SPECS := lr_over_b_v6_mnist1d lr_over_b_v6_fashion bn_budget_hoffer_v6 eoss_v6_mnist1d eoss_v6_fashion \
    eoss_pooled_mnist1d eoss_pooled_fashion lm_small_batch_v6 lm_cbs_v6 bn_budget_goyal_v6
# (bn_budget_bcrit_v6, on the CPU since version 6.8, gives the predictor tests their c: first)
V6_SWEEPS := bn_budget_bcrit_v6 eoss_v6_mnist1d_eta eoss_v6_fashion_eta $(V6_SPECS)
REPRODUCE_SWEEPS := keskar keskar_epochs keskar_fashion keskar_fashion_epochs hoffer hoffer_large goyal goyal_large \
                    steps_to_target steps_to_target_seeds steps_to_target_noise \
                    steps_to_target_fashion steps_to_target_fashion_seeds steps_to_target_large steps_to_target_large_seeds \
                    smith_le smith_le_edge smith_le_n smith_le_diag smith_le_large smith_kindermans \
                    masters_luschi masters_luschi_ext ghost_batch sharpness_generalization adam_vs_sgd adam_vs_sgd_seeds \
                    $(V5_SWEEPS) $(V6_SWEEPS)
REPRODUCE_REPORTS := keskar keskar_fashion dinh hoffer hoffer_large goyal goyal_large steps_to_target steps_to_target_fashion \
                     steps_to_target_large smith_le smith_le_large nqm smith_kindermans masters_luschi ghost_batch sharpness_generalization adam_vs_sgd \
                     $(V5_SPECS) $(V6_SPECS)
reproduce: install data
	@start=$$(date +%s); \
	for s in $(REPRODUCE_SWEEPS); do \
	  $(BIN)/bsresearch sweep experiments/$$s.yaml --engine library --quiet || echo "note: sweep $$s has runs that did not finish"; done; \
	for r in $(REPRODUCE_REPORTS); do $(BIN)/bsresearch report experiments/$$r.yaml --timeout 7200 || exit 1; done; \
	echo "reproduce: $$(( $$(date +%s) - start )) s wall; reports in reports/"

# The confirmatory sweeps (protocol v3, fresh seeds; experiments/confirm/README.md) and the mechanism tests (v4),
# each in the order its reports read them; reports into reports/<spec name>/.
CONFIRM_SWEEPS := keskar keskar_fashion hoffer goyal smith_le_edge smith_le_n smith_le steps_to_target steps_to_target_fashion
CONFIRM_REPORTS := keskar dinh keskar_fashion hoffer goyal smith_le steps_to_target steps_to_target_fashion
MECHANISM_SPECS := masters_luschi_mechanism hoffer_mechanism smith_le_mechanism goyal_mechanism steps_to_target_large_mechanism \
                   $(V5_SPECS)
MECHANISM_SWEEPS := masters_luschi_mechanism hoffer_mechanism smith_le_mechanism goyal_mechanism steps_to_target_large_mechanism \
                    smith_le_mechanism_edge hoffer_mechanism_x32 hoffer_mechanism_seeds $(V5_SWEEPS)
reproduce-confirm: install data
	@for s in $(CONFIRM_SWEEPS); do \
	  $(BIN)/bsresearch sweep experiments/confirm/$${s}_confirm.yaml --engine library --quiet || echo "note: sweep $${s}_confirm has runs that did not finish"; done; \
	for r in $(CONFIRM_REPORTS); do $(BIN)/bsresearch report experiments/confirm/$${r}_confirm.yaml --timeout 7200 || exit 1; done

reproduce-mechanism: install data
	@for s in $(MECHANISM_SWEEPS); do \
	  $(BIN)/bsresearch sweep experiments/$$s.yaml --engine library --quiet || echo "note: sweep $$s has runs that did not finish"; done; \
	for s in $(MECHANISM_SPECS); do $(BIN)/bsresearch report experiments/$$s.yaml --timeout 7200 || exit 1; done

# On a CUDA machine: the GPU reproductions (Keskar and steps-to-target on Fashion-MNIST with the convnet and the
# ResNet), their reports in reports/<gpu model>/<spec>/. Not yet run (no GPU was available).
GPU_SPECS := gpu_keskar_fashion_convnet gpu_keskar_fashion_resnet \
             gpu_steps_to_target_fashion_convnet gpu_steps_to_target_fashion_resnet
GPU_NAME = $(shell nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-')
reproduce-gpu: install data
	@test -n "$(GPU_NAME)" || { echo "error: no NVIDIA GPU found (nvidia-smi); the GPU reproductions need one"; exit 1; }
	@for s in $(GPU_SPECS); do \
	  $(BIN)/bsresearch sweep experiments/$$s.yaml --engine library --quiet || echo "note: sweep $$s has runs that did not finish"; done; \
	for s in $(GPU_SPECS); do $(BIN)/bsresearch report experiments/$$s.yaml --reports reports/$(GPU_NAME) || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
