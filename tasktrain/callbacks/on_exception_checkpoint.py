"""OnExceptionCheckpoint: save a checkpoint when training fails, so the work done is not lost.

    Trainer(callbacks=[OnExceptionCheckpoint(dirpath="checkpoints")])   # -> checkpoints/on_exception.ckpt

    OnExceptionCheckpoint(dirpath, filename="on_exception")

As in Lightning, any exception in fit, validate, test or predict (KeyboardInterrupt and SystemExit included) is
saved: a full checkpoint (resume with `trainer.fit(..., ckpt_path="checkpoints/on_exception.ckpt")`) holding the
state at the failure, i.e. after the last completed optimizer step and whatever the failing batch changed before it
raised. A run (of any stage) that ends well removes the file a previous failure left, so an old failure is not
resumed by mistake. `dirpath` is kept as given; an empty `filename` is a ValueError.

Under strategy="ddp_spawn" the spawned process that trained saves it (tasktrain calls on_exception there, where the
run's state is); the parent, whose on_exception Lightning calls too, writes nothing for the spawned run's failure (Lightning's
parent, the only one it calls, writes the parent's untrained weights at global step 0: docs/lightning.md); an error
in the parent before any process starts (a second fit refused) saves the parent's weights, as Lightning's.

On several processes it refuses to start: a checkpoint needs every rank (rank 0 writes, all gather the RNG states,
sharded engines write a shard each), and an error on one rank cannot bring the others to that save: Lightning's
save waits in a barrier the other ranks never reach and the original error is never shown (Lightning issue #20187,
docs/lightning.md). There, bound the work lost with ModelCheckpoint(every_n_train_steps=N, save_last=True); SIGTERM
with ModelCheckpoint(save_on_exception=True), which every rank reaches together (docs/lightning.md#sigterm).
"""
import os
from typing import Union

from tasktrain.callbacks.base import Checkpoint
from tasktrain.strategies.spawn import ProcessExitedException, ProcessRaisedException


class OnExceptionCheckpoint(Checkpoint):
    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: Union[str, os.PathLike], filename: str = "on_exception") -> None:
        if not filename:
            raise ValueError("The filename cannot be empty: OnExceptionCheckpoint(filename='') needs a file name "
                             "(without the extension).")
        # fixed at construction: an error can happen before any set-up could work a directory out
        self.dirpath = dirpath
        self.filename = filename
        self._failed = False

    @property
    def ckpt_path(self):
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def setup(self, trainer, pl_module, stage):
        self._failed = False
        if trainer.world_size > 1:
            self._failed = None  # (refused: the on_exception of this very error has nothing to save)
            raise ValueError(
                f"OnExceptionCheckpoint saves on one process only; this run has {trainer.world_size}. A checkpoint "
                "needs every rank, and an error on one rank cannot bring the others to the save. Remove it, and "
                "bound the work lost with ModelCheckpoint(every_n_train_steps=N, save_last=True) instead."
            )

    def on_exception(self, trainer, *args, **kwargs):
        if self._failed is None:
            return
        # Lightning's signature (trainer, *_, **__); the Trainer passes (trainer, pl_module, exception)
        exception = args[1] if len(args) > 1 else kwargs.get("exception")
        if isinstance(exception, (ProcessRaisedException, ProcessExitedException)):
            # the parent of a ddp_spawn run (only its launcher raises these two): the run's state is in the spawned
            # process, whose on_exception saved it (on one device; on several this callback refuses to start);
            # Lightning's parent saves its own weights, untrained ones, at global step 0, over the same file
            return
        self._failed = True
        if trainer.save_checkpoint(self.ckpt_path) is False:  # issue 38: a non-finite state is not saved
            return
        failure = type(exception).__name__ if exception is not None else "a failure"
        print(f"[tasktrain] OnExceptionCheckpoint: {failure} at global step {trainer.global_step}; saved "
              f"{self.ckpt_path}", flush=True)

    def teardown(self, trainer, *args, **kwargs):
        if not self._failed and os.path.exists(self.ckpt_path):
            trainer.strategy.remove_checkpoint(self.ckpt_path)
