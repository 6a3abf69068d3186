"""Lightning's trainer states (lightning.pytorch.trainer.states): what `trainer.state.status`, `.fn` and `.stage`
hold. Each is a str enum, so it compares equal to its value (`trainer.state.fn == "fit"`)."""
from enum import Enum


class _StrEnum(str, Enum):
    def __str__(self):
        return self.value


class TrainerStatus(_StrEnum):
    INITIALIZING = "initializing"  # the Trainer was made, no entry point has run
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # an entry point ended with an exception (KeyboardInterrupt, a failure)

    @property
    def stopped(self):
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(_StrEnum):
    """The entry point that runs (or ran last)."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """The loop that runs now inside the entry point (None between runs)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self):
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)
