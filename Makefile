# entroloop — the two set-up commands are `make demo` and `make test`; both start from nothing.
# Downloads are cached outside the clone (pip: ~/.cache/pip, Maven: ~/.m2, MinIO: ~/.cache/entroloop).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
DEMO_DIR ?= .demo
DEMO_REQUESTS ?= 2000

.PHONY: demo test test-fast venv services-up services-down readme-settings clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,store,kafka,s3,gateway,intent-light]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/entroloop demo --requests $(DEMO_REQUESTS) --data-dir $(DEMO_DIR) --reset
	$(VENV)/bin/entroloop report --data-dir $(DEMO_DIR) --out $(DEMO_DIR)/report.html

test-fast: venv
	$(PY) -m pytest tests/unit -q

test: venv
	bash scripts/test.sh

services-up: venv
	bash scripts/services.sh up

services-down:
	bash scripts/services.sh down

readme-settings: venv
	$(PY) scripts/readme_settings.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
