"""The public attributes a Lightning user's callback or script reads on the Trainer and the module, beside Lightning
itself: one recording callback reads them all at every hook of fit, validate, test and predict (and before and
after each run) under both frameworks, and the records are compared value by value; strict_loading at resume and at
load_from_checkpoint (and under DeepSpeed's engine); received_sigterm after a SIGTERM to the process. (device_ids,
num_devices, distributed_sampler_kwargs on two gloo processes: tests/test_lightning_ddp.py, in its one launch.)"""
import os
import signal

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)

HOOKS = ("setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
         "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
         "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
         "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
         "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
         "on_predict_batch_start", "on_predict_batch_end")


def _loaders(value):
    """A loader (or list / dict of loaders) as the lengths of its loaders, comparable across frameworks."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_loaders(v) for v in value]
    if isinstance(value, dict):
        return {k: _loaders(v) for k, v in value.items()}
    try:
        return ("loader", len(value))
    except TypeError:  # (an iterable dataset's)
        return ("loader", None)


def read(trainer, module):
    """Every attribute of the item, in a form both frameworks can be compared in."""
    seen = dict(
        accelerator=type(trainer.accelerator).__name__, device_ids=trainer.device_ids,
        # Lightning's strategy.accelerator: the Trainer's Accelerator object itself
        strategy_accelerator=(type(trainer.strategy.accelerator).__name__,
                              trainer.strategy.accelerator is trainer.accelerator),
        num_devices=trainer.num_devices, distributed_sampler_kwargs=trainer.distributed_sampler_kwargs,
        stages=(trainer.training, trainer.sanity_checking, trainer.validating, trainer.testing, trainer.predicting),
        evaluating=trainer.evaluating, is_last_batch=trainer.is_last_batch, received_sigterm=trainer.received_sigterm,
        scaler=None if trainer.scaler is None else type(trainer.scaler).__name__,
        train_dataloader=_loaders(trainer.train_dataloader), val_dataloaders=_loaders(trainer.val_dataloaders),
        test_dataloaders=_loaders(trainer.test_dataloaders),
        predict_dataloaders=_loaders(trainer.predict_dataloaders),
        num_training_batches=trainer.num_training_batches, num_val_batches=trainer.num_val_batches,
        num_sanity_val_batches=trainer.num_sanity_val_batches, num_test_batches=trainer.num_test_batches,
        num_predict_batches=trainer.num_predict_batches,
    )
    if module is not None:
        seen.update(fabric=module.fabric, on_gpu=module.on_gpu, strict_loading=module.strict_loading,
                    keys=(module.CHECKPOINT_HYPER_PARAMS_KEY, module.CHECKPOINT_HYPER_PARAMS_NAME,
                          module.CHECKPOINT_HYPER_PARAMS_TYPE))
    return seen


def _recorder(lib):
    records = []

    def make(name):
        def hook(self, trainer, pl_module, *args, **kwargs):
            records.append((name, read(trainer, pl_module)))
        return hook

    recorder = type("Recorder", (lib.Callback,), {name: make(name) for name in HOOKS})()
    return recorder, records


def _runs(lib, classes):
    recorder, records = _recorder(lib)
    model = classes.BoringModel()
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                          limit_predict_batches=2, num_sanity_val_steps=1, callbacks=[recorder], **QUIET)
    records.append(("before", read(trainer, None)))
    trainer.fit(model)
    records.append(("after fit", read(trainer, model)))
    trainer.validate(model)
    records.append(("after validate", read(trainer, model)))
    trainer.test(model)
    records.append(("after test", read(trainer, model)))
    trainer.predict(model)
    records.append(("after predict", read(trainer, model)))
    return records


def _differences(mine, reference):
    assert [name for name, _ in mine] == [name for name, _ in reference]
    return [(i, name, key, value, reference[i][1][key]) for i, (name, seen) in enumerate(mine)
            for key, value in seen.items() if value != reference[i][1][key]]


def test_every_attribute_reads_lightnings_value_at_every_hook():
    mine = _runs(tasktrain, ours)
    differences = _differences(mine, _runs(pl, theirs))
    assert not differences, "\n".join(map(str, differences))
    by_hook = {}
    for name, seen in mine:
        by_hook.setdefault(name, []).append(seen)
    assert by_hook["before"][0]["num_training_batches"] == float("inf")
    assert [seen["is_last_batch"] for seen in by_hook["on_train_batch_start"]] == [False, False, True]
    assert [seen["evaluating"] for seen in by_hook["setup"]] == [False, True, True, False]
    assert by_hook["on_test_start"][0]["test_dataloaders"] == ("loader", 64)
    assert by_hook["after predict"][0]["num_val_batches"] == [2] and by_hook["on_fit_start"][0]["keys"] == (
        "hyper_parameters", "hparams_name", "hparams_type")


def _unsized_then_again(lib, classes):
    """Loaders without a length (fit and test), then a second fit of the same Trainer on sized ones."""
    recorder, records = _recorder(lib)
    model = classes.BoringModel()
    trainer = lib.Trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[recorder], **QUIET)

    def unsized():
        return torch.utils.data.DataLoader(classes.RandomIterableDataset(32, 4), batch_size=2)

    trainer.fit(model, unsized(), unsized())
    trainer.test(model, unsized())
    trainer.fit(model, torch.utils.data.DataLoader(classes.RandomDataset(32, 4), batch_size=2))
    records.append(("after", read(trainer, model)))
    return records


def test_loaders_without_a_length_and_a_second_fit_read_lightnings_counts():
    differences = _differences(_unsized_then_again(tasktrain, ours), _unsized_then_again(pl, theirs))
    # Lightning's bug (docs/lightning.md, issue 37): during a fit's sanity check its num_test_batches reads the last
    # test's counts cut to num_sanity_val_steps (every evaluation loop's max_batches is cut while sanity checking)
    assert differences and all(key == "num_test_batches" and value == [float("inf")] and theirs_ == [1]
                               for _, _, key, value, theirs_ in differences), differences
    assert {name for _, name, _, _, _ in differences} == {
        "on_sanity_check_start", "on_sanity_check_end", "on_validation_start", "on_validation_epoch_start",
        "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end"}


def _strict_loading(lib, classes, root):
    """A checkpoint of BoringModel loaded into one with an extra buffer (a key the file lacks), at a fit's resume
    and in load_from_checkpoint, with and without strict_loading=False: the outcome and what was said."""
    os.makedirs(root)
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, default_root_dir=root, **QUIET)
    trainer.fit(classes.BoringModel())
    path = os.path.join(root, "boring.ckpt")
    trainer.save_checkpoint(path)

    class Wider(classes.BoringModel):
        def __init__(self, loose=None):
            super().__init__()
            self.register_buffer("extra", torch.ones(2))
            if loose is not None:
                self.strict_loading = not loose

    def outcome(fn):
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                result = fn()
            except Exception as error:
                result = type(error).__name__
        return result, [str(w.message) for w in said if "Found keys" in str(w.message)]

    def resume(loose):
        model = Wider(loose)
        lib.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, default_root_dir=root,
                    **QUIET).fit(model, ckpt_path=path)
        return model.strict_loading, model.extra.tolist()

    def load(loose, strict):
        model = Wider.load_from_checkpoint(path, strict=strict, **({} if loose is None else {"loose": loose}))
        return model.strict_loading, torch.equal(model.layer.weight, torch.load(path)["state_dict"]["layer.weight"])

    return [outcome(lambda: resume(loose)) for loose in (None, True)] + \
        [outcome(lambda: load(loose, strict)) for loose, strict in ((None, None), (True, None), (None, False),
                                                                   (True, True), (True, False), (False, False))]


def test_strict_loading_at_resume_and_load_from_checkpoint_as_lightning(tmp_path):
    mine = _strict_loading(tasktrain, ours, str(tmp_path / "ours"))
    reference = _strict_loading(pl, theirs, str(tmp_path / "theirs"))
    assert mine == reference
    missing = ["Found keys that are in the model state dict but not in the checkpoint: ['extra']"]
    assert mine == [("RuntimeError", []), ((False, [1.0, 1.0]), []), ("RuntimeError", []), ((False, True), missing),
                    ((True, True), missing), ("ValueError", []), ((False, True), missing), ("ValueError", [])]


def _sigterm(lib, classes, root):
    seen = []

    class Kill(lib.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            seen.append((batch_idx, trainer.received_sigterm))

        def on_exception(self, trainer, pl_module, exception):
            seen.append((isinstance(exception, SystemExit), trainer.received_sigterm))

    trainer = lib.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, default_root_dir=root,
                          callbacks=[Kill()], **QUIET)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        trainer.fit(classes.BoringModel())
    except SystemExit:  # (both stop the fit with one: Lightning's SIGTERMException, tasktrain's pre-emption exit)
        seen.append("exit")
    assert signal.getsignal(signal.SIGTERM) == previous  # (the handler given back)
    seen.append(("after", trainer.received_sigterm))
    trainer.validate(classes.BoringModel())  # a new run starts without it
    seen.append(("validate", trainer.received_sigterm))
    return seen


def test_received_sigterm_is_set_by_the_handler_as_lightnings(tmp_path):
    mine = _sigterm(tasktrain, ours, str(tmp_path / "ours"))
    assert mine == _sigterm(pl, theirs, str(tmp_path / "theirs"))
    assert mine == [(0, False), (1, True), (True, True), "exit", ("after", True), ("validate", False)]


def _accelerator_and_scaler(lib, plugin_class):
    accelerator = lib.Trainer(**QUIET).accelerator
    seen = [type(accelerator).__name__, accelerator.is_available(), accelerator.auto_device_count(),
            accelerator.name(), accelerator.parse_devices("2"), accelerator.get_parallel_devices(2),
            sorted(accelerator.get_device_stats(torch.device("cpu")))]
    for call in (lambda: accelerator.setup_device(torch.device("meta")), lambda: accelerator.parse_devices(0)):
        try:
            call()
        except Exception as error:
            seen.append((type(error).__name__, str(error)))
    for kwargs in (dict(), dict(precision="bf16-mixed"), dict(plugins=[plugin_class("16-mixed", "cpu")])):
        trainer = lib.Trainer(**kwargs, **QUIET)
        seen.append((trainer.precision, type(trainer.scaler).__name__, trainer.scaler is trainer.precision_plugin.scaler
                     if trainer.scaler is not None else None))
    return seen


def _strategy_accelerators(lib, ddp_class):
    """strategy.accelerator of a strategy object before and after a Trainer resolves it, and of named strategies."""
    given = ddp_class()
    seen = [given.accelerator]  # (Lightning's: None until a Trainer sets it)
    trainer = lib.Trainer(strategy=given, accelerator="cpu", devices=2, **QUIET)
    seen.append((type(given.accelerator).__name__, given.accelerator.name(), given.accelerator is trainer.accelerator))
    for kwargs in (dict(), dict(strategy="ddp", devices=2), dict(accelerator="cpu", strategy="ddp_spawn", devices=2)):
        strategy = lib.Trainer(**kwargs, **QUIET).strategy
        seen.append((type(strategy.accelerator).__name__, strategy.accelerator.name()))
    return seen


def test_strategy_accelerator_is_lightnings_object():
    from lightning.pytorch.strategies import DDPStrategy as TheirDDP

    from tasktrain.strategies import DDPStrategy

    mine = _strategy_accelerators(tasktrain, DDPStrategy)
    assert mine == _strategy_accelerators(pl, TheirDDP)
    assert mine[1] == ("CPUAccelerator", "cpu", True)
    # the strategy still reads its own choice by name (the Accelerator, Accelerate's API, sets no object)
    strategy = tasktrain.Trainer(accelerator="cpu", **QUIET).strategy
    assert strategy.accelerator_name == "cpu" and strategy.root_device.type == "cpu"


def test_the_accelerator_object_and_the_scaler_as_lightnings():
    from lightning.pytorch.plugins import MixedPrecision as TheirPrecision

    from tasktrain.plugins import MixedPrecision

    mine = _accelerator_and_scaler(tasktrain, MixedPrecision)
    assert mine == _accelerator_and_scaler(pl, TheirPrecision)
    assert mine[0] == "CPUAccelerator" and mine[-1] == ("16-mixed", "GradScaler", True)
    assert isinstance(tasktrain.Trainer(**QUIET).accelerator, tasktrain.accelerators.Accelerator)  # (Lightning's path)
    from tasktrain.accelerators import CUDAAccelerator, accelerator_for

    assert isinstance(accelerator_for(torch.device("cuda", 0)), CUDAAccelerator)
    assert CUDAAccelerator.is_available() == torch.cuda.is_available()


def _hparams(classes, datamodule_class):
    class Base(classes.BoringModel):
        def __init__(self, a=1, b=2):
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, a=1, b=2):
            super().__init__(a, b)
            self.remove_ignored_hparams(["b", "not_there"])

    class Data(datamodule_class):
        def __init__(self, size=4, workers=0):
            super().__init__()
            self.save_hyperparameters()
            self.remove_ignored_hparams(["workers"])

    return (dict(Child().hparams), dict(Data().hparams), Child().fabric, Child().on_gpu,
            [getattr(Data, f"CHECKPOINT_HYPER_PARAMS_{k}") for k in ("KEY", "NAME", "TYPE")])


def test_remove_ignored_hparams_and_the_datamodules_keys_as_lightnings():
    mine = _hparams(ours, tasktrain.DataModule)
    assert mine == _hparams(theirs, pl.LightningDataModule)
    assert mine[:2] == ({"a": 1}, {"size": 4})


def test_strict_loading_reaches_deepspeeds_engine_at_resume(tmp_path):
    """Under DeepSpeed the engine loads the weights of a resumed fit itself: strict_loading=False reaches it (as
    Lightning's DeepSpeedStrategy passes load_module_strict=strict_loading); strict, a key the file lacks fails."""
    pytest.importorskip("deepspeed")
    from helpers import Linear, loader, quiet

    saving = tasktrain.ModelCheckpoint(dirpath=str(tmp_path), filename="ds")
    tasktrain.Trainer(strategy="deepspeed_stage_2", devices=1, max_epochs=1, enable_model_summary=False,
                      **quiet(enable_checkpointing=True, callbacks=[saving])).fit(Linear(), loader(n=16, batch_size=8))

    class Wider(Linear):
        def __init__(self, loose):
            super().__init__()
            self.register_buffer("extra", torch.full((2,), 3.0))
            self.strict_loading = not loose

    seen = []
    for loose in (True, False):
        module = Wider(loose)
        trainer = tasktrain.Trainer(strategy="deepspeed_stage_2", devices=1, max_epochs=2, enable_model_summary=False,
                                    **quiet())
        try:
            trainer.fit(module, loader(n=16, batch_size=8), ckpt_path=str(tmp_path / "ds.ckpt"))
            seen.append((trainer.global_step, module.extra.tolist()))
        except RuntimeError as error:
            seen.append("module.extra" in str(error))
    assert seen == [(4, [3.0, 3.0]), True]


def test_device_ids_from_lightnings_device_lists_and_strings(monkeypatch):
    # Lightning's "0, 1" / [0, 1] pick those devices; ours runs on the first N visible ones, so any other indices
    # ([2], "2,", "0, 2") are refused by name (with CUDA_VISIBLE_DEVICES as the fix), never moved to 0..N-1
    import lightning.fabric.accelerators.cuda as lcuda
    from lightning.pytorch import Trainer as LTrainer

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lcuda, "num_cuda_devices", lambda: 4)
    monkeypatch.setattr(lcuda, "_check_cuda_matmul_precision", lambda device: None, raising=False)
    for devices in ([0, 1], "0, 1", "0,", [0]):
        want = LTrainer(accelerator="cuda", devices=devices, logger=False).device_ids
        assert tasktrain.Trainer(accelerator="cuda", devices=devices, logger=False).device_ids == want, devices
    for devices, lightnings in (([2], [2]), ("2,", [2]), ("0, 2", [0, 2])):
        assert LTrainer(accelerator="cuda", devices=devices, logger=False).device_ids == lightnings
        with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
            tasktrain.Trainer(accelerator="cuda", devices=devices, logger=False)


