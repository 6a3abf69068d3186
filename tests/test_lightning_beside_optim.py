"""The optimizer a module steps and what self.log records, beside Lightning itself: LightningOptimizer (what
self.optimizers() and optimizer_step get: the optimizer's own class, its step's arguments and result, LBFGS's
closure), and the keys of logged_metrics / callback_metrics / progress_bar_metrics under Lightning's rules."""
import warnings
from unittest import mock

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.core.optimizer import LightningOptimizer as TheirOptimizer  # noqa: E402
import lightning.pytorch.plugins as their_plugins  # noqa: E402
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.core.optimizer import LightningOptimizer as OurOptimizer  # noqa: E402
import tasktrain.plugins as our_plugins  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _manual_gan(classes, wrapper):
    """Two optimizers stepped by hand: the first with an extra step argument and a closure, the second every
    other batch; records what self.optimizers() gave and what step() returned."""

    class Gan(classes.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.seen = []

        def training_step(self, batch, batch_idx):
            first, second = self.optimizers()
            assert self.optimizers()[0] is first  # the same objects at every call
            assert isinstance(first, wrapper) and isinstance(first, torch.optim.SGD)

            def closure():
                loss = self.step(batch)
                first.zero_grad()
                self.manual_backward(loss)
                return loss

            out = first.step(closure=closure, foo="bar")
            self.seen.append((str(first).split(" ")[0], type(out).__name__))
            if batch_idx % 2 == 0:
                second.zero_grad()
                self.manual_backward(self.step(batch))
                second.step()

        def configure_optimizers(self):
            return [torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.Adam(self.layer.parameters())]

    return Gan()


def test_manual_optimizers_are_lightning_optimizers():
    results = []
    for lib, classes, wrapper in ((tasktrain, ours, OurOptimizer), (pl, theirs, TheirOptimizer)):
        model = _manual_gan(classes, wrapper)
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, logger=False, **QUIET)
        # the extra argument reaches SGD.step beside the closure, as Lightning passes them
        with mock.patch.object(torch.optim.SGD, "step", side_effect=lambda closure, **kw: closure()) as sgd_step:
            trainer.fit(model)
        results.append((model.seen, [c.kwargs.keys() for c in sgd_step.call_args_list], trainer.global_step))
    assert results[0] == results[1]
    assert results[0][0][0] == ("LightningSGD", "Tensor") and results[0][2] == 6


def _lbfgs_fit(lib, classes):
    lib.seed_everything(0, verbose=False)

    class Lbfgs(classes.BoringModel):
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), max_iter=4)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            self.returned = optimizer.step(closure=optimizer_closure)  # LBFGS calls the closure several times

    model = Lbfgs()
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False, **QUIET)
    with mock.patch.object(torch.optim.LBFGS, "zero_grad", autospec=True,
                           side_effect=torch.optim.Optimizer.zero_grad) as zero_grad:
        trainer.fit(model)
    return zero_grad.call_count, float(model.returned), model.layer.weight.detach().clone()


def test_lbfgs_gets_the_closure_in_automatic_optimization():
    mine, reference = _lbfgs_fit(tasktrain, ours), _lbfgs_fit(pl, theirs)
    assert mine[0] == reference[0] > 2  # the closure zeroes at each of LBFGS's calls
    assert mine[1] == pytest.approx(reference[1])
    torch.testing.assert_close(mine[2], reference[2])


def _logged(lib, classes, tmp_path):
    class Logs(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)["loss"]
            self.log("default", loss)
            self.log("l_se", loss, on_step=True, on_epoch=True)
            self.log("p_se", loss, on_step=True, on_epoch=True, prog_bar=True, logger=False)
            self.log("p_e", loss, on_step=False, on_epoch=True, prog_bar=True, logger=False)
            self.log("total", 2.0, on_epoch=True, reduce_fx="SUM", logger=True)
            return loss

    trainer = lib.Trainer(default_root_dir=tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=0,
                          log_every_n_steps=1, **QUIET)
    trainer.fit(Logs())
    kinds = {k: type(v).__name__ for k, v in trainer.logged_metrics.items()}
    return (kinds, sorted(trainer.callback_metrics), sorted(trainer.progress_bar_metrics),
            float(trainer.callback_metrics["total_epoch"]))


