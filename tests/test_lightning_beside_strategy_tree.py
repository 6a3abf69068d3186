"""Lightning's strategy and precision class tree beside tasktrain's (issue 37): a Lightning script's isinstance checks
answer the same. Lightning has ParallelStrategy(Strategy) with DDPStrategy, FSDPStrategy and ModelParallelStrategy
deriving from it and DeepSpeedStrategy(DDPStrategy); tasktrain's multi-process engines derive from its
ParallelStrategy (strategies/parallel.py), and each Lightning-named class counts the tasktrain strategy it stands
for as its own, so that the strategy a name builds (Trainer(strategy="deepspeed") is tasktrain's DeepSpeed) answers
as Lightning's object of that name does. Lightning is a test dependency, imported inside the tests only."""
import inspect
import warnings

import pytest
import torch

pytest.importorskip("lightning.pytorch")

CLASSES = ["Strategy", "SingleDeviceStrategy", "ParallelStrategy", "DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy",
           "ModelParallelStrategy"]
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _classes(package):
    return {name: getattr(package, name) for name in CLASSES}


def _theirs():
    import lightning.pytorch.strategies as theirs

    return _classes(theirs)


def _ours():
    import tasktrain.strategies as ours

    return _classes(ours)


def _answers(strategy, classes):
    return {name: isinstance(strategy, cls) for name, cls in classes.items()}


def test_the_class_tree_is_lightnings():
    theirs, ours = _theirs(), _ours()
    for name, cls in ours.items():  # (the full path of each is Lightning's, renamed)
        assert cls.__name__ == name
    relations = {(a, b): issubclass(theirs[a], theirs[b]) for a in CLASSES for b in CLASSES}
    assert {(a, b): issubclass(ours[a], ours[b]) for a in CLASSES for b in CLASSES} == relations
    assert relations[("DeepSpeedStrategy", "DDPStrategy")] and relations[("DDPStrategy", "ParallelStrategy")]
    assert not relations[("ModelParallelStrategy", "FSDPStrategy")]
    assert inspect.isabstract(ours["ParallelStrategy"]) == inspect.isabstract(theirs["ParallelStrategy"]) is True
    from tasktrain.strategies import parallel

    assert parallel.ParallelStrategy is ours["ParallelStrategy"]  # (lightning.pytorch.strategies.parallel, renamed)


def _registered_names():
    """Lightning's registered strategy names tasktrain runs (the XLA, fork and notebook ones it refuses by name)."""
    from lightning.pytorch.strategies import StrategyRegistry

    from tasktrain.names import STRATEGIES
    from tasktrain.strategies.registry import LIGHTNING_NAMES

    return [name for name in StrategyRegistry.available_strategies() if name in STRATEGIES or name in LIGHTNING_NAMES]


def test_the_strategy_each_name_builds_answers_isinstance_as_lightnings():
    """For every strategy name both run, what tasktrain builds for it (the Trainer's registry) against what
    Lightning's registry builds, over every class of Lightning's tree."""
    from lightning.pytorch.strategies import StrategyRegistry

    from tasktrain.strategies.registry import strategy_from_name

    names = _registered_names()
    assert {"ddp", "ddp_spawn", "deepspeed", "deepspeed_stage_3_offload", "fsdp", "fsdp_cpu_offload",
            "single_device"} <= set(names)
    theirs, ours = _theirs(), _ours()
    for name in names:
        extra = {"nvme_path": "/tmp"} if name.endswith("_nvme") else {}  # (tasktrain asks for the folder with the name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            their_strategy = StrategyRegistry.get(name)
        assert _answers(strategy_from_name(name, **extra), ours) == _answers(their_strategy, theirs), name


