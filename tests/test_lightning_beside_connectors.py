"""Lightning's internals that scripts and callbacks reach into (tasktrain/trainer/lightning_connectors.py, the
strategy's connect / launcher / tensor_init_context, module._current_fx_name) beside Lightning 2.6's: the same case
under both frameworks, the readings compared. Each case is one a script written for Lightning does (a
configure_optimizers that sizes its schedule from `trainer._data_connector._train_dataloader_source.dataloader()`, a
callback that restores a checkpoint's weights with `trainer._checkpoint_connector.restore(path)`, a DataModule that
reads `trainer._accelerator_connector.is_distributed`, ...)."""

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from helpers import FailsAtStep3, HandsOutLoaders, OursHandsOutLoaders, OursRecords, RecordsItsProcess  # noqa: E402
from helpers import NotesWhereException, NotesWhereFinalize, OursFailsAtStep3, OursNotesWhereException  # noqa: E402
from helpers import recording_environment  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours), "lightning": (pl, theirs)}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py: Lightning's level put back after each test)


def _both(case):
    return {name: case(*LIBS[name]) for name in LIBS}


# -- module._current_fx_name ----------------------------------------------------------------------------------------
MODULE_HOOKS = ("setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start",
                "on_train_epoch_start", "on_train_batch_start", "training_step", "on_before_backward",
                "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end",
                "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start", "validation_step",
                "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
                "on_train_end", "on_fit_end", "on_test_start", "test_step", "on_test_end", "on_predict_start",
                "predict_step", "on_predict_end", "teardown", "on_save_checkpoint", "train_dataloader",
                "val_dataloader", "test_dataloader", "predict_dataloader", "prepare_data")
CALLBACK_HOOKS = ("setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
                  "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
                  "on_train_batch_end", "on_validation_start", "on_validation_batch_end", "on_validation_end",
                  "on_train_epoch_end", "on_train_end", "on_fit_end", "on_test_start", "on_test_end",
                  "on_predict_start", "on_predict_end", "teardown", "on_save_checkpoint", "on_sanity_check_start",
                  "on_sanity_check_end")


def _fx_names(lib, boring):
    seen = []

    def recorder(owner, name, module_of):
        base = getattr(owner, name)

        def hook(*args, **kwargs):
            seen.append((type(owner).__name__[:1], name, module_of(args)._current_fx_name))
            return base(*args, **kwargs)
        return hook

    class Model(boring.BoringModel):
        pass

    class Seen(lib.Callback):
        pass

    model, callback = Model(), Seen()
    for name in MODULE_HOOKS:
        object.__setattr__(model, name, recorder(model, name, lambda args: model))
    for name in CALLBACK_HOOKS:
        setattr(callback, name, recorder(callback, name, lambda args: args[1]))
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, limit_test_batches=1,
                          limit_predict_batches=1, num_sanity_val_steps=1, callbacks=[callback], **QUIET)
    trainer.fit(model)
    trainer.save_checkpoint("fx.ckpt")
    trainer.test(model)
    trainer.predict(model)
    return seen, model._current_fx_name


def test_current_fx_name_names_each_hook_as_lightning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = _both(_fx_names)
    assert got["tasktrain"][1] is None  # outside a run
    assert got["tasktrain"] == got["lightning"]


def test_current_fx_name_set_outside_a_run_is_refused():
    module = ours.BoringModel()
    assert module._current_fx_name is None
    with pytest.raises(AttributeError, match="only be set during a Trainer run"):
        module._current_fx_name = "training_step"


# -- trainer._accelerator_connector ----------------------------------------------------------------------------------
CONFIGS = [{}, dict(precision="bf16-mixed"), dict(precision=16, accelerator="cpu"), dict(precision="64"),
           dict(strategy="ddp", devices=2, accelerator="cpu"), dict(strategy="ddp_spawn", devices=1),
           dict(strategy="ddp", devices=1, use_distributed_sampler=False), dict(num_nodes=1, devices=1)]


@pytest.mark.parametrize("config", CONFIGS, ids=[repr(c) for c in CONFIGS])
def test_accelerator_connector_reads_as_lightning(config, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)

    def case(lib, boring):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(**config, **QUIET)
        import importlib

        launchers = importlib.import_module(f"{lib.__name__}.strategies.launchers")
        connector = trainer._accelerator_connector
        strategy_flag = connector._strategy_flag
        launcher = trainer.strategy.launcher
        return dict(precision=connector._precision_flag, accelerator=connector._accelerator_flag,
                    strategy=strategy_flag if isinstance(strategy_flag, str) else "an object",
                    strategy_is_the_trainers=connector.strategy is trainer.strategy,
                    devices=connector._devices_flag, parallel_devices=connector._parallel_devices,
                    num_nodes=connector._num_nodes_flag, sampler=connector.use_distributed_sampler,
                    distributed=connector.is_distributed,
                    launcher=None if launcher is None else (
                        launcher.is_interactive_compatible,
                        isinstance(launcher, launchers._SubprocessScriptLauncher),
                        isinstance(launcher, launchers._MultiProcessingLauncher)))

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]


