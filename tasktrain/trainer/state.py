from dataclasses import asdict, dataclass


@dataclass
class TrainState:
    """Where training is. Everything a resume needs to put the loop back at the same place, on any number of
    processes."""

    epoch: int = 0  # the epoch being trained (0-based)
    global_step: int = 0  # optimizer steps taken
    batch_in_epoch: int = 0  # loop batches of `epoch` already trained on, in this run's numbering
    # Positions of the epoch's global order (a function of data_seed and epoch over the whole dataset) already
    # trained on by all ranks together: a resume on any number of processes skips exactly these.
    samples_in_epoch: int = 0
    global_batch_size: int = 0  # samples per optimizer step over all ranks (micro x world x accumulation); 0: unknown
    data_seed: int = 0  # the data order is a function of (data_seed, epoch)
    epoch_finished: bool = False  # the epoch's end (validation, schedulers, hooks) already ran
    stage: str = "fit"

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict):
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
