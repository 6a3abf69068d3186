"""tasktrain.test_utils (Accelerate's accelerate.test_utils path): each fixture behaves as Accelerate's own, checked
against accelerate.test_utils itself (installed as a test dependency) on this machine."""
import io
import os
import sys
import unittest
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch

accelerate_testing = pytest.importorskip("accelerate.test_utils.testing")
import accelerate.test_utils as accelerate_test_utils  # noqa: E402

import tasktrain  # noqa: E402
import tasktrain.test_utils as ours  # noqa: E402
from tasktrain.test_utils import testing as our_testing  # noqa: E402


def test_the_path_and_its_modules_are_one_package():
    from tasktrain.compat.accelerate.test_utils import training as compat_training
    from tasktrain.test_utils.training import RegressionDataset
    assert RegressionDataset is ours.RegressionDataset is compat_training.RegressionDataset
    assert our_testing.assert_exception is ours.assert_exception


def test_every_name_accelerate_test_utils_exports_is_there():
    exported = [name for name in dir(accelerate_test_utils) if not name.startswith("_")
                and name not in ("testing", "training", "examples", "scripts", "test_script", "test_sync", "test_ops")]
    assert [name for name in exported if not hasattr(ours, name)] == []
    defined = [name for name in dir(accelerate_testing) if name.startswith("require_")]
    assert [name for name in defined if not hasattr(our_testing, name)] == []


@pytest.mark.parametrize("kwargs", [dict(seed=42), dict(seed=0, length=10), dict(a=-1.5, b=0.25, length=7, seed=3)])
def test_regression_dataset_draws_accelerates_numbers(kwargs):
    theirs = accelerate_test_utils.RegressionDataset(**kwargs)
    mine = ours.RegressionDataset(**kwargs)
    assert len(mine) == len(theirs) == kwargs.get("length", 64)
    np.testing.assert_array_equal(mine.x, theirs.x)
    np.testing.assert_array_equal(mine.y, theirs.y)
    assert mine.x.dtype == mine.y.dtype == np.float32
    for index in (0, len(mine) - 1):
        assert mine[index].keys() == theirs[index].keys() == {"x", "y"}
        assert mine[index]["x"] == theirs[index]["x"] and mine[index]["y"] == theirs[index]["y"]


def test_regression_dataset_without_a_seed_differs_each_time_and_batches_like_accelerates():
    assert not np.array_equal(ours.RegressionDataset().x, ours.RegressionDataset().x)
    ours_batch = next(iter(torch.utils.data.DataLoader(ours.RegressionDataset(seed=1, length=8), batch_size=4)))
    theirs_batch = next(iter(torch.utils.data.DataLoader(accelerate_test_utils.RegressionDataset(seed=1, length=8),
                                                         batch_size=4)))
    assert ours_batch.keys() == theirs_batch.keys()
    for key in ours_batch:
        assert torch.equal(ours_batch[key], theirs_batch[key])