LAUNCHED_OUTSIDE = {
    "LOCAL_RANK only": dict(LOCAL_RANK="0"),
    "torchrun": dict(RANK="0", GROUP_RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", TORCHELASTIC_RUN_ID="x"),
    "a ClusterEnvironment that creates the processes": {},
}


@pytest.mark.parametrize("where", list(LAUNCHED_OUTSIDE))
def test_the_launcher_where_the_processes_were_started_outside_reads_as_lightning(where, monkeypatch):
    """Lightning's DDP strategy has a _SubprocessScriptLauncher there too, one that starts nothing."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_JOB_NAME",
                 "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in LAUNCHED_OUTSIDE[where].items():
        monkeypatch.setenv(name, value)

    def case(lib, boring):
        import importlib
        import warnings

        environments = importlib.import_module(f"{lib.__name__}.plugins.environments")
        outside = recording_environment(environments.ClusterEnvironment, main_port=29512, world=2)  # rank 0 of 2
        plugins = [outside] if not LAUNCHED_OUTSIDE[where] else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(strategy="ddp", devices=2, accelerator="cpu", plugins=plugins, **QUIET)
        launchers = importlib.import_module(f"{lib.__name__}.strategies.launchers")
        launcher = trainer.strategy.launcher
        return (isinstance(launcher, launchers._SubprocessScriptLauncher), launcher.is_interactive_compatible,
                launcher.num_processes, launcher.num_nodes, list(launcher.procs), trainer.strategy._launcher is launcher,
                launcher)

    got = _both(case)
    assert got["tasktrain"][:-1] == got["lightning"][:-1] == (True, False, 2, 1, [], True)
    with pytest.raises(NotImplementedError, match="notebook_launcher"):  # it starts nothing here
        got["tasktrain"][-1].launch()


class _TheirsRecords(RecordsItsProcess, theirs.BoringModel):  # (ours: helpers.py, which a child imports fast)
    pass


class _TheirsHandsOutLoaders(HandsOutLoaders, pl.LightningDataModule):
    pass


def test_ddp_spawn_on_one_device_trains_in_a_child_as_lightning(tmp_path, monkeypatch, capfd):
    """strategy="ddp_spawn", devices=1: Lightning's _MultiProcessingLauncher spawns one child, so its DataLoader check
    sees the "spawn" start method and asks for persistent_workers; the parent gets the weights, callback_metrics and
    trainer.state back. Where `srun` is installed but did not start the process, Lightning's hint comes once from the
    parent (the Trainer's construction) and once from the child (its run's start, where its checkpoint connector asks
    SLURM for a requeue checkpoint): a warning printed on the child's stderr. A second fit on that Trainer is refused
    with Lightning's NotImplementedError (Lightning-AI/pytorch-lightning#18775: the parent holds the weights only).
    The loaders come from a DataModule: Lightning's children attach it (its _fit_impl / _validate_impl run there),
    its parent never does, so after the fit and after a validate the parent's trainer.datamodule is None, the
    DataModule's trainer None and the trainer's loader views empty, as tasktrain's. One difference is kept, from that
    bug: Lightning's parent reads global_step and current_epoch 0 after the fit (its child sends only weights, state
    and callback_metrics back: Lightning-AI/pytorch-lightning#5332), and its module is not attached to the trainer
    (module.trainer raises); tasktrain's are the run's, its module attached. trainer.save_checkpoint in the parent
    after the fit writes the weights sent back and no optimizer state, as Lightning's."""
    import json
    import os
    import warnings

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    bin_dir = tmp_path / "bin"  # an `srun` on PATH (the children inherit it): a login node's
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hint = "The `srun` command is available on your system but is not used"

    def case(lib, boring):
        lib.seed_everything(0, verbose=False)
        module = (OursRecords if lib is tasktrain else _TheirsRecords)()
        module.record_path = str(tmp_path / f"{lib.__name__}.json")
        train = DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 32)), batch_size=2)
        # requested at the fit's start, never iterated (max_steps ends the fit before the epoch's validation): the
        # warning without the seconds a worker process costs
        val = DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 32)), batch_size=2, num_workers=1)
        data = (OursHandsOutLoaders if lib is tasktrain else _TheirsHandsOutLoaders)(train, val)
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainer = lib.Trainer(strategy="ddp_spawn", devices=1, accelerator="cpu", max_steps=2,
                                  num_sanity_val_steps=0, limit_val_batches=1, **QUIET)
            trainer.fit(module, datamodule=data)
        child_err = capfd.readouterr().err

        def parent_views():
            return dict(datamodule=trainer.datamodule, datamodule_trainer=data.trainer,
                        loaders=(trainer.train_dataloader, trainer.val_dataloaders),
                        module=trainer.lightning_module is module)
        with open(module.record_path) as f:
            record = json.load(f)
        got = dict(in_a_child=record["pid"] != os.getpid(), warnings=record["warnings"],
                   weight=module.layer.weight.detach().flatten().tolist(),
                   metrics=sorted(trainer.callback_metrics), loss=float(trainer.callback_metrics["train_loss"]),
                   state=(trainer.state.fn, trainer.state.status, trainer.state.stage),
                   srun_hints=(sum(hint in str(w.message) for w in seen), child_err.count(hint)),
                   progress=(trainer.global_step, trainer.current_epoch), after_fit=parent_views(),
                   attached=getattr(module, "_trainer", None) is trainer)
        trainer.save_checkpoint(tmp_path / f"{lib.__name__}.ckpt")  # (in the parent: its weights, no optimizer)
        saved = torch.load(tmp_path / f"{lib.__name__}.ckpt", weights_only=False)
        got["saved"] = (saved["optimizer_states"], saved["lr_schedulers"], torch.equal(
            saved["state_dict"]["layer.weight"], module.layer.weight))
        with pytest.raises(NotImplementedError) as refused:  # (refused before any process starts)
            trainer.fit(module, datamodule=data)
        got["second_fit"] = (str(refused.value), trainer.state.fn, trainer.state.status)
        trainer.validate(module, datamodule=data, verbose=False)
        got["after_validate"] = parent_views()
        got["validated"] = (sorted(trainer.callback_metrics), trainer.state.fn, trainer.state.status)
        return got

    got = _both(case)
    assert got["lightning"].pop("progress") == (0, 0)  # (Lightning's bug, kept apart: the docstring)
    assert got["tasktrain"].pop("progress") == (2, 1)
    assert got["lightning"].pop("attached") is False and got["tasktrain"].pop("attached") is True
    assert got["tasktrain"]["after_fit"] == dict(datamodule=None, datamodule_trainer=None, loaders=(None, None),
                                                 module=True)
    assert got["tasktrain"]["after_validate"] == got["tasktrain"]["after_fit"]
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"]["in_a_child"]
    assert got["tasktrain"]["warnings"] == [
        "Consider setting `persistent_workers=True` in 'val_dataloader' to speed up the dataloader worker "
        "initialization."]
    assert got["tasktrain"]["srun_hints"] == (1, 1)
    assert got["tasktrain"]["second_fit"][0].startswith("Calling `trainer.fit()` twice on the same Trainer instance")


def test_accelerator_connector_is_read_only_and_names_what_it_lacks():
    trainer = tasktrain.Trainer(**QUIET)
    with pytest.raises(AttributeError, match="read only.*use_distributed_sampler="):
        trainer._accelerator_connector.use_distributed_sampler = False
    with pytest.raises(AttributeError, match="'_layer_sync' is not supported by tasktrain"):
        trainer._accelerator_connector._layer_sync
    with pytest.raises(AttributeError, match="cannot be replaced"):
        trainer._accelerator_connector = None
    with pytest.raises(NotImplementedError, match="notebook_launcher"):
        tasktrain.Trainer(strategy="ddp", devices=2, **QUIET).strategy.launcher.launch(print, trainer=trainer)
    ddp = tasktrain.Trainer(strategy="ddp", devices=2, **QUIET).strategy
    assert ddp._launcher is ddp.launcher and trainer.strategy._launcher is None  # (Lightning's private name)
    with pytest.raises(AttributeError, match="strategy._launcher cannot be replaced"):  # a mock would never be called
        trainer.strategy._launcher = object()


# -- the loops' _data_source (Lightning 2's place of the 1.x data connector's sources) -------------------------------
def _sources(lib, boring):
    """The sources read from configure_optimizers (the schedule-sizing pattern: len(fit_loop._data_source.dataloader()))
    and from a validate run's hook, with loaders given, a DataModule, and the module's own hooks."""
    seen = []

    def read(trainer, where):
        loops = {"train": trainer.fit_loop, "val": trainer.fit_loop.epoch_loop.val_loop, "validate": trainer.validate_loop,
                 "test": trainer.test_loop, "predict": trainer.predict_loop}
        for kind, loop in loops.items():
            source = loop._data_source
            defined = source.is_defined()
            # (the test / predict loaders of BoringDataModule need its setup for those stages: not called)
            loader = source.dataloader() if defined and kind in ("train", "val", "validate") else None
            seen.append((where, kind, source.name, source.is_module(), defined, type(source.instance).__name__[:4],
                         len(loader) if isinstance(loader, DataLoader) else type(loader).__name__))

    class Model(boring.BoringModel):
        def configure_optimizers(self):
            read(self.trainer, "configure_optimizers")
            return super().configure_optimizers()

        def on_validation_start(self):
            read(self.trainer, f"validation {self.trainer.state.fn}")

    class Data(boring.BoringDataModule):
        pass

    fresh = lib.Trainer(**QUIET)
    seen.append(("fresh", fresh.fit_loop._data_source.instance, fresh.fit_loop._data_source.name,
                 fresh.fit_loop._data_source.is_defined()))
    for given in ("loaders", "datamodule", "module"):
        trainer = lib.Trainer(max_steps=1, limit_val_batches=1, num_sanity_val_steps=0, **QUIET)
        model = Model()
        if given == "loaders":
            trainer.fit(model, DataLoader(boring.RandomDataset(32, 12), batch_size=4),
                        DataLoader(boring.RandomDataset(32, 6), batch_size=2))
            trainer.validate(model, DataLoader(boring.RandomDataset(32, 4), batch_size=2))
        elif given == "datamodule":
            trainer.fit(model, datamodule=Data())
        else:
            trainer.fit(model)
            trainer.validate(model)
        read(trainer, f"after {given}")
    return seen


