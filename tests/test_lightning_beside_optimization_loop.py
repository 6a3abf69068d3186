"""The automatic optimisation loop beside Lightning 2.6 (issue 37).

- Gradient accumulation: an epoch whose last window is cut short by its end divides that window's losses by
  accumulate_grad_batches, as every window's (Lightning's closure normalises by it always), with a plain factor and
  with a GradientAccumulationScheduler: the same weights, steps and on_train_batch_end losses.
- A training_step loss that requires no grad (a constant, a detached loss) goes on to backward, where torch's
  RuntimeError stops the fit after on_before_backward, as under Lightning.
- on_validation_model_zero_grad before each validation in fit, under manual optimisation too: its default's
  module.zero_grad() drops the gradients a manual training_step accumulates across the validation."""
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _fit(lib, classes, batches, accumulate=None, schedule=None):
    losses = []

    class Recorded(classes.BoringModel):
        def on_before_backward(self, loss):
            losses.append(("on_before_backward", float(loss)))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            # (Lightning's: the micro-batch's loss / accumulate_grad_batches)
            losses.append(("on_train_batch_end", float(outputs["loss"])))

    lib.seed_everything(7, verbose=False)
    model = Recorded()
    kwargs = dict(accumulate_grad_batches=accumulate) if schedule is None else dict(
        callbacks=[lib.callbacks.GradientAccumulationScheduler(schedule)])
    trainer = lib.Trainer(max_epochs=2, limit_train_batches=batches, limit_val_batches=0, **kwargs, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
    return model, trainer.global_step, losses


@pytest.mark.parametrize("batches, accumulate, schedule, steps", [
    (3, 2, None, 4),  # windows 2, 1 each epoch
    (4, 3, None, 4),  # windows 3, 1
    (4, None, {0: 2, 1: 3}, 4),  # epoch 0: 2, 2; epoch 1: 3, 1
])
def test_a_window_the_epoch_cuts_short_steps_as_under_lightning(batches, accumulate, schedule, steps):
    mine, my_steps, my_losses = _fit(tasktrain, ours, batches, accumulate, schedule)
    reference, their_steps, their_losses = _fit(pl, theirs, batches, accumulate, schedule)
    assert my_steps == their_steps == steps
    # what on_before_backward and on_train_batch_end see, in order
    assert [kind for kind, _ in my_losses] == [kind for kind, _ in their_losses]
    assert [v for _, v in my_losses] == pytest.approx([v for _, v in their_losses], rel=1e-6, abs=0)
    for (name, a), (_, b) in zip(mine.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
         "on_before_optimizer_step", "on_train_batch_end", "on_exception")


def _fit_no_grad_loss(lib, classes, returns, accumulate):
    calls = []

    def recorder(name):
        def hook(self, trainer, module, *args):
            calls.append(name)
        return hook

    Recorder = type("Recorder", (lib.Callback,), {name: recorder(name) for name in HOOKS})

    class NoGrad(classes.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            if batch_idx < 1:
                return out
            return {"constant": torch.tensor(1.0), "detached": out["loss"].detach(),
                    "detached-dict": {"loss": out["loss"].detach(), "extra": 1}}[returns]

    lib.seed_everything(3, verbose=False)
    model = NoGrad()
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, accumulate_grad_batches=accumulate,
                          callbacks=[Recorder()], **QUIET)
    with warnings.catch_warnings(), pytest.raises(RuntimeError) as raised:
        warnings.simplefilter("ignore")
        trainer.fit(model)
    return type(raised.value), str(raised.value), calls, model.layer.weight.detach().clone()


@pytest.mark.parametrize("returns", ["constant", "detached", "detached-dict"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_loss_that_requires_no_grad_fails_in_backward_as_under_lightning(returns, accumulate):
    mine = _fit_no_grad_loss(tasktrain, ours, returns, accumulate)
    lightning = _fit_no_grad_loss(pl, theirs, returns, accumulate)
    assert mine[:3] == lightning[:3]
    assert mine[0] is RuntimeError and mine[1].startswith("element 0 of tensors does not require grad")
    # batch 1: its zero_grad where it opens a window, on_before_backward, then the error (no on_after_backward)
    assert mine[2][-3:] == (["on_before_zero_grad", "on_before_backward", "on_exception"] if accumulate == 1 else
                            ["on_train_batch_start", "on_before_backward", "on_exception"])
    torch.testing.assert_close(mine[3], lightning[3])


def _fit_manual_across_validation(lib, classes, override):
    seen = []

    class Accumulating(classes.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            self.manual_backward(self.step(batch))
            if batch_idx % 2 == 1:  # steps every second batch: a validation runs between the two backwards
                opt.step()
                opt.zero_grad()

        def on_validation_start(self):
            seen.append(("validation", self.trainer.global_step, self.layer.weight.grad is None))

        if override:
            def on_validation_model_zero_grad(self):
                seen.append("zero_grad hook")
                super().on_validation_model_zero_grad()

    lib.seed_everything(3, verbose=False)
    model = Accumulating()
    trainer = lib.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=1, val_check_interval=1,
                          num_sanity_val_steps=0, **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
    return seen, model.layer.weight.detach().clone()


@pytest.mark.parametrize("override", [False, True])
def test_manual_optimisation_gradients_are_cleared_before_validation_as_under_lightning(override):
    (seen, weight), (their_seen, their_weight) = (_fit_manual_across_validation(tasktrain, ours, override),
                                                  _fit_manual_across_validation(pl, theirs, override))
    assert seen == their_seen
    assert [entry for entry in seen if entry != "zero_grad hook"] == [
        ("validation", 0, True), ("validation", 1, True), ("validation", 1, True), ("validation", 2, True)]
    torch.testing.assert_close(weight, their_weight)