def test_self_log_keys_as_lightning(tmp_path):
    mine = _logged(tasktrain, ours, tmp_path / "ours")
    assert mine == _logged(pl, theirs, tmp_path / "theirs")
    assert "epoch" not in mine[0] and "p_se_step" in mine[2] and mine[3] == 4.0


def test_self_log_refusals_as_lightning():
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        for name, value, match in (("foo", {"a": 1}, "`self.log(foo, {'a': 1})` was called"),
                                   ("foo/dataloader_idx_0", 1.0, "`self.log` with the key `foo/dataloader_idx_0`")):
            class Bad(classes.BoringModel):
                def training_step(self, batch, batch_idx):
                    self.log(name, value)
                    return super().training_step(batch, batch_idx)

            trainer = lib.Trainer(max_steps=1, limit_val_batches=0, logger=False, **QUIET)
            with pytest.raises(Exception, match=match.replace("(", r"\(").replace(")", r"\)")):
                trainer.fit(Bad())


def test_schedulers_checked_only_in_automatic_optimization():
    class Custom:  # no LRScheduler: Lightning refuses it in automatic optimisation only
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        def module(automatic, scheduler):
            class Scheduled(classes.BoringModel):
                def __init__(self):
                    super().__init__()
                    self.automatic_optimization = automatic

                def configure_optimizers(self):
                    optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
                    return [optimizer], [scheduler(optimizer)]

            return Scheduled()

        def fit(model):
            lib.Trainer(max_epochs=0, logger=False, **QUIET).fit(model)

        fit(module(False, Custom))
        with pytest.raises(Exception, match="doesn't follow PyTorch's LRScheduler API"):
            fit(module(True, Custom))
        with pytest.raises(Exception, match="must include a monitor when a `ReduceLROnPlateau`"):
            fit(module(True, torch.optim.lr_scheduler.ReduceLROnPlateau))
        with pytest.raises(Exception, match='The "interval" key in lr scheduler dict must be "step" or "epoch"'):
            fit(module(True, lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "x"}))
        plateau = {"scheduler": None, "monitor": "loss", "interval": "step"}
        with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
            fit(module(False, lambda opt: {**plateau, "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)}))


def test_several_optimizers_in_automatic_optimization_are_lightnings_errors():
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class OldStyle(classes.BoringModel):
            def training_step(self, batch, batch_idx, optimizer_idx):
                return super().training_step(batch, batch_idx)

        with pytest.raises(RuntimeError, match="Remove the `optimizer_idx` argument from `training_step`"):
            lib.Trainer(max_steps=1, logger=False, **QUIET).fit(OldStyle())

        class TwoOptimizers(classes.BoringModel):
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)

        with pytest.raises(RuntimeError, match="multiple optimizers is only supported with manual optimization"):
            lib.Trainer(max_steps=1, logger=False, **QUIET).fit(TwoOptimizers())


def _sgd(module):
    return torch.optim.SGD(module.parameters(), lr=0.1)


class _NoState:  # a scheduler without state_dict / load_state_dict
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        pass


CONFIGS = {
    "none": lambda m: None,
    "unknown_optimizer_key": lambda m: {"optimizer": _sgd(m), "extra": 1},
    "optimizer_frequency": lambda m: {"optimizer": _sgd(m), "frequency": 2},  # Lightning 1.x's, gone in 2
    "unknown_scheduler_key": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "extra": 1}})(_sgd(m)),
    "one_cycle_by_epoch": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=10), "interval": "epoch"}})(_sgd(m)),
    "scheduler_without_state": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": _NoState(o)})(_sgd(m)),
    "plateau_metric_missing": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o), "monitor": "nope"}})(_sgd(m)),
    "plateau_metric_missing_not_strict": lambda m: (lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o), "monitor": "nope", "strict": False}})(_sgd(m)),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_configure_optimizers_outputs_warned_or_refused_as_lightning(config):
    """What Lightning warns about and leaves out (unknown keys, None: a fit without an optimizer), what it warns
    about and keeps (OneCycleLR by epoch, a missing metric with strict=False), and what it refuses."""
    import warnings

    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Model(classes.BoringModel):
            def configure_optimizers(self):
                return CONFIGS[config](self)

        model = Model()
        before = [p.detach().clone() for p in model.parameters()]
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False, **QUIET)
        error = None
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                trainer.fit(model)
            except Exception as err:  # noqa: BLE001 (the type and text are compared)
                error = (type(err).__name__, str(err).split(" (")[0])
        words = sorted({str(w.message) for w in said if w.category in (RuntimeWarning, UserWarning)
                        and any(k in str(w.message) for k in ("optimizer", "scheduler", "OneCycle", "ReduceLR"))})
        changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        seen[lib.__name__] = words, error, changed, trainer.global_step
    assert seen["tasktrain"] == seen["lightning.pytorch"], seen


