"""A training_step whose loss is not one number, beside Lightning 2.6 (issue 37): under automatic optimization
Lightning passes it on to backward (on_before_backward sees it), where torch refuses it with its RuntimeError;
a loss of one element in any shape trains, and so does one the module's own backward reduces. The same under
tasktrain: the exception, the hooks called before it,
the weights after."""
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
         "on_before_optimizer_step", "on_train_batch_end", "on_exception")


def _fit(lib, classes, returns, accumulate):
    calls = []

    def recorder(name):
        def hook(self, trainer, module, *args):
            shape = tuple(args[0].shape) if name == "on_before_backward" else None
            calls.append((name, shape) if shape is not None else name)
        return hook

    Recorder = type("Recorder", (lib.Callback,), {name: recorder(name) for name in HOOKS})

    class Shaped(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            out = self(batch)  # (1, 2): the BoringModel's batch of 1 through its Linear(32, 2)
            loss = {"vector": out.sum(0), "matrix": out, "empty": out[:0].sum(1), "one": out.sum().reshape(1, 1),
                    "nan": out.sum(0) * (float("nan") if batch_idx == 2 else 1.0)}[
                returns.removesuffix("-dict").removesuffix("-own-backward")]
            return {"loss": loss, "extra": 1} if returns.endswith("-dict") else loss

        def backward(self, loss, *args, **kwargs):  # (a module's own backward may take such a loss)
            (loss.sum() if returns.endswith("-own-backward") else loss).backward(*args, **kwargs)

    lib.seed_everything(5, verbose=False)
    model = Shaped()
    before = model.layer.weight.detach().clone()
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, accumulate_grad_batches=accumulate,
                          callbacks=[Recorder()], **QUIET)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
        raised = None
    except Exception as error:  # noqa: BLE001 (the exception is the result)
        raised = (type(error).__name__, str(error))
    changed = not torch.equal(before, model.layer.weight)
    return raised, calls, changed, model.layer.weight.detach().clone()


@pytest.mark.parametrize("returns", ["vector", "matrix-dict", "empty", "one", "one-dict", "vector-own-backward"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_loss_of_several_elements_fails_in_backward_as_under_lightning(returns, accumulate):
    mine = _fit(tasktrain, ours, returns, accumulate)
    lightning = _fit(pl, theirs, returns, accumulate)
    assert mine[:3] == lightning[:3]
    torch.testing.assert_close(mine[3], lightning[3])
    if returns.startswith("one") or returns.endswith("own-backward"):
        assert mine[0] is None and mine[2]
    else:
        assert mine[0] == ("RuntimeError", "grad can be implicitly created only for scalar outputs")
        assert not mine[2] and mine[1][-1] == "on_exception"
        assert ("on_before_backward", {"vector": (2,), "matrix-dict": (1, 2), "empty": (0,)}[returns]) in mine[1]


def test_a_non_finite_loss_of_several_elements_is_caught_where_a_scalar_one_is():
    """tasktrain's own check (Lightning has none): a loss the module's backward reduces is looked at element-wise."""
    raised = _fit(tasktrain, ours, "nan-own-backward", 1)[0]
    assert raised[0] == "FloatingPointError" and raised[1].startswith("The training loss became nan at epoch 0, batch 2")


def _predict_none_warnings(lib, classes):
    class Model(classes.BoringModel):
        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return None if batch_idx % 2 else super().predict_step(batch, batch_idx)

    trainer = lib.Trainer(**QUIET, accelerator="cpu", devices=1, limit_predict_batches=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [trainer.predict(Model(), classes.BoringDataModule()) for _ in range(2)]
    said = [str(w.message) for w in caught if "predict returned None" in str(w.message)]
    return said, [[r is None for r in run] for run in results]


def test_a_predict_step_returning_none_warns_once_as_under_lightning():
    theirs_out, ours_out = _predict_none_warnings(pl, theirs), _predict_none_warnings(tasktrain, ours)
    assert ours_out == theirs_out and len(ours_out[0]) == 1
