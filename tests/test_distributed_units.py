"""In-process checks of the distributed strategies: options, environment detection, DataParallel on one device.

The multi-process behaviour is in tests/test_ddp.py and tests/test_ddp_failures.py (real processes).
"""
import sys
import types

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import DDP, DataParallel, TaskModule, Trainer
from tasktrain.strategies import data_parallel
from tasktrain.strategies.ddp import convert_sync_batchnorm
from tasktrain.strategies.environment import detect_environment
from tasktrain.strategies.launcher import SubprocessLauncher
from tasktrain.strategies.registry import strategy_from_name

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)


class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])[:, 0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loaders():
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g))
    return DataLoader(data, batch_size=8), DataLoader(data, batch_size=8)


def fitted_params(strategy, sampler=None, **kwargs):
    model = Regression()
    trainer = Trainer(strategy=strategy, accelerator="cpu", max_epochs=2, **QUIET, **kwargs)
    train, val = loaders()
    if sampler is not None:
        train = DataLoader(train.dataset, batch_size=8, sampler=sampler)
    trainer.fit(model, train, val)
    return trainer, model


# -- DDP options ------------------------------------------------------------------------------------------------------
def test_registry_names():
    spawn = strategy_from_name("ddp_spawn")
    assert isinstance(spawn, DDP) and spawn.start_method == "spawn" and spawn.name == "ddp_spawn"
    unused = strategy_from_name("ddp_find_unused_parameters_true")
    assert isinstance(unused, DDP) and unused.ddp_kwargs == {"find_unused_parameters": True}
    assert isinstance(strategy_from_name("dp"), DataParallel)


def test_ddp_takes_distributed_data_parallel_options_and_rejects_others():
    strategy = DDP(static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=10, timeout=60)
    assert strategy.ddp_kwargs == {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 10}
    assert strategy.timeout.total_seconds() == 60
    with pytest.raises(TypeError, match="unknown option.*find_unused_params.*find_unused_parameters"):
        DDP(find_unused_params=True)
    with pytest.raises(ValueError, match="process_group_backend='mpi'"):
        DDP(process_group_backend="mpi")
    with pytest.raises(ValueError, match="start_method"):
        DDP(start_method="fork")


def test_cuda_only_options_on_cpu_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="sync_batchnorm=True needs CUDA"):
        Trainer(strategy=DDP(sync_batchnorm=True), accelerator="cpu", devices=2)
    with pytest.raises(ValueError, match="process_group_backend='nccl' needs CUDA"):
        Trainer(strategy=DDP(process_group_backend="nccl"), accelerator="cpu", devices=2)


def test_sync_batchnorm_conversion_keeps_the_module_object_and_the_optimizer_parameters():
    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

    net = Net()
    params_before = [id(p) for p in net.parameters()]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    assert convert_sync_batchnorm(net) is net
    assert isinstance(net.bn, torch.nn.SyncBatchNorm) and isinstance(net.body[1], torch.nn.SyncBatchNorm)
    assert [id(p) for p in net.parameters()] == params_before
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == params_before
    with pytest.raises(TypeError, match="not a BatchNorm"):
        convert_sync_batchnorm(torch.nn.BatchNorm1d(3))


def test_ddp_world_of_one_trains_like_one_device_and_leaves_no_group(monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    trainer, ddp_model = fitted_params("ddp", devices=1)
    assert trainer.world_size == 1 and "backend=" in trainer.strategy.describe()
    # DDP shuffles the sequential training loader, as Lightning's DistributedSampler(shuffle=True, seed=0) does on
    # one process too: the one-device reference reads that order
    order = torch.utils.data.DistributedSampler(range(32), num_replicas=1, rank=0, shuffle=True, seed=0)
    _, single_model = fitted_params("single_device", sampler=order)
    for a, b in zip(ddp_model.parameters(), single_model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert not dist.is_initialized()
    assert "MASTER_PORT" not in __import__("os").environ


def test_self_launch_from_something_that_is_not_a_script_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    with pytest.raises(RuntimeError, match="not started from a script file.*ddp_spawn.*torchrun"):
        SubprocessLauncher(2).launch()


def test_num_nodes_without_a_launcher_is_a_clear_error():
    with pytest.raises(RuntimeError, match="num_nodes=2 needs a launcher on every machine"):
        SubprocessLauncher(2, num_nodes=2).launch()


# -- environment ------------------------------------------------------------------------------------------------------
def test_environment_from_torchrun_variables():
    env = detect_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                              "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"})
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (3, 4, 1, 2, 1)
    assert (env.main_address, env.main_port, env.launcher) == ("10.0.0.1", 29400, "torchrun")


def test_environment_from_slurm_variables():
    env = detect_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "2",
                              "SLURM_NODEID": "1", "SLURM_NODELIST": "gpu[003-004]", "SLURM_JOB_ID": "1234",
                              "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0"})
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (5, 8, 1, 4, 1)
    assert env.main_address == "gpu003" and env.launcher == "slurm" and env.main_port == 10000 + 1234


def test_no_launcher_means_a_world_of_one():
    env = detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash"})
    assert (env.world_size, env.launcher) == (1, None)  # an interactive SLURM shell is not a launch


# -- DataParallel ---------------------------------------------------------------------------------------------------
def test_data_parallel_without_gpus_warns_and_runs_as_a_single_device():
    with pytest.warns(UserWarning, match="strategy='dp'.*running as a single device"):
        trainer, dp_model = fitted_params("dp")
    assert trainer.strategy.parallel_ids == [] and trainer.strategy.root_device.type == "cpu"
    assert "as a single device" in trainer.strategy.describe()
    _, single_model = fitted_params("single_device")
    for a, b in zip(dp_model.parameters(), single_model.parameters()):
        assert torch.equal(a, b)
    assert set(trainer.callback_metrics) >= {"train_loss_epoch", "val_loss"}


def test_data_parallel_step_plumbing(monkeypatch):
    """The multi-GPU code path (named steps through the wrapper, loss averaging, logging from threads) on CPU,
    where torch's DataParallel passes calls straight through: the split itself needs GPUs (scripts/gpu_check.py)."""

    def pretend_two_gpus(self):
        self.parallel_ids, self._root_device = [0, 1], torch.device("cpu")

    monkeypatch.setattr(DataParallel, "setup_environment", pretend_two_gpus)
    averaged = []
    mean_loss = data_parallel._mean_loss
    monkeypatch.setattr(data_parallel, "_mean_loss", lambda out: averaged.append(out.shape) or mean_loss(out))
    trainer, dp_model = fitted_params("dp")
    assert averaged == [(1,)] * 8  # 2 epochs x 4 batches, each loss through the wrapper as one "replica" value
    assert trainer.strategy.model is None  # the wrapper is released at teardown
    _, single_model = fitted_params("single_device")
    for a, b in zip(dp_model.parameters(), single_model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert trainer.callback_metrics["train_loss_epoch"] > 0 and "val_loss" in trainer.callback_metrics
    predictions = trainer.predict(dp_model, loaders()[1])
    assert torch.cat(predictions).shape == (32,)


def test_data_parallel_reduces_per_replica_losses_by_their_mean():
    assert data_parallel._mean_loss(torch.tensor([1.0, 3.0])) == 2.0
    out = data_parallel._mean_loss({"loss": torch.tensor([1.0, 2.0]), "extra": torch.tensor([5.0, 6.0])})
    assert out["loss"] == 1.5 and out["extra"].tolist() == [5.0, 6.0]
    assert data_parallel._unsqueeze_scalars({"a": torch.tensor(1.0), "b": [torch.ones(2)]})["a"].shape == (1,)


def test_ddp_spawn_with_an_unpicklable_module_is_a_clear_error():
    model = Regression()
    model.transform = lambda x: x  # a lambda cannot be pickled
    trainer = Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, max_steps=1, **QUIET)
    with pytest.raises(TypeError, match="ddp_spawn.*pickling.*strategy='ddp'"):
        trainer.fit(model, loaders()[0])


def test_num_nodes_defaults_to_what_the_launcher_formed(monkeypatch):
    from tasktrain import Trainer

    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                       "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999",
                       "TORCHELASTIC_RUN_ID": "x"}.items():  # (torchrun's variables)
        monkeypatch.setenv(key, value)
    trainer = Trainer(strategy="ddp", accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False)
    assert (trainer.devices, trainer.num_nodes) == (2, 2)
    explicit = Trainer(strategy="ddp", accelerator="cpu", num_nodes=1, logger=False, enable_progress_bar=False,
                       enable_checkpointing=False)
    assert explicit.num_nodes == 1  # what the user asked stays, and setup_environment will say it differs