def test_loop_data_sources_as_lightning():
    got = _both(_sources)
    assert got["tasktrain"] == got["lightning"]


def test_data_sources_are_read_only_and_the_data_connector_names_what_it_lacks():
    trainer = tasktrain.Trainer(**QUIET)
    with pytest.raises(AttributeError, match="cannot be set in tasktrain"):
        trainer.fit_loop._data_source.instance = DataLoader(ours.RandomDataset(32, 4))
    with pytest.raises(RuntimeError, match="No train loaders are attached yet"):
        trainer.fit_loop._data_source.dataloader()
    with pytest.raises(AttributeError, match="'_prepare_dataloader' is not supported by tasktrain.*fit_loop._data_source"):
        trainer._data_connector._prepare_dataloader(DataLoader(ours.RandomDataset(32, 4)), shuffle=True, mode="fit")
    with pytest.raises(AttributeError, match="'_train_dataloader_source' is not supported"):  # (Lightning 1.x's)
        trainer._data_connector._train_dataloader_source


def _set_up_data(lib, boring):
    """Lightning's tests' pattern (test_limit_batches, test_overfit_batches, test_data_connector): connect a module,
    attach loaders or a DataModule, set up one loop's data with its view's setup_data(), read the Trainer's counts,
    loaders and samplers; under a distributed strategy of 2 devices before its launch, and with the errors of a
    fraction too small."""
    import warnings

    from lightning.fabric.utilities.exceptions import MisconfigurationException as TheirMisconfiguration
    from torch.utils.data import DistributedSampler, RandomSampler

    from tasktrain.exceptions import MisconfigurationException as OurMisconfiguration

    seen = []

    def loaders(n=64, **kwargs):
        return DataLoader(boring.RandomDataset(32, n), batch_size=2, **kwargs)

    def sampler_of(loader):
        sampler = loader.sampler
        return type(sampler).__name__ if not isinstance(sampler, DistributedSampler) else f"Dist({sampler.shuffle})"

    def shuffles(loader):  # (on one process tasktrain draws Lightning's RandomSampler order through a sampler of its
        # own, docs/lightning.md "A shuffling training loader's order on one process": whether it shuffles is compared)
        return getattr(loader.sampler, "shuffle", isinstance(loader.sampler, RandomSampler))

    def trainer_for(model, **flags):
        trainer = lib.Trainer(**QUIET, **flags)
        model.trainer = trainer
        trainer.strategy.connect(model)
        return trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # loaders given, limits: each loop's counts, as the loop sets them up (the validate loop's: read in validate)
        for limits in (dict(limit_train_batches=5, limit_val_batches=0.25, limit_test_batches=3,
                            limit_predict_batches=0.5), dict(overfit_batches=4), dict(overfit_batches=0.1)):
            model = boring.BoringModel()
            trainer = trainer_for(model, **limits)
            trainer._data_connector.attach_dataloaders(model, loaders(shuffle=True), loaders(48, shuffle=True),
                                                       [loaders(20), loaders(10)], loaders(30))
            before = (trainer.train_dataloader, trainer.val_dataloaders, trainer.test_dataloaders)
            trainer.fit_loop.setup_data()
            trainer.fit_loop.epoch_loop.val_loop.setup_data()
            overfit = "overfit_batches" in limits  # (then the same first batch at each pass, in order)
            first = next(iter(trainer.train_dataloader))
            fit_counts = (trainer.num_training_batches, trainer.num_val_batches, trainer.val_check_batch,
                          shuffles(trainer.train_dataloader), sampler_of(trainer.val_dataloaders),
                          overfit and torch.equal(first, next(iter(trainer.train_dataloader))))
            trainer.validate_loop.setup_data()
            trainer.test_loop.setup_data()
            trainer.predict_loop.setup_data()
            trainer.state.fn = "validate"
            seen.append((limits, before, fit_counts, trainer.num_val_batches, trainer.num_test_batches,
                         trainer.num_predict_batches, len(trainer.test_dataloaders),
                         len(trainer.predict_dataloaders), trainer.fit_loop.max_batches,
                         trainer.validate_loop.max_batches))
        # a DataModule attached, the loops' sources and loaders from its hooks; a second setup_data is a no-op
        model, data = boring.BoringModel(), boring.BoringDataModule()
        trainer = trainer_for(model, limit_train_batches=0.5)
        trainer._data_connector.attach_datamodule(model, datamodule=data)
        data.setup("fit")
        trainer.fit_loop.setup_data()
        loader = trainer.train_dataloader
        trainer.fit_loop.setup_data()
        seen.append((type(trainer.fit_loop._data_source.instance).__name__[-10:], trainer.num_training_batches,
                     trainer.train_dataloader is loader))
        # after a validate run, fit's validation loop sets up its own loaders (its counts, not the run's)
        model = boring.BoringModel()
        trainer = lib.Trainer(**QUIET, limit_val_batches=3)
        trainer.validate(model, loaders(20, shuffle=False), verbose=False)
        trainer.fit_loop.epoch_loop.val_loop._max_batches = [1]  # (the counts set up before, replaced below)
        trainer.fit_loop.epoch_loop.val_loop.setup_data()
        seen.append((trainer.fit_loop.epoch_loop.val_loop._max_batches, trainer.validate_loop.max_batches,
                     trainer.num_val_batches))
        # two devices of a distributed strategy, before its launch: rank 0's samplers
        for shuffle in (True, False):
            model = boring.BoringModel()
            model.val_dataloader = lambda shuffle=shuffle: loaders(shuffle=shuffle)
            trainer = trainer_for(model, accelerator="cpu", devices=2, strategy="ddp")
            trainer._data_connector.attach_data(model)
            trainer.fit_loop.setup_data()
            trainer.fit_loop.epoch_loop.val_loop.setup_data()
            seen.append((shuffle, sampler_of(trainer.train_dataloader), trainer.val_dataloaders.sampler.shuffle,
                         trainer.num_training_batches))
    # a fraction that leaves no batch: Lightning's error and words, from the loop's setup_data
    for loop, flags in (("fit_loop", dict(limit_train_batches=0.1)), ("validate_loop", dict(limit_val_batches=0.01))):
        model = boring.BoringModel()
        trainer = trainer_for(model, **flags)
        trainer._data_connector.attach_data(model, train_dataloaders=loaders(16))
        with pytest.raises((TheirMisconfiguration, OurMisconfiguration)) as error:
            getattr(trainer, loop).setup_data()
        seen.append(str(error.value))
    return seen


