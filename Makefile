# The README's commands. Each sets itself up on a fresh machine, and is fast when already set up.
PY      := .venv/bin/python
STAMP   := .venv/.installed
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test bench docs clean

setup: $(STAMP)

# torch first and pinned: an unpinned torch (asked for by deepspeed or by us) would pull a multi-GB CUDA build.
$(STAMP): setup.py requirements-dev.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e . -r requirements-dev.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/digits.py --strategy ddp --devices 2

# Two pytest workers, one test file each at a time (--dist loadfile keeps a file's shared launched runs in one
# worker): many tests wait on process start-up, rendezvous and file I/O, so two files at once take ~10 minutes on 2
# cores where one at a time took ~15. `$(PY) -m pytest -q tests` still runs them one by one.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/startup.py
	$(PY) benchmarks/ddp.py
	$(PY) benchmarks/deepspeed_memory.py
	$(PY) benchmarks/fsdp_memory.py
	$(PY) benchmarks/gpt.py

clean:
	rm -rf .venv .cache build *.egg-info