def test_regression_model_matches_accelerates_forward_parameters_and_first_batch_print():
    mine, theirs = ours.RegressionModel(a=1, b=2), accelerate_test_utils.RegressionModel(a=1, b=2)
    assert [(n, p.dtype, p.shape) for n, p in mine.named_parameters()] == \
        [(n, p.dtype, p.shape) for n, p in theirs.named_parameters()]
    x = torch.randn(5)
    printed = []
    for model in (mine, theirs):
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            first, second = model(x), model(x)
        printed.append(buffer.getvalue())
        assert torch.equal(first, x * 1 + 2) and torch.equal(second, first)
    assert printed[0] == printed[1] == "Model dtype: torch.float32, torch.float32. Input dtype: torch.float32\n"
    # Trained the same, they end the same.
    for model in (mine, theirs):
        torch.manual_seed(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in torch.utils.data.DataLoader(ours.RegressionDataset(seed=42, length=16), batch_size=4):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert torch.equal(mine.a, theirs.a) and torch.equal(mine.b, theirs.b)
    ours.RegressionModel(double_output=True)  # accepted, as Accelerate's


def _outcome(assert_exception, exception_class, raised, msg=None):
    """'ok' or the AssertionError's kind when a block raising `raised` (None: nothing) runs under assert_exception."""
    try:
        with assert_exception(exception_class, msg):
            if raised is not None:
                raise raised
    except AssertionError as error:
        return "nothing raised" if "without issue" in str(error) else "wrong"
    return "ok"


@pytest.mark.parametrize("exception_class, raised, msg", [
    (ValueError, ValueError("bad shape"), None),
    (ValueError, ValueError("bad shape"), "shape"),
    (ValueError, ValueError("bad shape"), "size"),
    (ValueError, TypeError("bad shape"), None),
    (Exception, KeyError("k"), None),
    (ValueError, None, None),
])
def test_assert_exception_agrees_with_accelerates(exception_class, raised, msg):
    expected = _outcome(accelerate_test_utils.assert_exception, exception_class, raised, msg)
    assert _outcome(ours.assert_exception, exception_class, raised, msg) == expected


def _skipped(decorator):
    class Case(unittest.TestCase):
        @decorator
        def test(self):
            pass
    return bool(getattr(Case.test, "__unittest_skip__", False))


REQUIRES = sorted(name for name in dir(accelerate_testing) if name.startswith("require_")
                  and name not in ("require_torch_min_version",))


@pytest.mark.parametrize("name", REQUIRES)
def test_each_require_decorator_skips_where_accelerates_does_on_this_machine(name):
    assert _skipped(getattr(our_testing, name)) == _skipped(getattr(accelerate_testing, name)), name


def test_the_device_probes_agree_with_accelerates_and_the_cpu_decorators_bite():
    assert (ours.torch_device, ours.device_count) == (accelerate_testing.torch_device, accelerate_testing.device_count)
    on_cpu = not torch.cuda.is_available()
    assert _skipped(ours.require_cpu) is not on_cpu
    assert _skipped(ours.require_non_cpu) is on_cpu
    assert _skipped(ours.require_multi_gpu) is (torch.cuda.device_count() < 2)
    assert _skipped(ours.skip)
    for version, skipped in (("1.0", False), ("99.0", True)):
        assert _skipped(ours.require_torch_min_version(version=version)) is skipped
        assert _skipped(accelerate_testing.require_torch_min_version(version=version)) is skipped


def test_slow_follows_run_slow(monkeypatch):
    import importlib
    monkeypatch.setenv("RUN_SLOW", "yes")
    reloaded = importlib.reload(our_testing)
    try:
        assert not _skipped(reloaded.slow)
    finally:
        monkeypatch.delenv("RUN_SLOW")
        importlib.reload(our_testing)
    assert _skipped(our_testing.slow)


@pytest.mark.parametrize("value", ["yes", "no", "1", "0", "TRUE", "off"])
def test_parse_flag_from_env_agrees_with_accelerates(monkeypatch, value):
    monkeypatch.setenv("TT_FLAG", value)
    assert our_testing.parse_flag_from_env("TT_FLAG") == accelerate_testing.parse_flag_from_env("TT_FLAG")


def test_parse_flag_from_env_default_and_bad_value(monkeypatch):
    monkeypatch.delenv("TT_FLAG", raising=False)
    assert our_testing.parse_flag_from_env("TT_FLAG", default=True) is True
    monkeypatch.setenv("TT_FLAG", "maybe")
    with pytest.raises(ValueError, match="TT_FLAG must be yes or no"):
        our_testing.parse_flag_from_env("TT_FLAG")


def test_launch_command_names_tasktrains_launcher():
    assert ours.get_launch_command(num_processes=2, debug=True, cpu=False, mixed_precision=None) == \
        ["tasktrain", "launch", "--num_processes=2", "--debug"]
    theirs = accelerate_test_utils.get_launch_command(num_processes=2, debug=True, mixed_precision=None)
    assert ours.get_launch_command(num_processes=2, debug=True, mixed_precision=None)[2:] == theirs[2:]


def test_xdist_port_helpers_agree_with_accelerates(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert ours.pytest_xdist_worker_id() == accelerate_test_utils.pytest_xdist_worker_id() == 3
    assert ours.get_torch_dist_unique_port() == accelerate_test_utils.get_torch_dist_unique_port() == 29503


def test_execute_subprocess_async_returns_lines_and_raises_on_failure_and_timeout(capsys):
    result = ours.execute_subprocess_async(
        [sys.executable, "-c", "import sys; print('out 1'); print('err 1', file=sys.stderr)"], echo=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, ["out 1"], ["err 1"])
    assert "stdout: out 1" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match=r"failed with returncode 3[\s\S]*boom"):
        ours.execute_subprocess_async([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"],
                                      quiet=True, echo=False)
    with pytest.raises(RuntimeError, match="ran past its timeout of 1 s"):
        ours.execute_subprocess_async([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1,
                                      quiet=True, echo=False)


def test_run_command_and_capture_call_output():
    assert our_testing.run_command([sys.executable, "-c", "print('hi')"], return_stdout=True) == "hi\n"
    with pytest.raises(our_testing.SubprocessCallException, match="failed with the following error"):
        our_testing.run_command([sys.executable, "-c", "raise SystemExit(2)"])
    assert ours.capture_call_output(print, "a", "b") == accelerate_test_utils.capture_call_output(print, "a", "b")


def test_path_in_package_points_into_tasktrain():
    path = ours.path_in_accelerate_package("test_utils", "training.py")
    assert path == type(path)(os.path.dirname(tasktrain.__file__)) / "test_utils" / "training.py"
    assert path.exists()


def test_temp_dir_test_case_empties_its_folder_between_tests():
    seen = []

    class Case(our_testing.TempDirTestCase):
        def test_a(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))
            (self.tmpdir / "file").write_text("x")
            (self.tmpdir / "folder").mkdir()

        def test_b(self):
            seen.append(sorted(p.name for p in self.tmpdir.iterdir()))

    result = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(Case))
    assert result.wasSuccessful() and seen == [[], []]
    assert not Case.tmpdir.exists()


def test_are_the_same_tensors_on_one_process():
    assert ours.are_the_same_tensors(torch.tensor([1.0, 2.0]))
