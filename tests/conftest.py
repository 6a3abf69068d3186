import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
# Tests must never inherit a launcher's world from the shell that runs them.
for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TASKTRAIN_LAUNCH", "TASKTRAIN_STRATEGY", "TASKTRAIN_PRECISION", "TASKTRAIN_GLOBAL_SEED"):
    os.environ.pop(var, None)
sys.path.insert(0, os.path.join(ROOT, "tests"))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test runs in its own directory with no seed left over from another test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TASKTRAIN_GLOBAL_SEED", raising=False)
    yield


@pytest.fixture(autouse=True, scope="session")
def _offline_trackers(tmp_path_factory):
    """Weights & Biases stays offline and silent, and neither it nor MLflow writes outside the test folders."""
    home = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            mp.setenv(var, str(home / var.lower()))
        for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS"):
            mp.delenv(var, raising=False)
        yield

