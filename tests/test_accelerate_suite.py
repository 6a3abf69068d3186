"""scripts/accelerate_suite.py, the harness that runs Accelerate's own test scripts one function at a time: the import
renaming, pass/fail detection on a planted script (1 process and a real world of 2 under torch.distributed.run), and a
small fixed selection of Accelerate's functions under Accelerate and under tasktrain."""
import importlib.util
import os
import sys
import textwrap

import pytest

pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import accelerate_suite as suite  # noqa: E402

TIMEOUT = 120


def test_rename_points_accelerate_imports_at_tasktrain_and_keeps_the_fixtures():
    source = textwrap.dedent("""\
        import accelerate
        import accelerate.utils
        from accelerate import Accelerator
        from accelerate.utils import (
            gather,
        )
        from accelerate.utils.operations import reduce
        from accelerate.test_utils import RegressionModel
        from accelerate.test_utils.testing import assert_exception
        import accelerate.test_utils
        from accelerated import x
        text = "from accelerate import Accelerator"
        """)
    assert suite.rename_imports(source) == textwrap.dedent("""\
        import tasktrain as accelerate
        import tasktrain.utils
        from tasktrain import Accelerator
        from tasktrain.utils import (
            gather,
        )
        from tasktrain.utils.operations import reduce
        from accelerate.test_utils import RegressionModel
        from accelerate.test_utils.testing import assert_exception
        import accelerate.test_utils
        from accelerated import x
        text = "from accelerate import Accelerator"
        """)
    renamed = suite.rename_imports(source, rename_test_utils=True)
    assert "from tasktrain.test_utils import RegressionModel" in renamed
    assert "from tasktrain.test_utils.testing import assert_exception" in renamed
    assert "import tasktrain.test_utils\n" in renamed


def test_every_upstream_script_is_renamed_to_tasktrain_imports_only():
    scripts_dir = suite.upstream_scripts_dir()
    for name in suite.SCRIPTS:
        with open(os.path.join(scripts_dir, name + ".py")) as handle:
            renamed = suite.rename_imports(handle.read())
        imports = [line for line in renamed.splitlines() if line.startswith(("from accelerate", "import accelerate"))]
        assert all(line.startswith("from accelerate.test_utils") for line in imports), (name, imports)
        assert "from tasktrain" in renamed, name


def test_first_error_line_is_the_childs_exception_not_the_launchers():
    output = textwrap.dedent("""\
        [rank1]: Traceback (most recent call last):
        [rank1]:   File "driver.py", line 3, in <module>
        [rank1]: AssertionError: Expected exception of type X
        E1202 torch.distributed.elastic.multiprocessing.api: failed
        Traceback (most recent call last):
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        """)
    assert suite.first_error_line(output) == "AssertionError: Expected exception of type X"
    assert suite.first_error_line("ModuleNotFoundError: No module named 'x'\n") == \
        "ModuleNotFoundError: No module named 'x'"
    assert suite.first_error_line("ImportError: cannot import name 'y' from 'tasktrain.utils' "
                                  "(/work/x/tasktrain/utils/__init__.py)\n") == \
        "ImportError: cannot import name 'y' from 'tasktrain.utils'"


PLANTED = '''\
import torch
from accelerate import PartialState
from accelerate.test_utils import are_the_same_tensors
from accelerate.utils import gather


def test_ok(state):
    values = gather(torch.tensor([float(state.process_index)]))
    assert values.tolist() == [float(i) for i in range(state.num_processes)], values


def test_world(state, expected):
    assert state.num_processes == expected, (state.num_processes, expected)
    # --rename-test-utils: the fixtures are tasktrain's, and they see the other process.
    assert are_the_same_tensors.__module__.startswith("tasktrain."), are_the_same_tensors.__module__
    assert are_the_same_tensors(torch.tensor([1.0, 2.0]))
    assert not are_the_same_tensors(torch.tensor([float(state.process_index)]))


def test_bad(state):
    raise ValueError("planted failure")


def test_hang(state):
    import time
    time.sleep(600)
'''


def test_harness_tells_pass_from_fail_on_one_process_and_on_two(tmp_path):
    (tmp_path / "test_ops.py").write_text(PLANTED)
    ok = suite._case("test_ops", "test_ok", "S.test_ok(state)")  # SETUP["test_ops"] makes `state`
    bad = suite._case("test_ops", "test_bad", "S.test_bad(state)")
    world = suite._case("test_ops", "test_world", "S.test_world(state, 2)\nS.test_ok(state)")
    single_only = suite._case("test_ops", "test_ok", "S.test_ok(state)", only="single")
    hang = dict(suite._case("test_ops", "test_hang", "S.test_hang(state)"), timeout=15)
    (tmp_path / "runs").mkdir()
    records = suite.run_cases([(ok, 1), (bad, 1), (world, 2), (single_only, 2), (hang, 2)], "tasktrain",
                              str(tmp_path), TIMEOUT, rename_test_utils=True, parallel=3,
                              workdir=str(tmp_path / "runs"))
    assert [(r["function"], r["processes"], r["status"]) for r in records] == [
        ("test_ok", 1, "pass"), ("test_bad", 1, "fail"), ("test_world", 2, "pass"), ("test_ok", 2, "n/a"),
        ("test_hang", 2, "fail")], records
    assert records[1]["error"] == "ValueError: planted failure"
    # A hung pair of workers is stopped, all of it: nothing of that run is left alive.
    assert records[4]["error"].startswith("timed out after 15 s"), records[4]
    assert records[4]["seconds"] < 15 + 60
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).find(str(tmp_path)) >= 0]
    assert leftovers == [], [_cmdline(pid) for pid in leftovers]


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _upstream(script, name):
    chosen = [case for case in suite.CASES if case["script"] == script and case["name"] == name]
    assert len(chosen) == 1, (script, name)
    return chosen[0]


def _renamed_script_imports(script):
    """None when the renamed upstream script imports under tasktrain, else the import error's line."""
    with open(os.path.join(suite.upstream_scripts_dir(), script + ".py")) as handle:
        source = suite.rename_imports(handle.read())
    spec = importlib.util.spec_from_loader(f"renamed_{script}", loader=None)
    module = importlib.util.module_from_spec(spec)
    try:
        exec(compile(source, f"renamed_{script}.py", "exec"), module.__dict__)
    except ImportError as error:
        return f"{type(error).__name__}: {error}"
    return None


# The fixed selection: Accelerate's own gather check on one process and on two, and even_batches=False on two.
SELECTION = [("test_ops", "test_gather", 1), ("test_ops", "test_gather", 2),
             ("test_distributed_data_loop", "test_can_disable_even_batches", 2)]


def test_a_fixed_selection_passes_under_accelerate_and_under_tasktrain():
    jobs = [(_upstream(script, name), processes) for script, name, processes in SELECTION]
    baseline = suite.run_cases(jobs[:1], "accelerate", suite.upstream_scripts_dir(), TIMEOUT)
    assert baseline[0]["status"] == "pass", baseline
    for script in {script for script, _, _ in SELECTION}:
        assert _renamed_script_imports(script) is None, script  # every name the renamed script imports exists
    records = suite.run_cases(jobs, "tasktrain", suite.upstream_scripts_dir(), TIMEOUT, parallel=2)
    failed = [(r["function"], r["processes"], r["error"]) for r in records if r["status"] != "pass"]
    assert failed == [], failed
