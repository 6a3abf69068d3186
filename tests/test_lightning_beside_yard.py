"""Differences found by the yardstick (Lightning 2.6's own tests/tests_pytorch with imports renamed to tasktrain,
/work/YARD.md), each checked here beside Lightning itself (a test dependency, imported only here) on CPU."""
import warnings

import pytest
import torch

from tasktrain.demos.boring_classes import BoringModel


@pytest.fixture(scope="module")
def L():
    import lightning

    return lightning


def caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


def test_load_from_checkpoint_of_an_empty_state_dict_warns_as_lightning(L, tmp_path):
    """tests_pytorch/core/test_saving.py::test_load_from_checkpoint_warn_on_empty_state_dict: strict=False and a
    checkpoint whose state dict is empty load, with the missing keys' warning and then "contains no parameters"."""
    path = tmp_path / "empty.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "pytorch-lightning_version": L.__version__}, path)

    from lightning.pytorch.demos.boring_classes import BoringModel as LitBoringModel

    ours, ours_said = caught(lambda: BoringModel.load_from_checkpoint(path, strict=False))
    theirs, theirs_said = caught(lambda: LitBoringModel.load_from_checkpoint(path, strict=False))
    said = [m.replace(str(tmp_path), "<tmp>") for m in ours_said]
    assert said == [m.replace(str(tmp_path), "<tmp>") for m in theirs_said]
    assert said[-1] == f"The state dict in {path!r} contains no parameters.".replace(str(tmp_path), "<tmp>")
    assert ours.device.type == theirs.device.type == "cpu"
