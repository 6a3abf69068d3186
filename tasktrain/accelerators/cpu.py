"""CPU statistics as Lightning's CPU accelerator reports them (DeviceStatsMonitor logs them): system-wide CPU, RAM and
swap use in percent, read with psutil. psutil is optional here (DeepSpeed, a dependency, installs it anyway): it is
imported only when the statistics are read, and its absence is an error that says to install it."""
import importlib.util

import torch

from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.exceptions import MisconfigurationException

_CPU_VM_PERCENT = "cpu_vm_percent"
_CPU_PERCENT = "cpu_percent"
_CPU_SWAP_PERCENT = "cpu_swap_percent"

_PSUTIL_AVAILABLE = importlib.util.find_spec("psutil") is not None


def get_cpu_stats():
    if not _PSUTIL_AVAILABLE:
        raise ModuleNotFoundError("Fetching CPU device stats requires `psutil` to be installed: `pip install psutil`.")
    import psutil

    return {
        _CPU_VM_PERCENT: psutil.virtual_memory().percent,
        _CPU_PERCENT: psutil.cpu_percent(),
        _CPU_SWAP_PERCENT: psutil.swap_memory().percent,
    }


class CPUAccelerator(Accelerator):
    """The CPU as Lightning's CPUAccelerator describes it: always available, `devices` a number of processes."""

    def setup_device(self, device):
        if device.type != "cpu":  # (Lightning's words)
            raise MisconfigurationException(f"Device should be CPU, got {device} instead.")

    def get_device_stats(self, device):
        return get_cpu_stats()

    @staticmethod
    def parse_devices(devices):
        if isinstance(devices, str) and devices.strip().isdigit():
            devices = int(devices)
        if not isinstance(devices, int) or isinstance(devices, bool) or devices <= 0:  # (Lightning's words)
            raise TypeError("`devices` selected with `CPUAccelerator` should be an int > 0.")
        return devices

    @staticmethod
    def get_parallel_devices(devices):
        return [torch.device("cpu")] * CPUAccelerator.parse_devices(devices)

    @staticmethod
    def auto_device_count():
        return 1

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def name():
        return "cpu"
