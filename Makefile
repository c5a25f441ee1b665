# Set-up and the two entry points shown in the README: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without an NVIDIA GPU, take torch's CPU build: PyPI's default Linux wheel bundles CUDA (GBs).
# Where PyTorch's index cannot be reached (offline mirrors), pip's own configuration decides.
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(if $(shell curl -sfm 5 -o /dev/null $(CPU_INDEX)/torch/ && echo up),--extra-index-url $(CPU_INDEX)))
TORCH_DEFAULT := $(if $(shell command -v nvidia-smi 2>/dev/null),the CUDA build from PyPI (an NVIDIA GPU is here),the build pip's configuration gives ($(CPU_INDEX) cannot be reached))

# Debian packages the tests drive: Chromium for the dashboard's browser tests (never a browser
# downloaded by Playwright) and docker-compose to validate the compose file (no engine needed).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
DEBIAN_TOOLS := chromium docker-compose
MISSING_TOOLS = $(foreach tool,$(DEBIAN_TOOLS),$(if $(shell command -v $(tool) 2>/dev/null),,$(tool)))

.PHONY: demo test setup debian-tools

setup: $(VENV)/.installed

debian-tools:
	@test -z "$(MISSING_TOOLS)" || $(SUDO) apt-get install -y --no-install-recommends $(MISSING_TOOLS) \
		|| { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(MISSING_TOOLS); }

# Each step says what it does before it starts: pip is quiet, and the installs take a minute or more.
$(VENV)/.installed: pyproject.toml
	@echo "setup 1/4: a virtual environment in $(VENV), with the latest pip ..."
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@index='$(TORCH_INDEX)'; echo "setup 2/4: installing torch 2.13.0, $${index:+with $$index}$${index:-$(TORCH_DEFAULT)} ..."; \
		$(BIN)/pip install --quiet "torch==2.13.0" $$index
	@echo "setup 3/4: installing lm-tuner and its dependencies (Optuna, Ray Tune, SQLAlchemy, FastAPI, plotly ...) and the test tools ..."
	@PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install --quiet -e ".[test]"
	@echo "setup 4/4: building the C++ kernels for recurrent layers on CPUs ..."
	@$(BIN)/tuner kernels build || echo "trials on CPUs will take the PyTorch operations"
	@touch $@
	@echo "setup done: $(BIN)/tuner is ready"

demo: setup
	$(BIN)/tuner launch --space spaces/quickstart.yaml
	@echo "Browse it: $(BIN)/tuner serve   (then open http://127.0.0.1:8000/dashboard)"

# The suite runs in TEST_WORKERS processes (pytest-xdist); the tests marked serial time something against another
# measurement, so they run afterwards, alone.
TEST_WORKERS ?= 2
test: setup debian-tools
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not serial"
	$(BIN)/python -m pytest -m serial