def test_attached_loaders_set_up_by_the_loop_views_as_lightning():
    """trainer._data_connector.attach_dataloaders / attach_data / attach_datamodule and each loop view's
    setup_data() (the Trainer's own set-up of that stage's loaders) read as Lightning's."""
    got = _both(_set_up_data)
    assert got["tasktrain"] == got["lightning"]
    limits, before, fit_counts, *_ = got["tasktrain"][0]
    assert before == (None, None, None) and fit_counts[:2] == (5, [6])  # (64 / 2 batches limited to 5; 24 * 0.25)
    assert fit_counts[3:] == (True, "RandomSampler", False)
    assert got["tasktrain"][1][2][3:] == (False, "SequentialSampler", True)  # (overfit: in order)
    assert got["tasktrain"][-4] == (True, "Dist(True)", True, 32) and got["tasktrain"][-3][2] is False
    assert "Please increase the `limit_train_batches`" in got["tasktrain"][-2]
    assert got["tasktrain"][-5] == ([3], [3], [3])  # (after validate: fit's validation loaders set up again)


def test_setup_data_needs_a_module():
    with pytest.raises(RuntimeError, match=r"trainer.test_loop.setup_data\(\): no module is attached"):
        tasktrain.Trainer(**QUIET).test_loop.setup_data()


def _evaluation_set_up_by_the_stage(lib, boring):
    """The validate and test loop views' setup_data() gated by the stage the Trainer is in (trainer.testing: the test
    limit and test_step, else the validation ones), whichever loop is asked: outside a run, the test loop with no
    validation_step or with limit_val_batches=0 sets nothing up; in the test stage the validate loop does, with
    limit_val_batches=0 or without a validation_step. What is set up is that loop's own (its loaders, its counts)."""
    import warnings

    class NoValidationStep(boring.BoringModel):
        validation_step = lib.LightningModule.validation_step if lib is pl else lib.TaskModule.validation_step

    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_class, limits, stage_testing, loop in (
                (NoValidationStep, {}, False, "test_loop"),
                (boring.BoringModel, dict(limit_val_batches=0), False, "test_loop"),
                (boring.BoringModel, dict(limit_val_batches=2), False, "test_loop"),
                (boring.BoringModel, dict(limit_val_batches=0, limit_test_batches=3), True, "validate_loop"),
                (NoValidationStep, dict(limit_test_batches=3), True, "validate_loop")):
            model = model_class()
            trainer = lib.Trainer(**QUIET, **limits)
            model.trainer = trainer
            trainer.strategy.connect(model)
            trainer._data_connector.attach_dataloaders(model, val_dataloaders=DataLoader(boring.RandomDataset(32, 8)),
                                                       test_dataloaders=DataLoader(boring.RandomDataset(32, 6)))
            trainer.testing = stage_testing
            getattr(trainer, loop).setup_data()
            set_up = trainer.test_dataloaders if loop == "test_loop" else trainer.val_dataloaders
            seen.append((loop, set_up is not None, getattr(trainer, loop).max_batches))
    # the stage flags can be set, as Lightning's: True sets the stage, False ends it only where it is that stage
    stages = ("training", "sanity_checking", "validating", "testing", "predicting")
    for name in stages:
        setattr(trainer, name, True)
        trainer.testing = False
        seen.append((name, [getattr(trainer, flag) for flag in stages], trainer.evaluating))
    return seen


def test_evaluation_loop_setup_data_is_gated_by_the_trainers_stage_as_lightning():
    got = _both(_evaluation_set_up_by_the_stage)
    assert got["tasktrain"] == got["lightning"]
    assert [set_up for _, set_up, _ in got["tasktrain"][:5]] == [False, False, True, True, True]
    # each loop counts with its own limit: the validate loop's limit_val_batches=0 gives 0 batches
    assert [counts for *_, counts in got["tasktrain"][2:5]] == [[6], [0], [8]]
    assert got["tasktrain"][8] == ("testing", [False] * 5, False)


def _prepared_on(lib, boring):
    """prepare_data_per_node=False (the module's and a DataModule's, set in __init__ as Lightning's docs set it) on a
    rank of a cluster that numbers its ranks itself (its set_global_rank does nothing, as SLURM's and torchrun's
    environments): global rank 0 on local rank 0 of node 1, then global rank 1 on local rank 0 of node 0; True (the
    default) on local rank 0 of node 1; and False as a class attribute, which the instance's True from the base's
    __init__ shadows. Read through trainer._data_connector.prepare_data(), as a run calls it (no process group: no
    barrier)."""
    import importlib
    import warnings

    environments = importlib.import_module(f"{lib.__name__}.plugins.environments")
    seen = []
    for rank, local, node, per_node, in_init in ((0, 0, 1, False, True), (1, 0, 0, False, True),
                                                 (0, 0, 1, True, True), (0, 0, 1, False, False)):
        called = []

        def flagged(base, owner, per_node=per_node, in_init=in_init):
            class Flagged(base):
                prepare_data_per_node = per_node

                def __init__(self):
                    super().__init__()
                    if in_init:
                        self.prepare_data_per_node = per_node

                def prepare_data(self):
                    called.append(owner)

            return Flagged

        Model, Data = flagged(boring.BoringModel, "module"), flagged(boring.BoringDataModule, "datamodule")

        environment = recording_environment(environments.ClusterEnvironment, local_rank=local, node_rank=node,
                                            rank=rank, world=2)
        environment.set_global_rank = lambda rank: None  # (the cluster's own ranks stand)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(strategy="ddp", accelerator="cpu", devices=1, num_nodes=2, plugins=[environment],
                                  **QUIET)
        model = Model()
        model.trainer = trainer
        trainer.strategy.connect(model)
        trainer._data_connector.attach_datamodule(model, datamodule=Data())
        trainer._data_connector.prepare_data()
        seen.append(((trainer.global_rank, trainer.local_rank, trainer.node_rank, per_node, in_init), called))
    return seen


def test_prepare_data_once_in_all_runs_on_local_rank_0_of_node_0_as_lightning():
    got = _both(_prepared_on)
    both = ["datamodule", "module"]
    assert got["tasktrain"] == got["lightning"] == [((0, 0, 1, False, True), []), ((1, 0, 0, False, True), both),
                                                    ((0, 0, 1, True, True), both), ((0, 0, 1, False, False), both)]


