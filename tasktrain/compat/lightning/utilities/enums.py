"""`lightning.pytorch.utilities.enums`: LightningEnum (the core's str enum: equal to its value in any case, hashed as
it; the base of trainer.state's enums) and GradClipAlgorithmType, the gradient_clip_algorithm values."""
from tasktrain.trainer.states import _StrEnum as LightningEnum

__all__ = ["GradClipAlgorithmType", "LightningEnum"]


class GradClipAlgorithmType(LightningEnum):
    """Trainer(gradient_clip_algorithm=...): "norm" clips the total norm of all gradients, "value" each element."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val):
        return any(member.value == val for member in GradClipAlgorithmType)

    @staticmethod
    def supported_types():
        return [member.value for member in GradClipAlgorithmType]
