# Set-up and the two entry points shown in the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without an NVIDIA GPU, take torch's CPU build: PyPI's default Linux wheel bundles CUDA (GBs).
# Where PyTorch's index cannot be reached (offline mirrors), pip's own configuration decides.
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(if $(shell curl -sfm 5 -o /dev/null $(CPU_INDEX)/torch/ && echo up),--extra-index-url $(CPU_INDEX)))

# The dashboard's browser tests drive Debian's Chromium (never a browser downloaded by Playwright).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test setup chromium

setup: $(VENV)/.installed chromium

chromium:
	@command -v chromium >/dev/null 2>&1 || $(SUDO) apt-get install -y --no-install-recommends chromium \
		|| { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==2.13.0" $(TORCH_INDEX)
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: setup
	$(BIN)/tuner launch --space spaces/quickstart.yaml
	@echo "Browse it: $(BIN)/tuner serve   (then open http://127.0.0.1:8000/dashboard)"

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest
