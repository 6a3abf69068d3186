"""What a Lightning script does with trainer.strategy itself (issue 37), beside Lightning 2.6.6: batch_to_device runs
the module's transfer hooks (and the Trainer moves every batch through it), all_gather on one device, the
StrategyRegistry a strategy of one's own is registered in, and the step methods called with Lightning's arguments."""
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

LIBS = {"ours": tasktrain, "theirs": pl}
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _strategies(lib):
    return __import__(f"{lib.__name__}.strategies" if lib is tasktrain else "lightning.pytorch.strategies",
                      fromlist=["x"])


def _module(lib, record=None):
    """A module of `lib` whose transfer hooks say, in `record`, what they were called with."""

    class Module(lib.LightningModule if lib is pl else lib.TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def test_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum() * 2

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            if record is not None:
                record.append(("before", dataloader_idx))
            return batch

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            if record is not None:
                record.append(("transfer", device.type, dataloader_idx))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            if record is not None:
                record.append(("after", dataloader_idx))
            return [batch[0] + 1]  # (seen in what the caller gets back)

    return Module()


def _loader(n=4):
    return DataLoader(TensorDataset(torch.ones(n, 2)), batch_size=2)


def _fit(lib, module, strategy="auto", **kwargs):
    trainer = lib.Trainer(accelerator="cpu", devices=1, strategy=strategy, **{**QUIET, **kwargs})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, _loader(), _loader())
    return trainer


def _run(lib):
    record = []
    trainer = _fit(lib, _module(lib, record), max_steps=2, limit_val_batches=1, num_sanity_val_steps=0)
    during = list(record)
    record.clear()
    moved = trainer.strategy.batch_to_device([torch.zeros(2)], torch.device("cpu"), 3)  # Lightning's positions
    by_keyword = trainer.strategy.batch_to_device(batch=[torch.zeros(2)], dataloader_idx=1)
    return during, list(record), moved[0].tolist(), by_keyword[0].tolist()


def test_batch_to_device_runs_the_modules_transfer_hooks_as_lightnings():
    """strategy.batch_to_device(batch, device, dataloader_idx) runs transfer_batch_to_device and
    on_after_batch_transfer (not on_before_batch_transfer, which Lightning's loops call before it), and the Trainer's
    own moves run each hook once per batch, in Lightning's order."""
    ours, theirs = _run(tasktrain), _run(pl)
    assert ours == theirs
    during, called, moved, by_keyword = ours
    batch = [("before", 0), ("transfer", "cpu", 0), ("after", 0)]
    assert during == batch * 3  # two training batches, one validation batch
    assert called == [("transfer", "cpu", 3), ("after", 3), ("transfer", "cpu", 1), ("after", 1)]
    assert moved == by_keyword == [1.0, 1.0]


def test_an_on_after_batch_transfer_alone_gets_each_loaders_index_as_lightnings():
    """A module that overrides on_after_batch_transfer alone gets the index of each validation loader (the Trainer
    passes it to strategy.batch_to_device), as under Lightning."""
    seen = {}
    for name, lib in LIBS.items():
        indices = seen[name] = []

        class After(lib.LightningModule if lib is pl else lib.TaskModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                return self.layer(batch[0]).sum()

            def on_after_batch_transfer(self, batch, dataloader_idx):
                indices.append(dataloader_idx)
                return batch

        trainer = lib.Trainer(accelerator="cpu", devices=1, limit_val_batches=1, **QUIET)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.validate(After(), [_loader(), _loader()], verbose=False)
    assert seen["ours"] == seen["theirs"] == [0, 1]


def test_the_trainer_moves_batches_through_a_strategys_own_batch_to_device():
    """A strategy of one's own that overrides batch_to_device (Lightning's way) is called for every batch the
    Trainer moves (training, validation), with the dataloader's index, as Lightning's loops call it."""
    seen = {}
    for name, lib in LIBS.items():
        calls = seen[name] = []

        class Counting(_strategies(lib).SingleDeviceStrategy):
            def batch_to_device(self, batch, device=None, dataloader_idx=0):
                calls.append(dataloader_idx)
                return super().batch_to_device(batch, device, dataloader_idx)

        _fit(lib, _module(lib), strategy=Counting("cpu"), max_steps=2, limit_val_batches=1, num_sanity_val_steps=0)
    assert seen["ours"] == seen["theirs"] == [0, 0, 0]


def test_the_trainer_runs_the_steps_through_a_strategys_own_step_methods():
    """A strategy of one's own that overrides training_step / validation_step / test_step / predict_step (Lightning's
    way, *args and **kwargs) is called for every step the Trainer runs, with the loop's arguments."""
    seen = {}
    for name, lib in LIBS.items():
        calls = seen[name] = []

        class Counting(_strategies(lib).SingleDeviceStrategy):
            def training_step(self, *args, **kwargs):
                calls.append(("training_step", len(args), sorted(kwargs)))
                return super().training_step(*args, **kwargs)

            def validation_step(self, *args, **kwargs):
                calls.append(("validation_step", len(args), sorted(kwargs)))
                return super().validation_step(*args, **kwargs)

            def test_step(self, *args, **kwargs):
                calls.append(("test_step", len(args), sorted(kwargs)))
                return super().test_step(*args, **kwargs)

            def predict_step(self, *args, **kwargs):
                calls.append(("predict_step", len(args), sorted(kwargs)))
                return super().predict_step(*args, **kwargs)

        module = _module(lib)
        trainer = _fit(lib, module, strategy=Counting("cpu"), max_steps=2, limit_val_batches=1,
                       num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.test(module, _loader(2), verbose=False)
            predictions = trainer.predict(module, _loader(2))
        calls.append(tuple(predictions[0].shape))
    assert seen["ours"] == seen["theirs"] == [
        ("training_step", 2, []), ("training_step", 2, []), ("validation_step", 2, []), ("test_step", 2, []),
        ("predict_step", 2, []), (2, 1)]


def test_batch_to_device_takes_a_datamodules_hook_as_lightnings():
    """Beside a DataModule that overrides on_after_batch_transfer, strategy.batch_to_device runs the DataModule's
    (Lightning's data hook selection), not the module's."""
    results = {}
    for name, lib in LIBS.items():
        class Data(lib.LightningDataModule if lib is pl else lib.DataModule):
            def train_dataloader(self):
                return _loader()

            def on_after_batch_transfer(self, batch, dataloader_idx):
                return [batch[0] * 10]

        trainer = lib.Trainer(accelerator="cpu", devices=1, max_steps=1, **QUIET)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_module(lib), datamodule=Data())
            results[name] = trainer.strategy.batch_to_device([torch.ones(1)])[0].tolist()
    assert results["ours"] == results["theirs"] == [10.0]


def _gathered(lib):
    trainer = _fit(lib, _module(lib), max_steps=1, limit_val_batches=0)
    strategy, module = trainer.strategy, trainer.lightning_module
    mine = torch.ones(2, requires_grad=True)
    gathered = strategy.all_gather(mine, sync_grads=True)
    (gathered * 3).sum().backward()
    shapes = [tuple(gathered.shape), tuple(strategy.all_gather(torch.ones(2, 3)).shape),
              tuple(module.all_gather(torch.ones(2)).shape), tuple(module.all_gather(7).shape)]
    nested = module.all_gather({"a": torch.ones(3), "b": [torch.zeros(1)]})
    return shapes, mine.grad.tolist(), {"a": tuple(nested["a"].shape), "b": tuple(nested["b"][0].shape)}


def test_all_gather_on_one_device_returns_the_tensor_as_lightnings():
    """SingleDeviceStrategy.all_gather returns the tensor as it is (no new dimension), and so does the module's
    all_gather on one device (numbers become tensors), the gradient kept."""
    assert _gathered(tasktrain) == _gathered(pl) == (
        [(2,), (2, 3), (2,), ()], [3.0, 3.0], {"a": (3,), "b": (1,)})


def test_strategy_registry_holds_lightnings_names():
    """StrategyRegistry holds Lightning's names that tasktrain runs (those it refuses by name, fork / notebook /
    XLA, left out), plus tasktrain's own "dp" and "model_parallel"; an entry says what Lightning's says."""
    from lightning.pytorch.strategies import StrategyRegistry as Theirs

    from tasktrain.strategies import StrategyRegistry as Ours
    from tasktrain.strategies.registry import LIGHTNING_REFUSED

    assert set(Theirs) - set(Ours) <= set(LIGHTNING_REFUSED)
    assert set(Ours) - set(Theirs) <= {"dp", "model_parallel"}
    for name in ("ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "deepspeed_stage_2_offload", "fsdp",
                 "fsdp_cpu_offload", "single_device"):
        assert set(Ours[name]) == set(Theirs[name]) == {"description", "init_params", "strategy", "strategy_name"}
        assert Ours[name]["strategy_name"] == name
    assert Ours["deepspeed_stage_3_offload"]["init_params"] == Theirs["deepspeed_stage_3_offload"]["init_params"] == {
        "stage": 3, "offload_optimizer": True, "offload_parameters": True}
    assert Ours["ddp_spawn"]["init_params"]["start_method"] == Theirs["ddp_spawn"]["init_params"]["start_method"]
    assert Ours.available_strategies() == list(Ours) and str(Ours).startswith("Registered Strategies: ")
    for registry in (Ours, Theirs):
        with pytest.raises(ValueError, match="'ddp' is already present in the registry. HINT: Use `override=True`."):
            registry.register("ddp", object)
        with pytest.raises(KeyError, match="'no_such' not found in registry. Available names: "):
            registry.get("no_such")
        with pytest.raises(TypeError, match="`name` must be a str"):
            registry.register(3, object)
    assert isinstance(Ours.get("ddp_find_unused_parameters_true"), tasktrain.DDP)
    assert Ours.get("ddp_find_unused_parameters_true").ddp_kwargs == {"find_unused_parameters": True}


@pytest.mark.parametrize("how", ["classmethod", "register", "decorator"])
def test_a_strategy_registered_lightnings_way_is_chosen_by_name(how):
    """A strategy class of one's own, registered Lightning's way (its register_strategies classmethod called with
    StrategyRegistry, StrategyRegistry.register(name, cls, **init_params), or as a decorator), is what
    Trainer(strategy=name) builds, with its init_params, and it trains; remove() takes it out again."""
    built = {}
    for name, lib in LIBS.items():
        strategies = _strategies(lib)
        registry = strategies.StrategyRegistry

        class Mine(strategies.SingleDeviceStrategy):
            def __init__(self, device="cpu", tag=None):
                super().__init__(device)
                self.tag = tag

            @classmethod
            def register_strategies(cls, strategy_registry):
                strategy_registry.register("mine_by_name", cls, description="one of my own", tag="given")

        if how == "classmethod":
            Mine.register_strategies(registry)
        elif how == "register":
            registry.register("mine_by_name", Mine, description="one of my own", tag="given")
        else:
            registry.register("mine_by_name", description="one of my own", tag="given")(Mine)
        try:
            assert registry["mine_by_name"]["description"] == "one of my own"
            trainer = _fit(lib, _module(lib), strategy="mine_by_name", max_steps=2, limit_val_batches=0)
            built[name] = (type(trainer.strategy) is Mine, trainer.strategy.tag, trainer.global_step)
        finally:
            registry.remove("mine_by_name")
        assert "mine_by_name" not in registry
    assert built["ours"] == built["theirs"] == (True, "given", 2)


def test_lightnings_strategy_classes_register_their_names_as_lightnings():
    """Each strategy class's register_strategies(strategy_registry) fills a registry of one's own with its names, as
    Lightning's classes do (the names tasktrain refuses left out)."""
    from lightning.fabric.strategies.registry import _StrategyRegistry

    from tasktrain.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy
    from tasktrain.strategies.registry import LIGHTNING_REFUSED, _StrategyRegistry as OurRegistry

    theirs = __import__("lightning.pytorch.strategies", fromlist=["x"])
    registered = list(theirs.FSDPStrategy._registered_strategies)  # (Lightning's FSDP appends its names there)
    for ours in (SingleDeviceStrategy, DDPStrategy, DeepSpeedStrategy, FSDPStrategy):
        mine, lightnings = OurRegistry(), _StrategyRegistry()
        ours.register_strategies(mine)
        getattr(theirs, ours.__name__).register_strategies(lightnings)
        theirs.FSDPStrategy._registered_strategies[:] = registered
        assert set(mine) == set(lightnings) - set(LIGHTNING_REFUSED), ours
        assert all(entry["strategy"] is ours for entry in mine.values())
        for name in mine:
            assert mine[name]["description"] == lightnings[name]["description"], name
            if name != "deepspeed_stage_3_offload_nvme":  # (Lightning's remote_device="nvme": refused here)
                assert mine[name]["init_params"] == lightnings[name]["init_params"], name


def _step_calls(lib, strategy):
    torch.manual_seed(0)
    trainer = _fit(lib, _module(lib), strategy=strategy, max_steps=1, limit_val_batches=0)
    strategy, module = trainer.strategy, trainer.lightning_module
    optimizer = trainer.optimizers[0]
    batch = [torch.ones(2, 2)]
    module.train()
    losses = [float(strategy.training_step(batch, 0)), float(strategy.training_step(batch=batch, batch_idx=0))]
    with torch.no_grad():
        losses += [float(strategy.validation_step(batch, 0)), float(strategy.test_step(batch=batch, batch_idx=0)),
                   strategy.predict_step(batch, 0).sum().item()]
    optimizer.zero_grad()
    loss = strategy.training_step(batch, 0)
    returned = strategy.backward(loss, optimizer)  # (closure_loss, optimizer): the loss back
    grad = module.layer.weight.grad.clone()
    optimizer.zero_grad()
    strategy.backward(closure_loss=strategy.training_step(batch, 0), optimizer=None)

    def closure():
        optimizer.zero_grad()
        out = strategy.training_step(batch, 0)
        strategy.backward(out, optimizer)
        return out

    strategy.optimizer_step(optimizer, closure)  # (optimizer, closure, model=None, **kwargs)
    strategy.optimizer_step(optimizer=optimizer, closure=closure, model=module)
    return [*losses, float(returned), *grad.flatten().tolist(), *module.layer.weight.detach().flatten().tolist(),
            *module.layer.bias.detach().tolist()]


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_step_methods_take_lightnings_arguments(strategy):
    """backward(closure_loss, optimizer, *args, **kwargs) returns the loss; optimizer_step(optimizer, closure,
    model=None, **kwargs) steps through the closure; training_step / validation_step / test_step / predict_step
    (*args, **kwargs) run the module's step: by position and by keyword, with the values of Lightning's one device
    (tasktrain's DDP of one process too: its wrapper routes training_step)."""
    ours, theirs = _step_calls(tasktrain, strategy), _step_calls(pl, "auto")
    assert ours == pytest.approx(theirs)
    assert ours[0] == ours[1] == ours[2] and ours[3] == pytest.approx(2 * ours[0])


def test_the_world_group_is_every_rank_as_lightnings():
    """torch.distributed.group.WORLD (what Lightning's module.all_gather hands its strategy when given no group) is
    taken as every rank by all_gather and reduce, on the module and on the strategy: a one-process DDP gathers a new
    dimension of one, as Lightning's DDP does; one device returns the tensor as it is."""
    import torch.distributed as dist

    seen = {}

    class Gathers(tasktrain.TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            world = dist.group.WORLD
            strategy = self.trainer.strategy
            seen[strategy.name] = (
                tuple(self.all_gather(torch.ones(2), group=world).shape),
                tuple(strategy.all_gather(torch.ones(2), world).shape),
                float(strategy.reduce(torch.tensor(3.0), world, "sum")))
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for strategy in ("auto", "ddp"):
        _fit(tasktrain, Gathers(), strategy=strategy, max_steps=1, limit_val_batches=0)
    assert seen == {"single_device": ((2,), (2,), 3.0), "ddp": ((1, 2), (1, 2), 3.0)}
