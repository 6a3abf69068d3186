"""is_overridden beside Lightning 2.6's (issue 37): the same answer on the same kinds of objects (hooks set on the
instance as functools.partial, update_wrapper / wraps wrappers, Mocks), and a fit where hooks set on the instance
that way are called where Lightning calls them (Lightning calls every hook, whatever is_overridden says)."""
import functools
import warnings
from unittest import mock

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402
from lightning.pytorch.utilities.model_helpers import is_overridden as lightning_is_overridden  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402
from tasktrain.utilities import is_overridden  # noqa: E402

FRAMEWORKS = {"tasktrain": (is_overridden, tasktrain), "lightning": (lightning_is_overridden, pl)}


def _record(*args, **kwargs):
    return None


class _Callable:
    def __call__(self, *args):
        return None


# name -> (does the class override the hook, what is set on the instance in its place (None: nothing))
CASES = {
    "the base's": (False, None),
    "an override": (True, None),
    "None": (False, lambda hook: None),
    "partial(base's)": (False, lambda hook: functools.partial(hook)),
    "partial(override)": (True, lambda hook: functools.partial(hook)),
    "partial(function)": (False, lambda hook: functools.partial(_record, "name")),
    "update_wrapper(partial(function), base's)": (
        False, lambda hook: functools.update_wrapper(functools.partial(_record, "name"), hook)),
    "update_wrapper(partial(function), override)": (
        True, lambda hook: functools.update_wrapper(functools.partial(_record, "name"), hook)),
    "wraps(base's)(function)": (False, lambda hook: functools.wraps(hook)(lambda *a: hook(*a))),
    "wraps(wraps(base's)(function))(function)": (
        False, lambda hook: functools.wraps(functools.wraps(hook)(lambda *a: None))(lambda *a: None)),
    "wraps(base's)(partial(function))": (False, lambda hook: functools.wraps(hook)(functools.partial(_record))),
    "Mock()": (False, lambda hook: mock.Mock()),
    "MagicMock()": (False, lambda hook: mock.MagicMock()),
    "Mock(wraps=base's)": (False, lambda hook: mock.Mock(wraps=hook)),
    "Mock(wraps=override)": (True, lambda hook: mock.Mock(wraps=hook)),
    "lambda": (False, lambda hook: (lambda *a: None)),
}
# Lightning's is_overridden fails with AttributeError where what is left after one wrapper has no code (a Lightning bug,
# docs/lightning.md): tasktrain follows the wrappers to what they wrap
LIGHTNING_FAILS = {
    "Mock(wraps=partial(override))": (True, lambda hook: mock.Mock(wraps=functools.partial(hook)), True),
    "Mock(wraps=partial(base's))": (False, lambda hook: mock.Mock(wraps=functools.partial(hook)), False),
    "Mock(wraps=Mock(wraps=override))": (True, lambda hook: mock.Mock(wraps=mock.Mock(wraps=hook)), True),
    "a callable object": (False, lambda hook: _Callable(), True),
}


def _objects(lib, classes, overrides, replace, kind):
    """A module, a DataModule and a callback, the hook (on_train_start, prepare_data, on_fit_end) overridden by the
    class or not, and `replace(hook)` set on the instance."""
    if kind == "module":
        base, name = classes.BoringModel, "on_train_start"
    elif kind == "datamodule":
        base, name = classes.BoringDataModule, "prepare_data"
    else:
        base, name = lib.Callback, "on_fit_end"
    cls = type("Own", (base,), {name: lambda self, *a: None}) if overrides else base
    obj = cls()
    if replace is not None:
        setattr(obj, name, replace(getattr(obj, name)))
    return name, obj


def _answer(fn, name, obj, *base):
    try:
        return fn(name, obj, *base)
    except Exception as error:  # noqa: BLE001 (the exception is the answer)
        return type(error).__name__


@pytest.mark.parametrize("kind", ["module", "datamodule", "callback"])
def test_is_overridden_answers_as_lightnings(kind):
    for case, (overrides, replace) in CASES.items():
        answers = {}
        for framework, (fn, lib) in FRAMEWORKS.items():
            classes = ours if lib is tasktrain else theirs
            answers[framework] = _answer(fn, *_objects(lib, classes, overrides, replace, kind))
        assert answers["tasktrain"] == answers["lightning"], (kind, case, answers)
        assert isinstance(answers["tasktrain"], bool)
    for case, (overrides, replace, expected) in LIGHTNING_FAILS.items():
        assert _answer(lightning_is_overridden, *_objects(pl, theirs, overrides, replace, kind)) == "AttributeError"
        assert _answer(is_overridden, *_objects(tasktrain, ours, overrides, replace, kind)) is expected, case


