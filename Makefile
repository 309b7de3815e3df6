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
# The newest tested torch (what users meet first). On our dev and CI machines it comes
# from the registry as a CUDA build, which runs on a CPU; their pip constraint file caps
# torch at 2.14.1, so it is lifted for this one install (TORCH_CONSTRAINT). Elsewhere,
# without CUDA, export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu first.
# `make VENV=.venv-2.13 TORCH_SPEC=torch==2.13.0 TRITON_SPEC=triton==3.8.0 venv` makes
# another (2.13.0 is a CPU wheel on disk there). A torch already importable is kept.
TORCH_SPEC ?= torch==2.15.0
TORCH_CONSTRAINT ?= /dev/null
# The Triton of the tests of users' @triton.autotune kernels (run under its interpreter):
# a CUDA torch brings its own; a CPU wheel needs one named.
TRITON_SPEC ?=
ROUNDS ?= 3

.PHONY: demo test lint clean venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || \
	    PIP_CONSTRAINT=$(TORCH_CONSTRAINT) $(PY) -m pip install -q "$(TORCH_SPEC)" $(TRITON_SPEC)
	# the constraint file would downgrade this torch (and its Triton) again
	PIP_CONSTRAINT=$(TORCH_CONSTRAINT) $(PY) -m pip install -q -e ".[test,postgresql]"
	touch $@

venv: $(VENV)/.installed

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
