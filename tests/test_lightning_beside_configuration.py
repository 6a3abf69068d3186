"""The checks of a module before a run (Lightning's trainer/configuration_validator.py; tasktrain's
check_fit_configuration / check_eval_configuration in trainer.py, also under Lightning's module path and names,
tasktrain.trainer.configuration_validator) beside Lightning 2.6's: the same module under both frameworks, the error
raised (its type, and Lightning's words, which tasktrain's message starts with) or the run's result compared."""
import warnings

import pytest

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

LIBS = {"tasktrain": (tasktrain, ours), "lightning": (pl, theirs)}
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             max_steps=1, limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1, num_sanity_val_steps=0)

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py)


def _legacy(boring, name):
    return type(f"With_{name}", (boring.BoringModel,), {name: lambda self, outputs: None})


def _without(boring, name):
    model = boring.BoringModel()
    setattr(model, name, None)
    return model


# (entry point, the module of a library's boring classes, Trainer flags)
CASES = {
    "no training_step": ("fit", lambda b: _without(b, "training_step"), {}),
    "no configure_optimizers": ("fit", lambda b: _without(b, "configure_optimizers"), {}),
    "training_epoch_end": ("fit", lambda b: _legacy(b, "training_epoch_end")(), {}),
    "validation_epoch_end in fit": ("fit", lambda b: _legacy(b, "validation_epoch_end")(), {}),
    "validation_epoch_end in validate": ("validate", lambda b: _legacy(b, "validation_epoch_end")(), {}),
    "test_epoch_end": ("test", lambda b: _legacy(b, "test_epoch_end")(), {}),
    "test_epoch_end in validate": ("validate", lambda b: _legacy(b, "test_epoch_end")(), {}),
    "no validation_step": ("validate", lambda b: _without(b, "validation_step"), {}),
    "no test_step": ("test", lambda b: _without(b, "test_step"), {}),
    "predict_step None": ("predict", lambda b: _without(b, "predict_step"), {}),
    "no forward": ("predict", lambda b: _without(b, "forward"), {}),
    "manual with clipping": ("fit", lambda b: _manual(b), {"gradient_clip_val": 1.0}),
    "manual with accumulation": ("fit", lambda b: _manual(b), {"accumulate_grad_batches": 2}),
}


def _manual(boring):
    model = boring.BoringModel()
    model.automatic_optimization = False
    return model


def _run(lib, boring, case):
    stage, build, flags = CASES[case]
    trainer = lib.Trainer(**QUIET, **flags)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(trainer, stage)(build(boring))
    except Exception as error:  # noqa: BLE001 (the error is what is compared)
        return type(error).__name__, str(error)
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_module_checked_before_the_run_as_lightning(case):
    ours_, theirs_ = _run(*LIBS["tasktrain"], case), _run(*LIBS["lightning"], case)
    if theirs_ is None:
        assert ours_ is None
        return
    assert ours_ is not None and ours_[0] == theirs_[0]
    assert ours_[1].startswith(theirs_[1].replace("LightningModule", "TaskModule")), (ours_[1], theirs_[1])


def test_configuration_validator_names_as_lightning():
    """Lightning's module-level functions, called directly (as its tests do), give the errors and warnings of a run."""
    from lightning.pytorch.trainer import configuration_validator as their_module

    from tasktrain.trainer import configuration_validator as our_module

    def case(module, lib, boring):
        seen = []
        calls = [("_verify_loop_configurations", "fit", lambda: boring.BoringModel()),
                 ("_verify_loop_configurations", "validate", lambda: _legacy(boring, "validation_epoch_end")()),
                 ("__verify_eval_loop_configuration", "test", lambda: _legacy(boring, "test_epoch_end")()),
                 ("__verify_eval_loop_configuration", "predict", lambda: _without(boring, "forward")),
                 ("__verify_train_val_loop_configuration", None, lambda: _without(boring, "validation_step")),
                 ("__verify_manual_optimization_support", None, lambda: _manual(boring))]
        for name, stage, build in calls:
            model = build()
            trainer = lib.Trainer(gradient_clip_val=0.5, **{k: v for k, v in QUIET.items() if k != "max_steps"})
            trainer.strategy.connect(model)
            model.trainer = trainer
            function = getattr(module, name)
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                try:
                    if name == "_verify_loop_configurations":
                        trainer.state.fn = stage
                        function(trainer)
                    elif name == "__verify_eval_loop_configuration":
                        function(model, stage)
                    else:
                        function(trainer, model)
                    outcome = None
                except Exception as error:  # noqa: BLE001
                    outcome = (type(error).__name__, str(error).split(" (")[0])
            seen.append((name, stage, outcome, [str(w.message) for w in record if "Skipping val loop" in
                                                str(w.message)]))
        return seen

    got = case(our_module, *LIBS["tasktrain"])
    assert got == [(name, stage, outcome and (outcome[0], outcome[1].replace("LightningModule", "TaskModule")), said)
                   for name, stage, outcome, said in case(their_module, *LIBS["lightning"])]
    assert got[0][2] is None and got[1][2][0] == "NotImplementedError" and got[3][2][0] == "MisconfigurationException"
    assert got[4][3] == ["You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop."]
    assert got[5][2][1].startswith("Automatic gradient clipping is not supported for manual optimization")
