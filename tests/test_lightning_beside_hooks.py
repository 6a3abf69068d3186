"""Lightning 2.6 beside tasktrain (issue 37): what the module's and the callbacks' hooks receive, and the warnings
the loop gives, under Lightning itself and under tasktrain (tiny model, CPU, one process, a few steps). Lightning is
a test dependency, imported inside the tests only."""
import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             accelerator="cpu", devices=1, max_epochs=1)
FRAMEWORKS = {"lightning": (L.Trainer, L.LightningModule), "tasktrain": (tasktrain.Trainer, tasktrain.TaskModule)}


def _quiet_lightning():
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def _described(value):
    """A hook argument as plain values: tensors as (value, requires_grad), so the frameworks compare."""
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return (round(float(value), 5), value.requires_grad)
    return value


def _batch_end_outputs(framework, returns, manual=False, accumulate=1):
    Trainer, Module = FRAMEWORKS[framework]
    seen = []

    class Net(Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return {"tensor": loss, "dict": {"loss": loss, "double": 2 * loss, "tag": [1]}, "none": None}[returns]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append(_described(outputs))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    _quiet_lightning()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(**QUIET, limit_train_batches=2, **({} if manual else {"accumulate_grad_batches": accumulate})).fit(
            Net(), DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2))
    return seen


@pytest.mark.parametrize("returns, manual, accumulate", [
    ("dict", False, 2), ("none", False, 1), ("tensor", True, 1), ("dict", True, 1)])
def test_on_train_batch_end_receives_lightnings_outputs(returns, manual, accumulate):
    """Lightning's on_train_batch_end gets a dict: the loss without its graph (divided for accumulation in automatic
    optimisation), the other keys as returned; {} when training_step returned None."""
    theirs = _batch_end_outputs("lightning", returns, manual, accumulate)
    ours = _batch_end_outputs("tasktrain", returns, manual, accumulate)
    assert ours == theirs
    assert all(isinstance(outputs, dict) for outputs in ours) and len(ours) == 2
    if returns != "none":
        assert ours[0]["loss"][1] is False
