"""Lightning's Accelerator interface (lightning.pytorch.accelerators.Accelerator): what a kind of device answers."""
import abc


class Accelerator(abc.ABC):
    """One kind of device. The Trainer does not call these (its strategy owns the devices); a user's callback or
    script does, through trainer.accelerator."""

    def setup(self, trainer):
        """Lightning calls it before the model runs on the device; nothing to do here."""

    @abc.abstractmethod
    def setup_device(self, device):
        """Check (and select) `device` for this process."""

    def teardown(self):
        """Release what setup_device took."""

    @abc.abstractmethod
    def get_device_stats(self, device):
        """The device's statistics (a dict of numbers), as DeviceStatsMonitor logs them."""

    @staticmethod
    @abc.abstractmethod
    def parse_devices(devices):
        """The Trainer's `devices=` for this kind, parsed."""

    @staticmethod
    @abc.abstractmethod
    def get_parallel_devices(devices):
        """The torch.devices of the parsed `devices`."""

    @staticmethod
    @abc.abstractmethod
    def auto_device_count():
        """How many devices `devices="auto"` means."""

    @staticmethod
    @abc.abstractmethod
    def is_available():
        """Whether this kind of device can run here."""

    @staticmethod
    @abc.abstractmethod
    def name():
        """The name `Trainer(accelerator=...)` takes."""