def test_a_flag_set_as_a_class_attribute_is_shadowed_with_a_warning():
    """Lightning's __init__ sets prepare_data_per_node / allow_zero_length_dataloader_with_multiple_devices on the
    instance, so a subclass's class attribute is not used (the case above, as Lightning's): tasktrain says so when the
    flag is read, and says nothing where __init__ sets it."""
    from tasktrain.demos.boring_classes import BoringDataModule, BoringModel
    import warnings

    from tasktrain.trainer.module import instance_flag

    class ClassLevel(BoringModel):
        prepare_data_per_node = False

    class DataClassLevel(BoringDataModule):
        allow_zero_length_dataloader_with_multiple_devices = True

    with pytest.warns(UserWarning, match=r"ClassLevel.prepare_data_per_node = False is a class attribute, .* so True "
                                         r"is used: set `self.prepare_data_per_node = False` in __init__"):
        assert instance_flag(ClassLevel(), "prepare_data_per_node") is True
    with pytest.warns(UserWarning, match="DataClassLevel.allow_zero_length_dataloader_with_multiple_devices = True"):
        assert instance_flag(DataClassLevel(), "allow_zero_length_dataloader_with_multiple_devices") is False

    class InInit(BoringModel):
        def __init__(self):
            super().__init__()
            self.prepare_data_per_node = False

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert instance_flag(InInit(), "prepare_data_per_node") is False
        assert instance_flag(BoringModel(), "allow_zero_length_dataloader_with_multiple_devices") is False


def _hook_owners(lib, boring):
    """Whose transfer hook runs, read through trainer._data_connector._datahook_selector after attach_datamodule and
    after a fit, with the module, the DataModule, both or neither overriding it, and the warnings said."""
    import warnings

    from_connector = __import__(f"{lib.__name__}.trainer.connectors.data_connector", fromlist=["x"])
    seen = []

    def hook(self, batch, *args):
        return batch

    for module_has in (False, True):
        for datamodule_has in (False, True):
            from_connector.warning_cache.clear()
            model, datamodule = boring.BoringModel(), boring.BoringDataModule()
            if module_has:
                model.on_before_batch_transfer = hook.__get__(model)
            if datamodule_has:
                datamodule.on_before_batch_transfer = hook.__get__(datamodule)
            trainer = lib.Trainer(max_steps=1, limit_val_batches=0, **QUIET)
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                trainer._data_connector.attach_datamodule(model, datamodule=datamodule)
                selector = trainer._data_connector._datahook_selector
                owner = selector.get_instance("on_before_batch_transfer")
                trainer.fit(model, datamodule=datamodule)  # (said once: the cache holds it)
            said = [str(w.message).replace("LightningModule", "TaskModule").replace("LightningDataModule",
                                                                                     "DataModule")
                    for w in record if "have overridden" in str(w.message)]
            seen.append((module_has, datamodule_has, "module" if owner is model else "datamodule", said))
    with pytest.raises(ValueError, match="is not a shared hook"):
        from_connector._DataHookSelector(boring.BoringModel(), None).get_instance("setup")
    return seen


def test_datahook_selector_and_its_warnings_as_lightning():
    got = _both(_hook_owners)
    assert got["tasktrain"] == got["lightning"]
    assert [owner for *_, owner, _ in got["tasktrain"]] == ["module", "datamodule", "module", "datamodule"]
    assert [len(said) for *_, said in got["tasktrain"]] == [0, 0, 1, 1]


def test_connected_module_and_attached_datamodule_save_as_lightning(tmp_path):
    """Lightning's test_load_from_checkpoint_hook_calls' set-up: a fresh Trainer, a connected module, an attached
    DataModule, a checkpoint saved with no run."""
    def case(lib, boring):
        class Data(boring.BoringDataModule):
            def state_dict(self):
                return {"foo": "bar"}

        model, data = boring.BoringModel(), Data()
        trainer = lib.Trainer(**QUIET)
        trainer.strategy.connect(model)
        trainer._data_connector.attach_data(model, datamodule=data)
        path = tmp_path / f"{lib.__name__}.ckpt"
        trainer.save_checkpoint(path)
        saved = torch.load(path, weights_only=False)
        return (trainer.lightning_module is model, trainer.datamodule is data, model.trainer is trainer,
                data.trainer is trainer, sorted(k for k in saved if k != type(data).__qualname__),
                saved.get(type(data).__qualname__), saved["global_step"],
                torch.equal(saved["state_dict"]["layer.weight"], model.layer.weight))

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]


# -- trainer._checkpoint_connector, strategy.connect -------------------------------------------------------------------
def _restore_case(lib, boring, tmp_path):
    """A callback's on_train_end restores the first checkpoint (NeMo's pattern), and a fresh Trainer with a connected
    module restores callbacks before an evaluation (Lightning's own test); the readings at each step."""
    seen = []
    first = str(tmp_path / f"{lib.__name__}-first.ckpt")

    class Keep(lib.Callback):
        def __init__(self):
            self.value = 0

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

        def on_train_batch_end(self, trainer, module, *args):
            self.value += 1
            if trainer.global_step == 2:
                trainer.save_checkpoint(first)
                seen.append(("saved", self.value, [p.detach().clone() for p in module.parameters()]))

        def on_train_end(self, trainer, module):
            connector = trainer._checkpoint_connector
            connector.restore(first)
            seen.append(("restored", trainer.global_step, self.value, connector._ckpt_path == first,
                         connector._loaded_checkpoint == {}, [p.detach().clone() for p in module.parameters()]))

    keep = Keep()
    trainer = lib.Trainer(max_steps=4, callbacks=[keep], **QUIET)
    trainer.fit(boring.BoringModel())
    seen.append(("after", trainer.global_step, keep.value, trainer.ckpt_path == first))
    full = sorted(trainer._checkpoint_connector.dump_checkpoint())
    weights = sorted(trainer._checkpoint_connector.dump_checkpoint(weights_only=True))
    seen.append(("dump", full, weights))

    # a fresh Trainer: connect a module, read the checkpoint, restore the callbacks, let it go
    again, model = Keep(), boring.BoringModel()
    fresh = lib.Trainer(callbacks=[again], **QUIET)
    fresh.strategy.connect(model)
    seen.append(("connected", fresh.lightning_module is model, fresh.model is model))
    connector = fresh._checkpoint_connector
    seen.append(("empty", connector._ckpt_path, connector._loaded_checkpoint))
    connector.resume_start(first)
    seen.append(("started", connector._ckpt_path == first, fresh.ckpt_path == first,
                 torch.equal(connector._loaded_checkpoint["state_dict"]["layer.weight"], seen[0][2][0])))
    connector.restore_callbacks()
    connector.restore_model()
    seen.append(("callbacks", again.value, [p.detach().clone() for p in model.parameters()]))
    fresh.state.fn = "validate"
    connector.resume_end()
    seen.append(("ended", connector._ckpt_path == first, connector._loaded_checkpoint))

    # trainer.ckpt_path = ... is what _user_managed says
    fresh.ckpt_path = first
    managed = connector._user_managed
    fresh.ckpt_path = None
    seen.append(("managed", managed, connector._user_managed, connector._ckpt_path))
    return seen


def test_checkpoint_connector_restores_as_lightning(tmp_path):
    got = {name: _restore_case(*LIBS[name], tmp_path) for name in LIBS}
    ours_seen, theirs_seen = got["tasktrain"], got["lightning"]
    assert len(ours_seen) == len(theirs_seen)
    for mine, lightnings in zip(ours_seen, theirs_seen):
        assert mine[0] == lightnings[0]
        for a, b in zip(mine[1:], lightnings[1:]):
            if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
                continue  # weights: compared within each framework below (the two runs draw different weights)
            assert a == b, (mine[0], a, b)
    for seen in (ours_seen, theirs_seen):  # the restored weights are the first checkpoint's, in both
        saved = seen[0][2]
        restored, connected = seen[1][-1], next(s for s in seen if s[0] == "callbacks")[2]
        assert all(torch.equal(a, b) for a, b in zip(saved, restored))
        assert all(torch.equal(a, b) for a, b in zip(saved, connected))


