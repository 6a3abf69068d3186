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


def test_mlflow_logger_warns_of_metric_names_as_lightning(L, tmp_path, monkeypatch):
    """tests_pytorch/loggers/test_mlflow.py::test_mlflow_logger_with_unexpected_characters: a metric name MLflow
    refuses is cleaned with Lightning's RuntimeWarning and words (a filter or pytest.warns on the category holds)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store, for Lightning's logger too
    # Lightning's logger makes its URI MLflow's process-wide one (mlflow.set_tracking_uri, which also sets
    # $MLFLOW_TRACKING_URI): both put back after the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.setattr(tracking_utils, "_tracking_uri", tracking_utils._tracking_uri)
    from lightning.pytorch.loggers import MLFlowLogger as LitMLFlowLogger

    from tasktrain.loggers import MLFlowLogger

    seen = []
    for name, cls in (("ours", MLFlowLogger), ("theirs", LitMLFlowLogger)):
        logger = cls(experiment_name="exp", tracking_uri=f"file:{tmp_path / name}")
        logger.experiment
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            logger.log_metrics({"[some_metric]": 10.0}, step=0)
        seen.append([(w.category, str(w.message)) for w in said if w.category is not DeprecationWarning])
    assert seen[0] == seen[1] == [(RuntimeWarning, "MLFlow only allows '_', '/', '.' and ' ' special characters in "
                                                   "metric name. Replacing [some_metric] with some_metric.")]
