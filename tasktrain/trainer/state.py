from dataclasses import asdict, dataclass


@dataclass
class TrainState:
    """Where training is. Everything a resume needs to put the loop back at the same place."""

    epoch: int = 0  # the epoch being trained (0-based)
    global_step: int = 0  # optimizer steps taken
    batch_in_epoch: int = 0  # batches of `epoch` already trained on (so a resume skips them)
    data_seed: int = 0  # the data order is a function of (data_seed, epoch)
    epoch_finished: bool = False  # the epoch's end (validation, schedulers, hooks) already ran
    stage: str = "fit"

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict):
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
