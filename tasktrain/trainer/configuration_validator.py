"""Lightning's module path `lightning.pytorch.trainer.configuration_validator`: its checks of a module before a run,
under its names and signatures, each the rule the Trainer's entry points apply (trainer.py: check_fit_configuration,
check_eval_configuration, the manual-optimisation and unused-validation checks), so that the errors and warnings are
the ones a run gives. The entry points apply those rules directly, not through these names: a patch of a name here
is not seen by a run (Lightning's test_cli patches __verify_train_val_loop_configuration to count the calls).

    _verify_loop_configurations(trainer)                  the checks of trainer.state.fn's stage on its module
    __verify_train_val_loop_configuration(trainer, model) fit's: training_step, configure_optimizers, the notes on an
                                                          unused validation, no Lightning 1.x epoch-end hooks
    __verify_eval_loop_configuration(model, stage)        "val", "test", "predict"
    __verify_manual_optimization_support(trainer, model)  no gradient_clip_val / accumulate_grad_batches under manual
                                                          optimisation
"""
from tasktrain.trainer import trainer as _trainer
from tasktrain.trainer.states import TrainerFn

_EVAL_STAGES = {"val": "validate", "test": "test", "predict": "predict"}


def _verify_loop_configurations(trainer):
    """The checks of the stage trainer.state.fn names on trainer.lightning_module (Lightning's)."""
    model, fn = trainer.lightning_module, trainer.state.fn
    if fn is None:
        raise ValueError("Unexpected: Trainer state fn must be set before validating loop configuration.")
    if fn == TrainerFn.FITTING:
        __verify_train_val_loop_configuration(trainer, model)
        __verify_manual_optimization_support(trainer, model)
    else:
        __verify_eval_loop_configuration(model, {TrainerFn.VALIDATING: "val", TrainerFn.TESTING: "test",
                                                 TrainerFn.PREDICTING: "predict"}[TrainerFn(fn)])


def __verify_train_val_loop_configuration(trainer, model):
    _trainer.check_fit_configuration(model)
    # (Lightning's rule for "has a validation loader": the fit's validation source defines one)
    _trainer.warn_unused_validation(model, trainer.fit_loop.epoch_loop.val_loop._data_source.is_defined(),
                                    stacklevel=3)


def __verify_eval_loop_configuration(model, stage):
    if stage not in _EVAL_STAGES:
        raise ValueError(f"__verify_eval_loop_configuration(model, {stage!r}): the stage is one of "
                         f"{', '.join(map(repr, _EVAL_STAGES))}.")
    _trainer.check_eval_configuration(model, _EVAL_STAGES[stage])


def __verify_manual_optimization_support(trainer, model):
    if not model.automatic_optimization:
        _trainer._check_manual_optimization(model, trainer.gradient_clip_val, trainer.accumulate_grad_batches)
