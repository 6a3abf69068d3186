from dataclasses import asdict, dataclass, field
from typing import Optional

from tasktrain.trainer.states import RunningStage, TrainerFn, TrainerStatus

# where the Trainer is now, not where training is (Lightning's TrainerState fields): not saved in checkpoints
_RUN_ONLY = ("status", "fn", "stage", "stepping_batch")


@dataclass
class TrainState:
    """Where training is. Everything a resume needs to put the loop back at the same place, on any number of
    processes. It is also Lightning's `trainer.state` (TrainerState): `status`, `fn`, `stage`, `finished`,
    `stopped`, which a checkpoint does not keep."""

    epoch: int = 0  # the epoch being trained (0-based)
    global_step: int = 0  # optimizer steps taken
    # Lightning's logging step (fit_loop.epoch_loop._batches_that_stepped): training batches that ended with an
    # optimizer step (once per batch, whatever the number of optimizers or of their steps), counted after the batch
    # (its on_train_batch_end, step logs and validation see the count before it)
    batches_that_stepped: int = 0
    batch_in_epoch: int = 0  # loop batches of `epoch` already trained on, in this run's numbering
    # Positions of the epoch's global order (a function of data_seed and epoch over the whole dataset) already
    # trained on by all ranks together: a resume on any number of processes skips exactly these.
    samples_in_epoch: int = 0
    # the batch index this epoch's data began again from its loader's first batch at (a fit resumed from a checkpoint
    # Lightning saved inside an epoch, over a loader without a state: Lightning's restart reads the loader from its
    # start while its batch indices go on; resume.from_lightnings_loops); 0 otherwise. Saved: a checkpoint written
    # later in that epoch goes on with the data actually read
    data_from_batch: int = 0
    global_batch_size: int = 0  # samples per optimizer step over all ranks (micro x world x accumulation); 0: unknown
    data_seed: int = 0  # the data order is a function of (data_seed, epoch)
    epoch_finished: bool = False  # the epoch's end (validation, schedulers, hooks) already ran
    # the epoch-end validation ran (a checkpoint saved at its on_validation_end: the resume runs the rest of the end)
    epoch_validated: bool = False
    # the epoch's on_train_epoch_start ran (Lightning's epoch progress "ready"): a checkpoint saved there, before the
    # epoch's first batch, is Lightning's restart on the epoch's start, which runs no sanity check
    epoch_started: bool = False
    stepping_batch: bool = False  # a batch that stepped is being finished: not yet in batches_that_stepped
    # Lightning's training batch_progress (read through trainer.fit_loop.epoch_loop, lightning_loops.py), kept over
    # epochs, fits and resumes as Lightning's `total`: the batches taken (from before their on_train_batch_start on),
    # those of them whose on_train_batch_start returned -1 (Lightning never counts those started nor completed), the
    # count where the epoch's own (`current`) began (after its on_train_epoch_start: until then `current` is the
    # epoch before's) and whether -1 ended that epoch
    batches_taken: int = 0
    batches_cut: int = 0
    epoch_batches_from: int = 0
    epoch_cut: bool = False
    # how far the batch being trained got: "ready" (taken: its on_train_batch_start), "started" (training_step,
    # backward, step), "processed" (its on_train_batch_end), None once completed. Saved: a checkpoint written in
    # on_train_batch_end holds its batch not completed until the resumed loop goes on ("restored": Lightning's restart)
    batch_phase: Optional[str] = None
    # the batch such a checkpoint (or one saved in the validation after a batch) was saved in ended an accumulation
    # window (it stepped): its batches_that_stepped counts that batch, Lightning's only once its restarted loop goes
    # on (written by state_dict and run_state; loaded, it stands until the resumed loop goes on)
    saved_in_stepping_batch: bool = False
    # the same for Lightning's optim_progress and scheduler_progress: zero_grad calls and lr scheduler steps over the
    # run, and where the epoch's own counts began (optimizer steps are global_step)
    zero_grads: int = 0
    scheduler_steps: int = 0
    epoch_steps_from: int = 0
    epoch_zero_grads_from: int = 0
    epoch_scheduler_steps_from: int = 0
    # evaluation batches completed (Lightning's batch_progress of fit's val_loop, validate_loop and test_loop, which
    # its checkpoints keep too): {loop: [total, in its last run]}; fit's total counts the training epoch's (from
    # after its on_train_epoch_start, and after the sanity check, which counts its own)
    eval_batches: dict = field(default_factory=lambda: {"val": [0, 0], "validate": [0, 0], "test": [0, 0]})
    # their batch_progress.is_last_batch: the last batch of the run's last loader was taken (saved, as Lightning's)
    eval_is_last_batch: dict = field(default_factory=lambda: {"val": False, "validate": False, "test": False})
    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: Optional[TrainerFn] = None  # the entry point: "fit", "validate", "test", "predict"
    stage: Optional[RunningStage] = None  # the loop running now: "train", "sanity_check", "validate", ...
    # the training batch being run is its epoch's last (Lightning's trainer.is_last_batch); kept until the next epoch's
    # first batch, and saved: a fit resumed from an epoch's end reads True until then, as Lightning's
    is_last_batch: bool = False

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:  # (Lightning's: the run ended, finished or interrupted)
        return self.status.stopped

    def start_fit(self, data_seed, stopped_inside_epoch=False):
        """A fit of a used Trainer goes on from these counters, as Lightning's fit loop keeps its progress between
        fits: an epoch the last fit stopped inside (or whose end it ran) counts as done, and this fit starts the next
        epoch at its first batch (Lightning starts a new epoch too; only a checkpoint's position resumes inside one).
        The data order follows the seed this fit draws."""
        if stopped_inside_epoch or self.epoch_finished:
            self.epoch += 1
        self.batch_in_epoch = self.samples_in_epoch = self.global_batch_size = self.data_from_batch = 0
        self.epoch_finished = self.stepping_batch = self.epoch_started = False
        self.data_seed = data_seed

    def start_over(self):
        """Every counter back to 0, the data seed kept: a checkpoint's counters then win over a used Trainer's
        (a key an older checkpoint lacks starts from 0, not from the last fit)."""
        seed, fresh = self.data_seed, TrainState()
        for key in self.state_dict():
            setattr(self, key, getattr(fresh, key))
        self.data_seed = seed

    def state_dict(self) -> dict:
        state = {k: v for k, v in asdict(self).items() if k not in _RUN_ONLY}
        # saved in the middle of a batch that stepped (on_train_batch_end, a mid-epoch validation): the resumed run
        # goes on after that batch, so it counts it (Lightning adds the 1 when it restarts)
        state["batches_that_stepped"] += int(self.stepping_batch)
        # (or restored from such a checkpoint, its loop not gone on yet: the count still holds that batch)
        state["saved_in_stepping_batch"] = bool(self.stepping_batch) or self.saved_in_stepping_batch
        return state

    def load_state_dict(self, state: dict):
        for key, value in state.items():
            if hasattr(self, key) and key not in _RUN_ONLY:  # (older checkpoints carry stage="fit": not a stage)
                setattr(self, key, value)
        if "batches_taken" not in state:  # a checkpoint from before the batch counters: the epoch's batches only
            self.batches_taken = int(state.get("batch_in_epoch", 0))
        if "batches_that_stepped" not in state:  # a checkpoint from before the counter: one optimizer's steps
            self.batches_that_stepped = int(self.global_step)  # (Lightning's migration of such checkpoints)
        self.stepping_batch = False
        # a batch saved in its on_train_batch_end is "restored": processed, not completed until the loop goes on;
        # (Lightning restarts a batch saved before its end from its start)
        self.batch_phase = "restored" if self.batch_phase == "processed" else None
