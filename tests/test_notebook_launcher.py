"""notebook_launcher (tasktrain/compat/accelerate/launchers.py over tasktrain/strategies/function_launcher.py): real
2-process gloo launches from a running interpreter. One driver process (tests/launcher_scripts/notebook_driver.py)
plays the notebook: it computes with torch first (warm OpenMP pool, the case where a plain fork hangs), then
launches every case below in turn; each test checks one case of its report. The checks that need no process run
here."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "launcher_scripts", "notebook_driver.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
DRIVER_TIMEOUT = 240


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("notebook"))
    # (OMP_NUM_THREADS too: the driver is a notebook with the user's default OpenMP pool, every core, whatever
    # tests/conftest.py gives the processes launched under `make test`)
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB + ("OMP_NUM_THREADS",)
           and not k.startswith("TASKTRAIN_") and not k.startswith("TORCHELASTIC_")}
    try:
        proc = subprocess.run([sys.executable, DRIVER, out], env=env, capture_output=True, text=True,
                              timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the notebook driver did not finish within {DRIVER_TIMEOUT} s (a hung launch?):\n"
                    f"{(err.stdout or b'')[-3000:]}\n{(err.stderr or b'')[-3000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)

    def case(name):
        entry = report[name]
        assert entry["ok"], f"case {name!r} raised {entry['type']}: {entry['error']}\n{entry['traceback']}"
        return entry

    def ranks(name, world=2):
        records = []
        for rank in range(world):
            with open(os.path.join(out, name, f"rank{rank}.json")) as f:
                records.append(json.load(f))
        return records

    case.ranks, case.report = ranks, report
    return case


@pytest.mark.world_size(2)
@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_static_rendezvous_trains_on_two_ranks(notebook):
    notebook("static")
    r0, r1 = notebook.ranks("static")
    assert notebook.report["parent_threads"] > 1 or os.cpu_count() == 1  # the parent's OpenMP pool was in use
    for rank, record in enumerate((r0, r1)):
        assert record["rank"] == rank and record["num_processes"] == 2
        assert record["distributed_type"].endswith("MULTI_CPU")
        assert record["gathered"] == [0.0, 10.0]  # args reached the function: scale=10
        assert record["seen"] == 8  # each rank read its half of the 16 samples
        assert record["mixed_precision"] == "bf16"  # notebook_launcher(mixed_precision="bf16")
        assert record["threads"] == 1  # see function_launcher: a forked child keeps to one thread
        assert record["moved"] > 0  # it trained
    assert r0["weight"] == r1["weight"]  # one model: DDP kept the ranks in step
    assert r0["pid"] != r1["pid"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_c10d_rendezvous(notebook):
    notebook("c10d")
    r0, r1 = notebook.ranks("c10d")
    assert [r0["rank"], r1["rank"]] == [0, 1] and r0["gathered"] == [0.0, 1.0]
    assert r0["mixed_precision"] == "no"  # nothing asked for: the default
    assert r0["weight"] == r1["weight"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_a_failing_function_raises_in_the_parent(notebook):
    entry = notebook("fails")
    assert entry["raised"] == "ChildFailedError"
    assert "rank 1 refuses to train" in entry["message"]  # the child's own error, in the parent's exception
    assert entry["seconds"] < 60  # rank 0 sleeps 120 s: the monitor stopped it


@pytest.mark.world_size(2)
@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_max_restarts_runs_the_function_again(notebook):
    notebook("restart")  # rank 1 fails on attempt 0; the default (static) rendezvous on one node
    first, second = notebook.ranks("restart-attempt0"), notebook.ranks("restart-attempt1")
    assert [r["restart"] for r in first] == [0, 0] and [r["restart"] for r in second] == [1, 1]


@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_one_process_runs_in_the_parent(notebook):
    entry = notebook("single")
    (record,) = notebook.ranks("single", world=1)
    assert record["pid"] == entry["parent_pid"]
    assert record["num_processes"] == 1 and record["distributed_type"].endswith("NO")
    assert record["mixed_precision"] == "bf16" and record["seen"] == 16


@pytest.mark.timeout(DRIVER_TIMEOUT + 30)
def test_an_accelerator_in_the_parent_is_refused(notebook):
    entry = notebook("after_accelerator")
    assert entry["raised"] and "inside the launched function" in entry["raised"]


# -- no process started ----------------------------------------------------------------------------------------------
def test_accelerate_import_paths():
    import tasktrain
    import tasktrain.utils
    from tasktrain.compat.accelerate.launchers import notebook_launcher
    from tasktrain.launchers import notebook_launcher as from_launchers

    assert tasktrain.notebook_launcher is notebook_launcher is from_launchers is tasktrain.utils.notebook_launcher


def test_bad_arguments_are_refused_before_anything_starts(monkeypatch):
    from tasktrain import notebook_launcher
    from tasktrain.compat.accelerate import state
    from tasktrain.strategies.function_launcher import launch_function

    # as in a fresh kernel: an Accelerator an earlier test of this worker process built is refused by its own check
    monkeypatch.setitem(state._SHARED, "strategy", None)

    def never(*args):
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match="mixed_precision"):
        notebook_launcher(never, num_processes=2, mixed_precision="fp4")
    with pytest.raises(ValueError, match="node rank"):
        notebook_launcher(never, num_processes=2, node_rank=1, num_nodes=1)
    with pytest.raises(ValueError, match="rdzv_backend"):
        notebook_launcher(never, num_processes=2, rdzv_backend="zeus")
    with pytest.raises(ValueError, match="positive integer"):
        launch_function(never, num_processes=0)
    with pytest.raises(ValueError, match="c10d"):
        notebook_launcher(never, num_processes=2, num_nodes=2, max_restarts=1)


def test_cuda_initialised_in_the_parent_is_refused(monkeypatch):
    import torch

    from tasktrain.strategies.function_launcher import launch_function

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as after a tensor was put on a GPU
    with pytest.raises(RuntimeError, match="CUDA was initialised in this process"):
        launch_function(print, num_processes=2)
