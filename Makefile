# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then run the main job (a real max-autotune compile in several
#               processes sharing the cache, then a later job that starts warm; three
#               rounds, each on a database of its own in a temporary directory; the last
#               round's is kept to explore). make demo ROUNDS=1 is the short form.
#   make test   set up .venv, then run the whole test suite (PostgreSQL must be running)
#   make lint   ruff and mypy (configured in pyproject.toml), and no import cycle among the
#               modules, counting the imports under `if TYPE_CHECKING:` (type hints only);
#               CI runs it before the tests
VENV ?= .venv
PY := $(VENV)/bin/python
# torch==2.13.0 is a CPU wheel where one is on disk (our dev and CI machines). Elsewhere,
# without CUDA, export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu first, or
# pip takes a multi-GB CUDA build. A torch that is already importable is kept as it is.
TORCH_SPEC ?= torch==2.13.0
ROUNDS ?= 3

.PHONY: demo test lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,postgresql]"
	touch $@

demo: $(VENV)/.installed
	$(PY) tools/demo.py --rounds $(ROUNDS)

test: $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(PY) -m ruff check tunecache tests tools migrations
	$(PY) -m mypy
	$(PY) tools/import_graph.py

clean:
	rm -rf $(VENV) build *.egg-info