def test_the_trainers_strategy_answers_isinstance_as_lightnings():
    """Trainer(strategy=name) on two CPU processes (Lightning's FSDP needs a GPU: its registry's object stands in),
    and a Trainer of one process, whose strategy is a SingleDeviceStrategy under both."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import StrategyRegistry

    import tasktrain

    theirs, ours = _theirs(), _ours()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("ddp", "ddp_spawn", "deepspeed", "deepspeed_stage_3", "fsdp"):
            mine = tasktrain.Trainer(strategy=name, accelerator="cpu", devices=2, **QUIET).strategy
            lightnings = StrategyRegistry.get(name) if name == "fsdp" else \
                pl.Trainer(strategy=name, accelerator="cpu", devices=2, **QUIET).strategy
            assert _answers(mine, ours) == _answers(lightnings, theirs), name
        mine, lightnings = tasktrain.Trainer(accelerator="cpu", **QUIET).strategy, pl.Trainer(accelerator="cpu",
                                                                                             **QUIET).strategy
    assert _answers(mine, ours) == _answers(lightnings, theirs) == {**dict.fromkeys(CLASSES, False), "Strategy": True,
                                                                    "SingleDeviceStrategy": True}


def test_constructed_strategies_answer_isinstance_as_lightnings():
    """Each Lightning-named class built with its defaults (ModelParallelStrategy is no FSDPStrategy, DeepSpeedStrategy
    a DDPStrategy), and tasktrain's own classes keep their answers: DeepSpeed is no DDP, ModelParallelStrategy an
    FSDP, DataParallel (one process, several GPUs: not in Lightning 2.6) neither parallel nor single-device."""
    from tasktrain import DDP, FSDP, DataParallel, DeepSpeed

    theirs, ours = _theirs(), _ours()
    for name in ("SingleDeviceStrategy", "DDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy"):
        assert _answers(ours[name](), ours) == _answers(theirs[name](), theirs), name
    # (Lightning's FSDPStrategy() needs no GPU to be built)
    assert _answers(ours["FSDPStrategy"](), ours) == _answers(theirs["FSDPStrategy"](), theirs)
    assert not isinstance(DeepSpeed(), DDP) and not issubclass(ours["DeepSpeedStrategy"], DDP)
    assert isinstance(ours["ModelParallelStrategy"](), FSDP) and isinstance(DDP(), ours["DDPStrategy"])
    assert not isinstance(DataParallel(), (ours["ParallelStrategy"], ours["SingleDeviceStrategy"]))
    assert isinstance(FSDP(), ours["FSDPStrategy"]) and isinstance(DeepSpeed(), ours["DeepSpeedStrategy"])

    class Mine(ours["DDPStrategy"]):  # a subclass of one's own: Python's rules
        pass

    assert isinstance(Mine(), ours["ParallelStrategy"]) and not isinstance(DDP(), Mine)


def _world(strategy, root=True):
    # (Lightning's root_device is parallel_devices[local_rank]: a TypeError before they are known)
    return (strategy.parallel_devices, strategy.num_processes, strategy.distributed_sampler_kwargs,
            strategy.root_device if root else None, strategy.is_global_zero, strategy.global_rank, strategy.world_size)


def test_the_parallel_strategys_view_of_the_world_is_lightnings():
    """ParallelStrategy's properties beside Lightning's: built alone (nothing known yet), with parallel_devices
    given, and once a Trainer chose the devices (two CPU processes; tasktrain's FSDP, which Lightning runs on GPUs
    only, reads the same)."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP

    import tasktrain
    from tasktrain.strategies import DDPStrategy, FSDPStrategy

    alone = [(world[:3], world[4:]) for world in (_world(DDPStrategy(), root=False), _world(TheirDDP(), root=False))]
    assert alone[0] == alone[1] == ((None, 0, {"num_replicas": 0, "rank": 0}), (True, 0, 1))
    given = [torch.device("cpu")] * 3
    assert _world(DDPStrategy(parallel_devices=given))[:3] == _world(TheirDDP(parallel_devices=given))[:3] == (
        given, 3, {"num_replicas": 3, "rank": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lightnings = _world(pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, **QUIET).strategy)
        for strategy in ("ddp", "deepspeed", "fsdp", FSDPStrategy()):
            mine = tasktrain.Trainer(strategy=strategy, accelerator="cpu", devices=2, **QUIET).strategy
            assert _world(mine) == lightnings == ([torch.device("cpu")] * 2, 2, {"num_replicas": 2, "rank": 0},
                                                  torch.device("cpu"), True, 0, 2), strategy
    assert not hasattr(tasktrain.Trainer(accelerator="cpu", **QUIET).strategy, "parallel_devices")  # (Lightning's)


def test_block_backward_sync_holds_back_ddps_all_reduce(tmp_path):
    """Lightning's strategy.block_backward_sync(): inside it the DistributedDataParallel wrapper skips its gradient
    all-reduce (its no_sync); outside, and where the model is no such wrapper, nothing changes. (A world of one:
    the wrapper is torch's all the same.)"""
    import tasktrain
    from tasktrain.demos.boring_classes import BoringModel

    seen = []

    class Look(tasktrain.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            model = trainer.strategy.model
            with trainer.strategy.block_backward_sync():
                seen.append((type(model).__name__, model.require_backward_grad_sync))
            seen.append(model.require_backward_grad_sync)

    trainer = tasktrain.Trainer(strategy="ddp", accelerator="cpu", devices=1, max_steps=1, callbacks=[Look()],
                                default_root_dir=tmp_path, **QUIET)
    trainer.fit(BoringModel())
    assert seen == [("DistributedDataParallel", False), True]
    with trainer.strategy.block_backward_sync():  # (after the run: no wrapper)
        pass


def test_engine_precision_plugins_are_precisions_as_lightnings():
    """DeepSpeedPrecision and FSDPPrecision are Lightning's Precision (and this module's, renamed), with its hooks."""
    import lightning.pytorch.plugins as their_plugins

    import tasktrain.plugins as our_plugins

    for plugins in (their_plugins, our_plugins):
        for plugin in (plugins.DeepSpeedPrecision("bf16-mixed"), plugins.FSDPPrecision("bf16-true")):
            assert isinstance(plugin, plugins.Precision), type(plugin)
            assert plugin.unscale_gradients(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)) is None
            assert plugin.convert_output(3) == 3