def test_checkpoint_connector_names_what_it_lacks():
    trainer = tasktrain.Trainer(**QUIET)
    with pytest.raises(AttributeError, match="'hpc_save_path' is not supported by tasktrain"):
        trainer._checkpoint_connector.hpc_save_path
    with pytest.raises(NotImplementedError, match="restore_training_state"):
        trainer._checkpoint_connector.restore_loops()


def test_tensor_init_context_is_what_init_module_enters():
    trainer = tasktrain.Trainer(**QUIET)
    calls = []
    original = trainer.strategy.tensor_init_context

    def spy(empty_init=None):
        calls.append(empty_init)
        return original(empty_init=empty_init)

    trainer.strategy.tensor_init_context = spy
    with trainer.init_module(empty_init=True):
        layer = torch.nn.Linear(2, 2)
    assert calls == [True] and layer.weight.device.type == "cpu"


def test_init_module_passes_empty_init_as_lightning():
    """`trainer.init_module()` hands its strategy's tensor_init_context what Lightning's does: None when not given
    ("the strategy decides"; a strategy of one's own may tell it from an explicit False), else the value given."""

    def case(lib, boring):
        trainer = lib.Trainer(accelerator="cpu", devices=1, **QUIET)
        calls = []
        original = trainer.strategy.tensor_init_context

        def spy(empty_init=None):
            calls.append(empty_init)
            return original(empty_init=empty_init)

        trainer.strategy.tensor_init_context = spy
        for given in ({}, {"empty_init": False}, {"empty_init": True}):
            with trainer.init_module(**given):
                pass
        return calls

    got = _both(case)
    assert got["tasktrain"] == got["lightning"] == [None, False, True]


@pytest.mark.parametrize("precision", ["64-true", "bf16-true", "16-true", "32-true", "bf16-mixed"])
def test_init_module_builds_in_the_precisions_dtype_as_lightning(precision):
    """`with trainer.init_module(): ...` builds parameters and the tensors made inside in a "-true" precision's dtype
    on the root device (Lightning's precision plugins' tensor_init_context), and restores the default dtype after;
    a fit of the module so built trains in that dtype."""
    import warnings

    def case(lib, boring):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = lib.Trainer(precision=precision, max_steps=1, limit_val_batches=0, **QUIET)
            with trainer.init_module():
                module = boring.BoringModel()
                made = torch.zeros(1)
            after = torch.get_default_dtype()
            built = (module.layer.weight.dtype, module.layer.weight.device.type, made.dtype, after)
            trainer.fit(module)
        return built, module.layer.weight.dtype

    seen = _both(case)
    assert seen["tasktrain"] == seen["lightning"]
    expected = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision,
                                                                                                    torch.float32)
    assert seen["tasktrain"][0] == (expected, "cpu", expected, torch.float32)


# -- tasktrain.loops: Lightning's loop class names --------------------------------------------------------------------
def test_loop_classes_name_the_trainers_loops_as_lightning():
    def case(lib, boring):
        import importlib

        loops = importlib.import_module(f"{lib.__name__}.loops")
        progress = importlib.import_module(f"{lib.__name__}.loops.progress")
        trainer = lib.Trainer(**QUIET)
        fit = trainer.fit_loop
        return (isinstance(fit, loops._FitLoop), isinstance(fit, loops._Loop),
                isinstance(fit.epoch_loop, loops._TrainingEpochLoop), isinstance(fit.epoch_loop, loops._Loop),
                isinstance(fit.epoch_loop.val_loop, loops._EvaluationLoop),
                *(isinstance(loop, loops._EvaluationLoop) for loop in (trainer.validate_loop, trainer.test_loop)),
                isinstance(trainer.predict_loop, loops._PredictionLoop), isinstance(trainer.predict_loop, loops._Loop),
                isinstance(trainer.validate_loop, loops._FitLoop),
                isinstance(fit.epoch_progress, progress._Progress), isinstance(fit.epoch_progress, progress._BaseProgress),
                isinstance(fit.epoch_progress.current, progress._BaseProgress),
                isinstance(fit.epoch_loop.batch_progress, progress._BatchProgress))

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    with pytest.raises(AttributeError, match="optimization loop objects are not in tasktrain"):
        import tasktrain.loops

        tasktrain.loops._AutomaticOptimization


# -- tasktrain.overrides.distributed --------------------------------------------------------------------------------
def test_unrepeated_sampler_and_index_wrapper_as_lightnings():
    from torch.utils.data import BatchSampler

    def case(lib, boring):
        import importlib
        import pickle

        overrides = importlib.import_module(f"{lib.__name__}.overrides.distributed")
        seen = []
        for size, replicas, shuffle, epoch in ((10, 3, False, 0), (10, 3, True, 0), (10, 3, True, 4), (2, 4, True, 1)):
            for rank in range(replicas):
                try:
                    sampler = overrides.UnrepeatedDistributedSampler(list(range(size)), num_replicas=replicas,
                                                                     rank=rank, shuffle=shuffle)
                except Exception as refused:  # a rank without a sample: Lightning's AssertionError
                    seen.append(type(refused).__name__)
                    continue
                sampler.set_epoch(epoch)
                seen.append((list(sampler), len(sampler), sampler.num_samples, sampler.total_size))
        wrapper = overrides._IndexBatchSamplerWrapper(BatchSampler(range(7), batch_size=3, drop_last=False))
        first = [batch for batch in wrapper]
        seen.append((first, list(wrapper.seen_batch_indices), len(wrapper), wrapper.batch_size, wrapper.drop_last))
        again = iter(wrapper)
        next(again)
        seen.append(list(wrapper.seen_batch_indices))
        seen.append(len(pickle.loads(pickle.dumps(wrapper))))
        return seen

    got = _both(case)
    assert got["tasktrain"] == got["lightning"] and "AssertionError" in got["tasktrain"]