@pytest.mark.parametrize("argument", [dict(gradient_clip_val=1.0), dict(accumulate_grad_batches=2)])
def test_manual_optimization_refuses_automatic_clipping_and_accumulation_as_lightning(argument):
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False, **QUIET,
                              **argument)
        with pytest.raises(Exception) as raised:
            trainer.fit(classes.ManualOptimBoringModel())
        seen[lib.__name__] = type(raised.value).__name__, str(raised.value).split(" (")[0]
    assert seen["tasktrain"] == seen["lightning.pytorch"], seen


def test_gradient_clip_algorithm_checked_as_lightning():
    for lib in (tasktrain, pl):
        with pytest.raises(Exception) as raised:
            lib.Trainer(gradient_clip_algorithm="foo", logger=False)
        assert (type(raised.value).__name__, str(raised.value)) == (
            "MisconfigurationException", "`gradient_clip_algorithm` foo is invalid. Allowed algorithms: ['value', "
            "'norm'].")
        lib.Trainer(gradient_clip_algorithm="NORM", logger=False)  # any case, clipping off or on
        lib.Trainer(gradient_clip_algorithm="Value", gradient_clip_val=0.5, logger=False)


@pytest.mark.parametrize("trainer_args,call_args,raises", [
    (dict(gradient_clip_val=1e-4), dict(gradient_clip_val=1e-2), True),
    (dict(gradient_clip_algorithm="norm"), dict(gradient_clip_algorithm="value"), True),
    (dict(gradient_clip_val=0.5, gradient_clip_algorithm="Value"), dict(gradient_clip_val=0.5,
                                                                      gradient_clip_algorithm="value"), False),
])
def test_clip_gradients_against_the_trainers_clipping_as_lightning(trainer_args, call_args, raises):
    """clip_gradients in configure_gradient_clipping with a value / algorithm other than the Trainer's: the same
    error as Lightning's (the same values: both clip); a module not attached: the same message."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Model(classes.BoringModel):
            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                self.clip_gradients(optimizer, **call_args)

        trainer = lib.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, logger=False, **QUIET,
                              **trainer_args)
        try:
            trainer.fit(Model())
            seen[lib.__name__] = None
        except Exception as err:
            seen[lib.__name__] = type(err).__name__, str(err)
        with pytest.raises(RuntimeError) as raised:
            classes.BoringModel().trainer  # noqa: B018
        seen[lib.__name__, "detached"] = str(raised.value).split(" (")[0]
    assert seen["tasktrain"] == seen["lightning.pytorch"], seen
    assert seen["tasktrain", "detached"] == seen["lightning.pytorch", "detached"], seen
    assert (seen["tasktrain"] is not None) == raises


class _CustomPlateau:  # a scheduler of the user's that watches a metric (no state_dict: checked only at a fit)
    def __init__(self, optimizer):
        self.optimizer = optimizer


def _private_helpers_seen(lib, classes, core):
    """Lightning's private helpers of lightning.pytorch.core.optimizer, called as scripts and Lightning's tests call
    them: what each returns, warns or raises."""
    import warnings

    def outcome(fn):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                result = fn()
            except Exception as err:  # noqa: BLE001 (the type and Lightning's words are compared)
                result = (type(err).__name__, str(err).split(" (")[0])
        return result, sorted(str(w.message) for w in said if w.category is RuntimeWarning)

    def configs(result):  # a config as its fields, the scheduler by class
        return [(type(c.scheduler).__name__, c.interval, c.frequency, c.reduce_on_plateau, c.monitor, c.strict,
                 c.name) for c in result]

    model = classes.BoringModel()
    model.trainer = lib.Trainer(logger=False, **QUIET)
    opt_a, opt_b = torch.optim.Adam(model.parameters()), torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.optim.lr_scheduler.StepLR(opt_a, 10)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt_a)
    seen = []
    forms = [opt_a, (opt_a, opt_b), ([opt_a], [step]), ([opt_a], step), {"optimizer": opt_a, "lr_scheduler": step},
             [{"optimizer": opt_a, "lr_scheduler": step}, {"optimizer": opt_b, "lr_scheduler": step}],
             {"optimizer": opt_a, "lr_scheduler": {"scheduler": step, "foo": 1}, "bar": 2},
             {"optimizer": opt_a, "lr_scheduler": _NoState(opt_a)}, {"optimizer": opt_a, "lr_scheduler": plateau}]
    for manual in (False, True):
        model.automatic_optimization = not manual
        for form in forms:
            model.configure_optimizers = lambda form=form: form
            result, said = outcome(lambda: core._init_optimizers_and_lr_schedulers(model))
            if isinstance(result, tuple) and isinstance(result[0], list):
                result = ([type(o).__name__ for o in result[0]], configs(result[1]))
            elif manual and "foo" in result[1]:  # an unknown scheduler key: refused by both (Lightning: a TypeError
                result = "refused"  # of its dataclass; tasktrain: a MisconfigurationException that names the key)
            seen.append((manual, result, said))
    seen.append(outcome(lambda: [type(o).__name__ for o in core._configure_optimizers(
        {"optimizer": opt_a, "lr_scheduler": step, "foo": 1})[0]]))
    for entry in ({"scheduler": torch.optim.lr_scheduler.OneCycleLR(opt_a, 0.1, total_steps=3)},
                  {"reduce_on_plateau": True, "scheduler": _CustomPlateau(opt_a), "monitor": "my_loss"},
                  {"reduce_on_plateau": True, "scheduler": _CustomPlateau(opt_a)},
                  {"scheduler": step, "interval": "batch"}, {"interval": "step"}):
        result, said = outcome(lambda entry=entry: core._configure_schedulers_automatic_opt([dict(entry)], None))
        seen.append((configs(result) if isinstance(result, list) else result, said))
    seen.append(outcome(lambda: configs(core._configure_schedulers_automatic_opt([plateau], "val_loss"))))
    seen.append(outcome(lambda: configs(core._configure_schedulers_manual_opt(
        [{"scheduler": plateau, "monitor": "x", "strict": False, "interval": "step"}]))))
    return seen


def test_lightning_private_optimizer_helpers_as_lightning():
    """_init_optimizers_and_lr_schedulers / _configure_optimizers / _configure_schedulers_automatic_opt /
    _configure_schedulers_manual_opt (tasktrain.core.optimizer) give Lightning's results, warnings and errors for
    every return form, automatic and manual."""
    import lightning.pytorch.core.optimizer as their_core

    import tasktrain.core.optimizer as our_core

    ours_seen = _private_helpers_seen(tasktrain, ours, our_core)
    theirs_seen = _private_helpers_seen(pl, theirs, their_core)
    assert len(ours_seen) == len(theirs_seen)
    for a, b in zip(ours_seen, theirs_seen):
        assert a == b
    assert ours_seen[2] == (False, (["Adam"], [("StepLR", "epoch", 1, False, None, True, None)]), [])
    assert ours_seen[1][1][0] == "RuntimeError"  # two optimizers under automatic optimisation


class _Forgetful:  # optimizer_step neither steps nor runs the closure
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        pass


class _BackwardInAutomatic:  # manual_backward under automatic optimisation
    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.manual_backward(loss)
        return loss


class _ClipAlgorithmUnknown:  # clip_gradients with an algorithm nobody has (no value: still checked)
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_algorithm="foo")


class _ClipValueNotANumber:
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val="0.5")


class _ClipArguments:  # what configure_gradient_clipping receives, and the Trainer's attribute
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.seen = (gradient_clip_val, type(gradient_clip_algorithm).__name__, str(gradient_clip_algorithm),
                     gradient_clip_algorithm == "VALUE", type(self.trainer.gradient_clip_algorithm).__name__)
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)


@pytest.mark.parametrize("mixin,trainer_args", [
    (_Forgetful, {}), (_BackwardInAutomatic, {}), (_ClipAlgorithmUnknown, {}), (_ClipValueNotANumber, {}),
    (_ClipArguments, dict(gradient_clip_val=0.5, gradient_clip_algorithm="Value")),
])
def test_optimization_hook_mistakes_and_arguments_as_lightning(mixin, trainer_args):
    """A module's optimization hooks used wrongly: Lightning's exception type and words (ours may add a hint in
    parentheses); used rightly: the arguments Lightning gives (the clipping algorithm as its enum)."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        model = type("Model", (mixin, classes.BoringModel), {})()
        trainer = lib.Trainer(max_steps=2, limit_val_batches=0, logger=False, **QUIET, **trainer_args)
        try:
            trainer.fit(model)
            seen[lib.__name__] = getattr(model, "seen", None), trainer.global_step
        except Exception as err:  # noqa: BLE001 (the type and Lightning's words are compared)
            seen[lib.__name__] = type(err).__name__, str(err).split(" (")[0]
    assert seen["tasktrain"] == seen["lightning.pytorch"], seen
    if mixin is _ClipArguments:  # (the hook ran: the enum, equal to "VALUE" in any case, the Trainer's too)
        assert seen["tasktrain"] == ((0.5, "GradClipAlgorithmType", "GradClipAlgorithmType.VALUE", True,
                                      "GradClipAlgorithmType"), 2)
    else:
        assert seen["tasktrain"][0] in ("MisconfigurationException", "TypeError")