def test_trainer_state_compares_with_lightnings_trainer_state_class():
    """`from lightning.pytorch.trainer.states import TrainerState` has its tasktrain path: `trainer.state` equals a
    TrainerState of the same status, fn and stage (and no other) at each point, as Lightning's."""
    def run(lib, classes, states):
        seen = []

        def check(name, trainer):
            for fn in (states.TrainerFn.FITTING, states.TrainerFn.VALIDATING):
                for stage in (None, states.RunningStage.TRAINING, states.RunningStage.VALIDATING,
                              states.RunningStage.SANITY_CHECKING):
                    for status in (states.TrainerStatus.RUNNING, states.TrainerStatus.FINISHED):
                        if trainer.state == states.TrainerState(status=status, fn=fn, stage=stage):
                            seen.append((name, status.value, fn.value, stage and stage.value))

        hooks = {hook: (lambda hook: lambda trainer, *_: check(hook, trainer))(hook)
                 for hook in ("on_train_batch_start", "on_validation_batch_start", "on_validation_end")}
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1,
                              callbacks=[lib.callbacks.LambdaCallback(**hooks)], **QUIET)
        seen.append(("made", trainer.state == states.TrainerState(), trainer.state != states.TrainerState()))
        trainer.fit(classes.BoringModel())
        check("after fit", trainer)
        trainer.validate(classes.BoringModel(), verbose=False)
        check("after validate", trainer)
        return seen

    import lightning.pytorch.trainer.states as their_states
    import tasktrain.trainer.states as our_states

    mine, reference = run(tasktrain, ours, our_states), run(pl, theirs, their_states)
    assert mine == reference
    assert ("on_train_batch_start", "running", "fit", "train") in mine and ("made", True, False) in mine
    assert [s for s in mine if s[0] == "after validate"] == [("after validate", "finished", "validate", None)]


def test_a_module_under_fabric_and_its_trainer_shim_are_refused():
    """Lightning runs a LightningModule under Fabric (module.fabric, module.trainer a _TrainerFabricShim); a tasktrain
    module never runs there: setting its fabric and creating the shim (importable at Lightning's path) both raise,
    naming what to use."""
    from lightning.fabric import Fabric

    from tasktrain.core.module import _TrainerFabricShim

    with pytest.raises(TypeError, match="does not run under Lightning Fabric"):
        ours.BoringModel().fabric = Fabric(accelerator="cpu", devices=1)
    with pytest.raises(TypeError, match=r"_TrainerFabricShim\(Fabric\): a tasktrain module does not run under"):
        _TrainerFabricShim(Fabric(accelerator="cpu", devices=1))