def test_parse_ckpt_path_as_lightning(tmp_path):
    """The checkpoint connector's _parse_ckpt_path (Lightning's tests and NeMo-style scripts call it) resolves as
    Lightning's, with the same warnings, through the Trainer's own rules."""
    import warnings

    def case(lib, boring):
        first, second = (lib.callbacks.ModelCheckpoint(dirpath=tmp_path / lib.__name__ / name, monitor="step",
                                                       mode=mode) for name, mode in (("a", "max"), ("b", "min")))
        trainer = lib.Trainer(max_steps=2, callbacks=[first, second], default_root_dir=tmp_path / lib.__name__,
                              logger=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(boring.BoringModel())
        import importlib

        trainer_fn = importlib.import_module(f"{lib.__name__}.trainer.states").TrainerFn
        seen = []
        for fn, path, provided, connected in (("test", None, False, True), ("test", "best", False, True),
                                              ("fit", None, True, True), ("validate", "last", False, True),
                                              ("predict", "some.ckpt", False, False)):
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                got = trainer._checkpoint_connector._parse_ckpt_path(trainer_fn(fn), path, model_provided=provided,
                                                                      model_connected=connected)
            seen.append((got == first.best_model_path, got, sorted(str(w.message) for w in said
                                                                   if issubclass(w.category, UserWarning)
                                                                   and "ckpt_path" in str(w.message))))
        fast = lib.Trainer(fast_dev_run=True, logger=False, enable_progress_bar=False)
        with pytest.raises(ValueError, match="fast_dev_run=True"):
            fast._checkpoint_connector._parse_ckpt_path(trainer_fn("test"), "best", model_provided=False,
                                                        model_connected=True)
        return [(same, None if same else got, said) for same, got, said in seen]

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    assert [same for same, _, _ in got["tasktrain"]] == [True, True, False, False, False]
    assert [len(said) for _, _, said in got["tasktrain"]] == [2, 1, 0, 1, 0]  # (default "best", several callbacks, no last)


# -- trainer._logger_connector.should_update_logs ----------------------------------------------------------------------
def _update_logs_case(lib, boring, tmp_path):
    readings = []

    class Reader(lib.Callback):
        def _read(self, where, trainer):
            readings.append((where, trainer.global_step, trainer._logger_connector.should_update_logs))

        def on_train_batch_start(self, trainer, *args):
            self._read("train start", trainer)

        def on_train_batch_end(self, trainer, *args):
            self._read("train end", trainer)

        def on_validation_batch_end(self, trainer, *args):
            self._read("val" if trainer.state.fn == "fit" else "validate", trainer)

        def on_test_batch_end(self, trainer, *args):
            self._read("test", trainer)

        def on_predict_batch_end(self, trainer, *args):
            self._read("predict", trainer)

    trainer = lib.Trainer(default_root_dir=tmp_path / lib.__name__, max_epochs=2, limit_train_batches=7,
                          limit_val_batches=4, limit_test_batches=4, limit_predict_batches=4, num_sanity_val_steps=2,
                          accumulate_grad_batches=2, log_every_n_steps=3, callbacks=[Reader()], **QUIET)
    module = boring.BoringModel()
    outside = trainer._logger_connector.should_update_logs
    trainer.fit(module)
    trainer.validate(module, verbose=False)
    trainer.test(module, verbose=False)
    trainer.predict(module)
    never = lib.Trainer(log_every_n_steps=0, **QUIET)._logger_connector.should_update_logs
    return outside, never, readings


def test_logger_connector_should_update_logs_reads_as_lightning(tmp_path):
    got = {name: _update_logs_case(*LIBS[name], tmp_path) for name in LIBS}
    assert got["tasktrain"] == got["lightning"]
    outside, never, readings = got["tasktrain"]
    assert outside is True and never is False
    assert {value for *_, value in readings} == {True, False}  # (both answers are read)


def test_request_dataloader_and_worker_check_as_lightning(monkeypatch):
    """tasktrain.trainer.connectors.data_connector's module-level names beside Lightning's: a source's loaders,
    requested as a run requests them, can be built again around another sampler (their constructor arguments
    recorded); the worker warnings for the same loaders."""
    import warnings

    from torch.utils.data import SequentialSampler

    def case(lib, boring):
        connector = __import__(f"{lib.__name__}.trainer.connectors.data_connector", fromlist=["x"])
        data = __import__(f"{lib.__name__}.utilities.data", fromlist=["x"])

        class Loader(DataLoader):  # (an argument the base class does not have: only a recorded call rebuilds it)
            def __init__(self, width, dataset, **kwargs):
                self.width = width
                super().__init__(dataset, **kwargs)

        class Model(boring.BoringModel):
            def train_dataloader(self):
                return Loader(32, boring.RandomDataset(32, 8), batch_size=2)

        model = Model()
        model.trainer = lib.Trainer(**QUIET)
        source = connector._DataLoaderSource(model, "train_dataloader")
        loader = connector._request_dataloader(source)
        rebuilt = data._update_dataloader(loader, SequentialSampler(loader.dataset))
        seen = [type(rebuilt).__name__, rebuilt.width, rebuilt.batch_size, source.is_module(), source.is_defined()]
        trainer = lib.Trainer(**QUIET)
        for workers, persistent in ((0, False), (1, True)):
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                connector._worker_check(trainer, DataLoader(range(4), num_workers=workers,
                                                            persistent_workers=persistent), "train_dataloader")
            seen.append(sorted(str(w.message)[:60] for w in record))
        return seen

    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)  # (8 cores: a bound of 7)
    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"][:5] == ["Loader", 32, 2, True, True]
    assert got["tasktrain"][5] == ["The 'train_dataloader' does not have many workers which may "]
    assert got["tasktrain"][6] == ["The 'train_dataloader' does not have many workers which may "]


def test_datahook_selector_follows_each_attach_as_lightning():
    """Each entry point attaches its module and DataModule (None where none is given) anew, as Lightning's
    attach_data makes a new _DataHookSelector: after attach_data(m1, dm), fit(m2, datamodule=dm), fit(m2, loader) and
    validate(m1, loader) the selector holds that run's; trainer.datamodule stays; the transfer hook that runs after a
    fit without a DataModule is the module's."""
    import warnings

    def case(lib, boring):
        calls = []

        class Moves(boring.BoringDataModule):
            def on_before_batch_transfer(self, batch, dataloader_idx):
                calls.append("datamodule")
                return batch

        trainer = lib.Trainer(max_steps=1, limit_val_batches=1, **QUIET)
        m1, m2, dm = boring.BoringModel(), boring.BoringModel(), Moves()
        seen = []

        def read():
            selector = trainer._data_connector._datahook_selector
            seen.append(None if selector is None else ({id(m1): "m1", id(m2): "m2"}[id(selector.model)],
                                                       selector.datamodule is dm, trainer.datamodule is dm,
                                                       len(calls)))

        read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer._data_connector.attach_data(m1, datamodule=dm)
            read()
            trainer.fit(m2, datamodule=dm)
            read()
            trainer.fit_loop.epoch_loop.max_steps = 2
            trainer.fit(m2, DataLoader(boring.RandomDataset(32, 8)))  # (the hook of the module: none counted)
            read()
            trainer.validate(m1, DataLoader(boring.RandomDataset(32, 8)))
            read()
        return seen

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    assert [reading[:2] for reading in got["tasktrain"][1:]] == [("m1", True), ("m2", True), ("m2", False),
                                                                  ("m1", False)]


