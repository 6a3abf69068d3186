"""`lightning.pytorch.utilities.enums`: LightningEnum (the core's str enum: equal to its value in any case, hashed as
it; the base of trainer.state's enums) and GradClipAlgorithmType, the gradient_clip_algorithm values."""
from tasktrain.trainer.states import GradClipAlgorithmType  # (the core's: the Trainer holds it)
from tasktrain.trainer.states import _StrEnum as LightningEnum

__all__ = ["GradClipAlgorithmType", "LightningEnum"]
