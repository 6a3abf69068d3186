"""Gradient accumulation beside Lightning 2.6 (issue 37): an epoch whose last window is cut short by its end
divides that window's losses by accumulate_grad_batches, as every window's (Lightning's closure normalises by it
always), with a plain factor and with a GradientAccumulationScheduler. The same weights, steps and
on_train_batch_end losses under both frameworks."""
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
        def on_train_batch_end(self, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))  # (Lightning's: the micro-batch's loss / accumulate_grad_batches)

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
    assert my_losses == pytest.approx(their_losses, rel=1e-6, abs=0)
    for (name, a), (_, b) in zip(mine.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
