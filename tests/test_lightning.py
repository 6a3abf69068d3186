"""Issue 17 (core): a Lightning script runs after renames alone; every hook is called or refused; DataModules."""
import importlib

import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import Trainer


def test_rename_rule_module_paths():
    # every Lightning module path a script imports from, under the same name
    for path, names in {
        "tasktrain.utilities": ["rank_zero_only", "rank_zero_info", "rank_zero_warn", "rank_zero_debug",
                                "is_overridden", "move_data_to_device", "grad_norm", "AttributeDict"],
        "tasktrain.utilities.rank_zero": ["rank_zero_only", "rank_zero_info", "rank_zero_warn"],
        "tasktrain.utilities.types": ["STEP_OUTPUT", "OptimizerLRScheduler", "EVAL_DATALOADERS"],
        "tasktrain.callbacks.early_stopping": ["EarlyStopping", "EarlyStoppingReason"],
        "tasktrain.loggers": ["TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger"],
        "tasktrain.callbacks": ["Callback", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor"],
        "tasktrain": ["TaskModule", "Trainer", "Callback", "seed_everything"],
    }.items():
        module = importlib.import_module(path)
        for name in names:
            assert hasattr(module, name), f"{path}.{name} is missing"


def test_rank_zero_only_follows_the_trainer_rank(monkeypatch):
    from tasktrain.utilities import rank_zero_only

    calls = []

    @rank_zero_only
    def note(x):
        calls.append(x)
        return x

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert note(1) is None and calls == []
    assert rank_zero_only(lambda: 1, default=7)() == 7
    Trainer(max_steps=1, **quiet()).fit(Linear(), loader(8))  # one process: the trainer sets rank 0
    assert rank_zero_only.rank == 0 and note(2) == 2 and calls == [2]


def test_move_data_to_device_and_grad_norm():
    from tasktrain.utilities import grad_norm, move_data_to_device

    moved = move_data_to_device({"a": [torch.ones(2)], "b": 3}, "cpu")
    assert moved["b"] == 3 and moved["a"][0].device.type == "cpu"
    module = Linear()
    module(torch.ones(2, 4)).sum().backward()
    norms = grad_norm(module, 2)
    expected = torch.cat([p.grad.flatten() for p in module.parameters()]).norm()
    assert set(norms) == {"grad_2.0_norm/layer.weight", "grad_2.0_norm/layer.bias", "grad_2.0_norm_total"}
    assert torch.allclose(norms["grad_2.0_norm_total"], expected)
    with pytest.raises(ValueError, match="positive"):
        grad_norm(module, 0)


class _Scores(Linear):
    def __init__(self, scores):
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.scores[self.current_epoch]))


@pytest.mark.parametrize("scores,kwargs,reason", [
    ([3, 3, 3, 3], {"patience": 2}, "PATIENCE_EXHAUSTED"),
    ([3, 0.5, 3, 3], {"stopping_threshold": 1.0}, "STOPPING_THRESHOLD"),
    ([3, 50, 3, 3], {"divergence_threshold": 10.0}, "DIVERGENCE_THRESHOLD"),
    ([3, float("nan"), 3, 3], {}, "NON_FINITE_METRIC"),
    ([3, 2, 1, 0], {}, "NOT_STOPPED"),
])
def test_early_stopping_reason(scores, kwargs, reason):
    from tasktrain.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

    stopper = EarlyStopping("score", verbose=False, **kwargs)
    Trainer(max_epochs=4, callbacks=[stopper], **quiet()).fit(_Scores(scores), loader(16), loader(8))
    assert stopper.stopping_reason is EarlyStoppingReason[reason]
    assert stopper.stopping_reason_message == stopper.reason
    assert (stopper.reason is None) == (reason == "NOT_STOPPED")
    again = EarlyStopping("score")
    again.load_state_dict(stopper.state_dict())
    assert again.stopping_reason is stopper.stopping_reason and again.stopping_reason_message == stopper.reason


def test_lightning_module_alias():
    trainer = Trainer(max_steps=1, **quiet())
    module = Linear()
    trainer.fit(module, loader(8))
    assert trainer.lightning_module is module is trainer.module