def test_manual_steps_count_only_inside_training_step_as_lightning():
    """Manual optimisation: an opt.step() in training_step counts in global_step; one in on_train_epoch_end (the
    gradients the epoch accumulated) steps the weights but is not counted, as in Lightning."""
    seen = {}
    for lib, classes in ((tasktrain, ours), (pl, theirs)):
        class Model(classes.BoringModel):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.steps = []

            def training_step(self, batch, batch_idx):
                if batch_idx == 0:
                    self.optimizers().zero_grad()
                    self.manual_backward(self.step(batch))
                    self.optimizers().step()  # counted
                self.manual_backward(self.step(batch))

            def on_train_epoch_end(self):
                before = self.layer.weight.detach().clone()
                self.optimizers().step()  # not counted
                self.optimizers().zero_grad()
                self.steps.append((self.trainer.global_step, not torch.equal(before, self.layer.weight)))

        model = Model()
        trainer = lib.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=0, logger=False, **QUIET)
        trainer.fit(model)
        seen[lib.__name__] = model.steps, trainer.global_step
    assert seen["tasktrain"] == seen["lightning.pytorch"] == ([(1, True), (2, True)], 2), seen


def _manual_clip_weights(lib, algorithm, hooked):
    """3 manual steps under fp16 AMP on the CPU (MixedPrecision("16-mixed", "cpu"): Lightning's Trainer runs
    precision="16-mixed" as bf16 there) with self.clip_gradients before opt.step(); `hooked`: a precision subclass
    overriding a step hook (Lightning's step hooks run the step)."""
    plugins = (their_plugins if lib is pl else our_plugins)
    boring = theirs if lib is pl else ours

    class Hooked(plugins.MixedPrecision):
        def pre_backward(self, tensor, module):
            return super().pre_backward(tensor, module)

    class Manual(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.step(batch) * 1e-4)  # (small: the scaled fp16 gradients stay finite)
            self.clip_gradients(opt, gradient_clip_val=0.5 if algorithm == "norm" else 1e-3,
                                gradient_clip_algorithm=algorithm)
            opt.step()

    torch.manual_seed(0)
    model = Manual()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (fp16 on a CPU: tasktrain warns that it is slow)
        lib.Trainer(max_steps=3, limit_val_batches=0, logger=False, accelerator="cpu", devices=1,
                    plugins=[(Hooked if hooked else plugins.MixedPrecision)("16-mixed", "cpu")], **QUIET).fit(
            model, torch.utils.data.DataLoader(boring.RandomDataset(32, 64), batch_size=4))
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("algorithm,hooked", [("norm", False), ("value", False), ("norm", True)])
def test_manual_clip_gradients_under_fp16_clips_the_scaled_gradients_as_lightning(algorithm, hooked):
    """Lightning's MixedPrecision.clip_gradients clips the gradients as they are: in manual optimisation, before
    opt.step() unscales them, the scaled ones (the true gradients end up clipped to the value / the loss scale).
    tasktrain unscaled first; now the weights after 3 steps are Lightning's."""
    ours_, theirs_ = _manual_clip_weights(tasktrain, algorithm, hooked), _manual_clip_weights(pl, algorithm, hooked)
    for mine, lightning in zip(ours_, theirs_):
        torch.testing.assert_close(mine, lightning, rtol=0, atol=0)
