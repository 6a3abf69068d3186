"""trainer.strategy's methods a Lightning script calls directly (issue 37): Lightning's names, positions and
defaults, checked by calling them on a one-process Trainer of both libraries. (Two processes: tests/test_ddp.py,
test_collectives_and_rank_properties, reads what tests/ddp_scripts/facts.py recorded.)"""
import os
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain


def _layer():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 1)


class Ours(tasktrain.TaskModule):
    def __init__(self):
        super().__init__()
        self.layer = _layer()

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Theirs(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = _layer()

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fitted(lib, module):
    trainer = lib.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2))
    return trainer


@pytest.fixture(scope="module")
def both():
    return {"ours": (_fitted(tasktrain, Ours()), None), "theirs": (_fitted(pl, Theirs()), None)}


@pytest.mark.parametrize("lib", ["ours", "theirs"])
def test_checkpoint_methods_by_lightnings_keywords(both, lib, tmp_path):
    trainer = both[lib][0]
    strategy, module = trainer.strategy, trainer.lightning_module
    path = str(tmp_path / "by_hand.ckpt")
    strategy.save_checkpoint({"state_dict": module.state_dict(), "note": "mine"}, filepath=path, storage_options=None)
    loaded = strategy.load_checkpoint(checkpoint_path=path, weights_only=True)
    assert loaded["note"] == "mine"
    assert sorted(loaded["state_dict"]) == ["layer.bias", "layer.weight"]
    assert torch.equal(loaded["state_dict"]["layer.weight"], module.layer.weight.detach())
    strategy.remove_checkpoint(filepath=path)
    assert not os.path.exists(path)


@pytest.mark.parametrize("lib", ["ours", "theirs"])
def test_collectives_and_members_by_lightnings_signatures(both, lib):
    trainer = both[lib][0]
    strategy = trainer.strategy
    assert float(strategy.reduce(torch.tensor(3.0), None, "sum")) == 3.0  # (tensor, group, reduce_op)
    assert float(strategy.reduce(torch.tensor(3.0), group=None, reduce_op="max")) == 3.0
    mine = torch.tensor([1.0, 2.0], requires_grad=True)
    (strategy.all_gather(mine, None, True) * 3).sum().backward()  # (tensor, group, sync_grads)
    assert mine.grad.tolist() == [3.0, 3.0]
    strategy.barrier("here")
    strategy.barrier(name="there")
    moved = strategy.batch_to_device({"x": torch.ones(1)}, torch.device("cpu"), 0)  # (batch, device, dataloader_idx)
    assert moved["x"].device == torch.device("cpu")
    assert strategy.lightning_module is trainer.lightning_module
    assert strategy.strategy_name == "single_device"
    assert sorted(strategy.lightning_module_state_dict()) == ["layer.bias", "layer.weight"]
    with strategy.model_sharded_context():
        assert torch.nn.Linear(1, 1).weight.device == torch.device("cpu")


def test_signatures_of_what_a_script_calls_are_lightnings():
    import inspect

    import lightning.pytorch.strategies as theirs

    import tasktrain.strategies as ours

    for name in ("SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy"):
        for method in ("save_checkpoint", "load_checkpoint", "remove_checkpoint", "all_gather", "barrier",
                       "batch_to_device", "lightning_module_state_dict", "model_sharded_context", "backward",
                       "optimizer_step", "training_step", "validation_step", "test_step", "predict_step"):
            their_parameters = list(inspect.signature(getattr(getattr(theirs, name), method)).parameters.values())
            our_parameters = list(inspect.signature(getattr(getattr(ours, name), method)).parameters.values())
            assert [(p.name, p.kind, p.default) for p in our_parameters] == \
                   [(p.name, p.kind, p.default) for p in their_parameters], (name, method)
        # reduce: Lightning's (tensor, group=None, reduce_op="mean") first, then tasktrain's op= keyword-only
        if name != "SingleDeviceStrategy":  # (Lightning's there: (tensor, *args, **kwargs))
            our_reduce = inspect.signature(getattr(ours, name).reduce).parameters
            their_reduce = inspect.signature(getattr(theirs, name).reduce).parameters
            assert list(our_reduce)[:4] == list(their_reduce) and list(our_reduce)[4:] == ["op"]
            assert our_reduce["reduce_op"].default == their_reduce["reduce_op"].default == "mean"


def test_is_distributed_and_strategy_name_as_lightnings():
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP
    from lightning.pytorch.strategies import FSDPStrategy as TheirFSDP

    from tasktrain.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Lightning's: deprecated)
        assert TheirDDP().is_distributed is DDPStrategy().is_distributed is True
    # (Lightning's FSDPStrategy has none; tasktrain's, a strategy of several processes, says True as DDP's)
    assert FSDPStrategy().is_distributed is DeepSpeedStrategy().is_distributed is True
    assert TheirFSDP.strategy_name == FSDPStrategy.strategy_name == "fsdp"
    assert DeepSpeedStrategy.strategy_name == "deepspeed" and SingleDeviceStrategy.strategy_name == "single_device"
    assert FSDPStrategy.get_registered_strategies() == TheirFSDP.get_registered_strategies() == ["fsdp",
                                                                                              "fsdp_cpu_offload"]


def test_reduce_says_what_a_tasktrain_style_positional_op_means_and_refuses_a_group():
    from tasktrain.strategies import DDPStrategy, SingleDeviceStrategy

    for strategy in (DDPStrategy(), SingleDeviceStrategy("cpu")):
        assert float(strategy.reduce(torch.tensor(2.0), op="sum")) == 2.0  # tasktrain's keyword
        with pytest.raises(ValueError, match=r"second parameter is Lightning's group.*reduce_op='sum'"):
            strategy.reduce(torch.tensor(2.0), "sum")
        with pytest.raises(ValueError, match="give the reduction once"):
            strategy.reduce(torch.tensor(2.0), reduce_op="max", op="sum")
        with pytest.raises(ValueError, match="torch.distributed.all_gather"):
            strategy.all_gather(torch.ones(1), group=object())


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_empty_init_skips_the_parameters_initialisation_as_lightnings(strategy, monkeypatch):
    """`trainer.init_module(empty_init=True)` / `strategy.tensor_init_context(empty_init=True)`: torch.nn.init is
    skipped (the weights will be loaded), as Lightning's; None and False initialise. tasktrain initialised always."""
    counts = {}
    for lib in (tasktrain, pl):
        calls = []
        monkeypatch.setattr(torch.Tensor, "uniform_", lambda self, *a, **k: calls.append(1) or self)
        kwargs = dict(strategy="ddp", devices=2) if strategy == "ddp" else dict(devices=1)
        trainer = lib.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, **kwargs)
        for empty in (None, False, True):
            before = len(calls)
            with trainer.init_module(empty_init=empty):
                torch.nn.Linear(2, 2)
            with trainer.strategy.tensor_init_context(empty_init=empty):
                torch.nn.Linear(2, 2)
            counts[(lib.__name__, empty)] = len(calls) - before
        monkeypatch.undo()
    assert [counts[("tasktrain", e)] for e in (None, False, True)] == \
        [counts[("lightning.pytorch", e)] for e in (None, False, True)] == [4, 4, 0]
