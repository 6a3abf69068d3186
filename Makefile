# The README's commands. Each sets itself up on a fresh machine, and is fast when already set up.
PY      := .venv/bin/python
STAMP   := .venv/.installed
OPS     := .cache/torch_extensions/.tasktrain-ops
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export PYTHONUNBUFFERED := 1
# The venv's ninja for DeepSpeed's compiled ops, always: the system's (if any) records its builds in another log
# format, and each of the two then rebuilds what the other built.
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup demo test bench docs clean libaio slurm

setup: $(STAMP) $(OPS) slurm

# torch first and pinned: an unpinned torch (asked for by deepspeed or by us) would pull a multi-GB CUDA build.
$(STAMP): setup.py requirements-dev.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e . -r requirements-dev.txt
	touch $(STAMP)

# Offload to disk (DeepSpeed's async_io op) compiles against libaio's headers: the Debian/Ubuntu package libaio-dev,
# installed here when missing (as root), else a message saying how.
libaio:
	@dpkg -s libaio-dev >/dev/null 2>&1 || test -e /usr/include/libaio.h || \
	if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q libaio-dev; \
	else echo "make: offload to disk needs libaio's headers: run 'sudo apt-get install -y libaio-dev' (Debian/Ubuntu)," \
	  "then make again; tests of it fail until then." >&2; fi

# The SLURM tests (tests/test_slurm.py) run a real cluster on this machine: Debian's slurmctld, two slurmd and munge,
# started by the tests themselves in a temporary folder. Installed here when missing (as root), else a message.
slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
	  && command -v munged >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ]; then apt-get update -q && \
	  apt-get install -y -q --no-install-recommends slurmd slurmctld slurm-client munge; \
	else echo "make: the SLURM tests need a SLURM cluster's programs: run 'sudo apt-get install -y" \
	  "--no-install-recommends slurmd slurmctld slurm-client munge' (Debian/Ubuntu), then make again;" \
	  "tests/test_slurm.py fails until then." >&2; fi

# DeepSpeed's C++ ops the tests use, compiled once into TORCH_EXTENSIONS_DIR before the tests (each takes minutes
# on 2 cores, longer than a test's timeout): cpu_adam (optimizer offload) and async_io (offload to disk), for
# DeepSpeed's CPU accelerator, which the tests train on. A lock left by a build that was killed is cleared first
# (tasktrain/strategies/deepspeed/ops.py), else this step would wait for it forever.
$(OPS): $(STAMP) | libaio
	DS_ACCELERATOR=cpu $(PY) -c "from tasktrain.strategies.deepspeed.ops import clear_stale_op_locks; \
	clear_stale_op_locks(); \
	from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; \
	CPUAdamBuilder().load(); \
	AsyncIOBuilder().is_compatible() and AsyncIOBuilder().load()"
	touch $(OPS)

demo: $(STAMP)
	$(PY) examples/digits.py --strategy ddp --devices 2

# Two pytest workers, one test file each at a time (--dist loadfile keeps a file's shared launched runs in one
# worker): many tests wait on process start-up, rendezvous and file I/O, so two files at once take ~10 minutes on 2
# cores where one at a time took ~15. `$(PY) -m pytest -q tests` still runs them one by one.
test: $(STAMP) $(OPS) slurm
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

bench: $(STAMP) $(OPS)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/startup.py
	$(PY) benchmarks/ddp.py
	$(PY) benchmarks/deepspeed_memory.py
	$(PY) benchmarks/deepspeed_offload.py
	$(PY) benchmarks/fsdp_memory.py
	$(PY) benchmarks/gpt.py

clean:
	rm -rf .venv .cache build *.egg-info