def test_a_run_given_no_datamodule_takes_the_modules_loaders_as_lightning():
    """After fit(datamodule=dm), a fit / validate / test given only a training loader (or nothing) takes the other
    loaders from the module's hooks, as Lightning's loop sources (attach_dataloaders: the loaders given, else the
    model), while trainer.datamodule stays and its setup still runs (Lightning calls the DataModule's setup at every
    entry point while trainer.datamodule is set)."""
    import warnings

    def case(lib, boring):
        calls = []

        class Data(boring.BoringDataModule):
            def setup(self, stage):
                calls.append(f"dm.setup:{stage}")
                super().setup(stage)

            def val_dataloader(self):
                calls.append("dm.val")
                return super().val_dataloader()

            def test_dataloader(self):
                calls.append("dm.test")
                return super().test_dataloader()

        class Model(boring.BoringModel):
            def val_dataloader(self):
                calls.append("module.val")
                return super().val_dataloader()

            def test_dataloader(self):
                calls.append("module.test")
                return super().test_dataloader()

        trainer = lib.Trainer(max_steps=1, limit_val_batches=1, limit_test_batches=1, num_sanity_val_steps=0, **QUIET)
        dm, model = Data(), Model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, datamodule=dm)
            calls.append("|")
            trainer.fit_loop.epoch_loop.max_steps = 2
            trainer.fit(model, DataLoader(boring.RandomDataset(32, 8)))
            calls.append("|")
            trainer.validate(model)
            calls.append("|")
            trainer.test(model)
        return calls, trainer.datamodule is dm

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    calls, kept = got["tasktrain"]
    assert kept and calls.count("|") == 3
    after = calls[calls.index("|"):]
    assert "module.val" in after and "module.test" in after and "dm.val" not in after and "dm.test" not in after



# (at module level: ddp_spawn pickles what it sends to its children)
SPAWN_CALLS = []


class _RecordsException:
    def on_exception(self, trainer, module, exception):
        SPAWN_CALLS.append(["callback.on_exception", type(exception).__name__, trainer.state.status.value])

    def teardown(self, trainer, module, stage):
        SPAWN_CALLS.append(["callback.teardown", stage])


class _OursRecordsException(_RecordsException, tasktrain.Callback):
    pass


class _TheirsRecordsException(_RecordsException, pl.Callback):
    pass


class _DataRecordsException:
    def on_exception(self, exception):
        SPAWN_CALLS.append(["datamodule.on_exception", type(exception).__name__])


class _OursData(_DataRecordsException, ours.BoringDataModule):
    pass


class _TheirsData(_DataRecordsException, theirs.BoringDataModule):
    pass


class _FinalizeLog:
    """A logger of one's own (tests/test_lightning_beside_loggers.py's kind) that records finalize."""
    name, version, save_dir, group_separator, experiment = "calls", 0, None, "/", None

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_graph(self, model, input_array=None):
        pass

    def save(self):
        pass

    def after_save_checkpoint(self, checkpoint_callback):
        pass

    def finalize(self, status):
        SPAWN_CALLS.append(["logger.finalize", status])


def test_a_failed_ddp_spawn_run_calls_the_parents_exception_hooks_as_lightning(monkeypatch):
    """Under "ddp_spawn", Lightning's entry point calls, in the parent around its launcher (call.py's _interrupt),
    every callback's on_exception and the loggers' finalize("failed"), and leaves trainer.state INTERRUPTED (not the
    DataModule's on_exception, nor the teardown hooks: the parent never attached the DataModule, its children do);
    for a child's error (faked: torch's start_processes raises torch's ProcessRaisedException, as it does when a child
    raised) and for the refused second fit alike."""
    import torch.multiprocessing as mp

    def start_processes(*args, **kwargs):
        raise mp.ProcessRaisedException("\n\n-- Process 1 terminated with the following error:\nValueError: boom", 1,
                                        4242)

    monkeypatch.setattr(mp, "start_processes", start_processes)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)

    def case(lib, boring):
        mine = lib is tasktrain
        trainer = lib.Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_steps=1,
                              callbacks=[(_OursRecordsException if mine else _TheirsRecordsException)()],
                              logger=_FinalizeLog(), enable_progress_bar=False, enable_model_summary=False,
                              enable_checkpointing=False)
        got = []
        for attempt in ("child failed", "second fit refused"):
            SPAWN_CALLS.clear()
            with pytest.raises(BaseException) as raised:
                trainer.fit(boring.BoringModel(), datamodule=(_OursData if mine else _TheirsData)())
            got.append([attempt, type(raised.value).__name__, SPAWN_CALLS[:], trainer.state.status.value])
            trainer.strategy.launcher._already_fit = True  # (as after a fit that succeeded)
        return got

    got = _both(case)
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"][0][2] == [["callback.on_exception", "ProcessRaisedException", "interrupted"],
                                      ["logger.finalize", "failed"]], got


class _TheirsFailsAtStep3(FailsAtStep3, theirs.BoringModel):  # (ours: helpers.py, which a child imports fast)
    pass


class _TheirsNotesWhereException(NotesWhereException, pl.Callback):
    pass


def test_a_failed_ddp_spawn_run_saves_its_state_where_it_ran(tmp_path, monkeypatch, capfd):
    """A "ddp_spawn" run whose child raises at global step 3 (devices=1), with an OnExceptionCheckpoint. Lightning's
    children call no on_exception and no finalize (its launcher runs _fit_impl there, outside
    _call_and_handle_interrupt); its parent calls both, and its OnExceptionCheckpoint saves the parent's weights: the
    untrained ones, at global step 0 (asserted: Lightning's loss of the run's state, no Lightning issue found; its
    spawn launcher hands nothing back from a failed child, Lightning-AI/pytorch-lightning#18775). Kept different:
    tasktrain's child, where the run's state is, calls its on_exception and its loggers' finalize("failed") too, so
    the checkpoint holds step 3's weights; its parent calls Lightning's hooks after it, and its OnExceptionCheckpoint
    writes nothing there (it neither overwrites the child's file nor reports a failed save)."""
    import json

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKTRAIN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)

    def case(lib, boring):
        mine = lib is tasktrain
        notes = tmp_path / f"{lib.__name__}.notes"
        lib.seed_everything(0, verbose=False)
        module = (OursFailsAtStep3 if mine else _TheirsFailsAtStep3)()
        initial = module.layer.weight.detach().clone()
        saver = lib.callbacks.OnExceptionCheckpoint(str(tmp_path / lib.__name__))
        trainer = lib.Trainer(strategy="ddp_spawn", devices=1, accelerator="cpu", max_steps=5,
                              callbacks=[(OursNotesWhereException if mine else _TheirsNotesWhereException)(str(notes)),
                                         saver], logger=NotesWhereFinalize(str(notes)), enable_progress_bar=False,
                              enable_model_summary=False, default_root_dir=str(tmp_path))
        capfd.readouterr()
        with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="boom at step 3"):
            trainer.fit(module, DataLoader(boring.RandomDataset(32, 16), batch_size=2))
        err = capfd.readouterr().err
        saved = torch.load(saver.ckpt_path, weights_only=False)
        return dict(notes=[json.loads(line) for line in notes.read_text().splitlines()],
                    saved_step=saved["global_step"],
                    saved_untrained=torch.equal(saved["state_dict"]["layer.weight"], initial),
                    parent_failed_save="failed too" in err)

    got = _both(case)
    parents = [["parent", "on_exception", "ProcessRaisedException", 0], ["parent", "finalize", "failed"]]
    assert got["lightning"] == dict(notes=parents, saved_step=0, saved_untrained=True, parent_failed_save=False)
    assert got["tasktrain"] == dict(notes=[["child", "on_exception", "ValueError", 3], ["child", "finalize", "failed"]]
                                    + parents, saved_step=3, saved_untrained=False, parent_failed_save=False)