def test_the_edges_answer_as_lightnings():
    class Extra(ours.BoringModel):
        def extra_hook(self):
            pass

    class LightningExtra(theirs.BoringModel):
        def extra_hook(self):
            pass

    # a name the base does not define: ValueError; absent on the object too: False; no object: False
    assert _answer(is_overridden, "extra_hook", Extra(), tasktrain.TaskModule) == \
        _answer(lightning_is_overridden, "extra_hook", LightningExtra(), pl.LightningModule) == "ValueError"
    assert is_overridden("nothing", Extra()) is lightning_is_overridden("nothing", LightningExtra()) is False
    assert is_overridden("on_train_start", None) is lightning_is_overridden("on_train_start", None) is False
    with pytest.raises(ValueError):
        is_overridden("forward", torch.nn.Linear(1, 1))
    with pytest.raises(ValueError):
        lightning_is_overridden("forward", torch.nn.Linear(1, 1))
    # Mock(spec=Callback): a Mock wrapping nothing is no override (Lightning still calls its hooks: below)
    assert is_overridden("on_fit_start", mock.Mock(spec=tasktrain.Callback)) is \
        lightning_is_overridden("on_fit_start", mock.Mock(spec=pl.Callback)) is False


def _fit_with_hooks_set_on_instances(lib, classes):
    calls = []

    def record(name, *args):
        calls.append(name)

    class Net(classes.BoringModel):
        def __init__(self):
            super().__init__()
            for name in ("on_train_epoch_start", "on_validation_epoch_end"):  # a partial: an override
                setattr(self, name, functools.partial(record, name))
            for name in ("on_train_batch_end", "on_before_batch_transfer"):  # a recording wrapper around the base's
                hook = getattr(self, name)
                wrapper = functools.partial(lambda name, fn, *a: record(name) or fn(*a), name, hook)
                setattr(self, name, functools.update_wrapper(wrapper, hook))
            self.optimizer_zero_grad = mock.Mock(wraps=self.optimizer_zero_grad)  # a Mock around the base's
            self.on_validation_model_zero_grad = functools.wraps(self.on_validation_model_zero_grad)(
                functools.partial(record, "on_validation_model_zero_grad"))

    callback = lib.Callback()
    callback.on_train_start = functools.partial(record, "callback.on_train_start")
    hook = callback.on_train_end
    callback.on_train_end = functools.update_wrapper(
        functools.partial(lambda fn, *a: record("callback.on_train_end") or fn(*a), hook), hook)
    spec = mock.Mock(spec=lib.Callback)
    lib.seed_everything(1, verbose=False)
    model = Net()
    trainer = lib.Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, accumulate_grad_batches=1,
                          callbacks=[callback, spec], logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
    return dict(calls=calls, zero_grads=model.optimizer_zero_grad.call_count,
                spec=[name for name, *_ in spec.method_calls], weight=model.layer.weight.detach().clone())


def test_hooks_set_on_the_instance_are_called_as_lightning_calls_them():
    mine = _fit_with_hooks_set_on_instances(tasktrain, ours)
    lightning = _fit_with_hooks_set_on_instances(pl, theirs)
    assert mine["calls"] == lightning["calls"]
    for name, count in (("on_train_epoch_start", 2), ("on_validation_epoch_end", 2), ("on_train_batch_end", 6),
                        ("on_before_batch_transfer", 10), ("on_validation_model_zero_grad", 2),
                        ("callback.on_train_start", 1), ("callback.on_train_end", 1)):
        assert mine["calls"].count(name) == count, name
    assert mine["zero_grads"] == lightning["zero_grads"] == 6
    # every hook of a Mock(spec=Callback) is called, in Lightning's order
    assert mine["spec"] == lightning["spec"] and "on_train_batch_end" in mine["spec"]
    torch.testing.assert_close(mine["weight"], lightning["weight"])
