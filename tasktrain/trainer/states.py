"""Lightning's trainer states (lightning.pytorch.trainer.states): what `trainer.state.status`, `.fn` and `.stage`
hold. Each is a str enum as Lightning's (its LightningEnum): it compares equal to its value in any case
(`trainer.state.fn == "fit"`, `== "FIT"`), hashes as that value (so `{"fit": ...}[trainer.state.fn]` works), and
str()/format() give the member's name, `TrainerFn.FITTING` (Python's own rule for a str enum); `.value` is "fit"."""
import warnings
from enum import Enum


class _StrEnum(str, Enum):
    @classmethod
    def from_str(cls, value, source="key"):
        """The member named `value` (source="key", any case), whose value is `value` (source="value"), or either
        (source="any": the names first)."""
        if source in ("key", "any"):
            for name, member in cls.__members__.items():
                if name.lower() == value.lower():
                    return member
        if source in ("value", "any"):
            for member in cls:
                if member == value:
                    return member
        names, values = list(cls.__members__), [member.value for member in cls]
        allowed = {"key": names, "value": values}.get(source, names + values)
        raise ValueError(f"Invalid match: expected one of {allowed}, but got {value}.")

    @classmethod
    def try_from_str(cls, value, source="key"):
        """from_str, or None with a warning where nothing matches."""
        try:
            return cls.from_str(value, source)
        except ValueError as error:
            warnings.warn(UserWarning(str(error).replace("Invalid match", "Invalid string")))
            return None

    def __eq__(self, other):
        if isinstance(other, Enum):
            other = other.value
        return self.value.lower() == str(other).lower()

    # (`!=` stays str's exact comparison, as in Lightning, whose enum overrides == only: `TrainerFn.FITTING != "FIT"`)

    def __hash__(self):  # equal members and strings hash alike (an __eq__ of its own would drop the hash)
        return hash(self.value.lower())


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

    @property
    def dataloader_prefix(self):
        """The loader hook's prefix: "val" for validation and the sanity check, else the value."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


class GradClipAlgorithmType(_StrEnum):
    """Trainer(gradient_clip_algorithm=...): "norm" clips the total norm of all gradients, "value" each element
    (Lightning's enum: what trainer.gradient_clip_algorithm holds and configure_gradient_clipping receives)."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val):
        return any(member.value == val for member in GradClipAlgorithmType)

    @staticmethod
    def supported_types():
        return [member.value for member in GradClipAlgorithmType]


class TrainerState:
    """Lightning's TrainerState (status, fn, stage): what `trainer.state` is for a Lightning user. tasktrain's
    `trainer.state` is its TrainState (trainer/state.py), which holds these three and where training is; it compares
    equal to a TrainerState with the same status, fn and stage, so `trainer.state == TrainerState(status=..., fn=...,
    stage=...)` reads as in Lightning."""

    def __init__(self, status=TrainerStatus.INITIALIZING, fn=None, stage=None):
        self.status, self.fn, self.stage = status, fn, stage

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped

    def __eq__(self, other):  # (also reached from `trainer.state == TrainerState(...)`: TrainState's own == declines)
        if not all(hasattr(other, name) for name in ("status", "fn", "stage")):
            return NotImplemented
        return (self.status, self.fn, self.stage) == (other.status, other.fn, other.stage)

    __hash__ = None  # (Lightning's dataclass is unhashable too)

    def __repr__(self):
        return f"TrainerState(status={self.status!r}, fn={self.fn!r}, stage={self.stage!r})"
