"""CUDA as Lightning's CUDAAccelerator describes it: torch.cuda's memory statistics, its visible devices."""
import torch

from tasktrain.accelerators.accelerator import Accelerator


class CUDAAccelerator(Accelerator):
    def setup_device(self, device):
        if device.type != "cuda":  # (Lightning's words)
            raise ValueError(f"Device should be CUDA, got {device} instead.")
        torch.cuda.set_device(device)

    def teardown(self):
        torch.cuda.empty_cache()

    def get_device_stats(self, device):
        return torch.cuda.memory_stats(device)

    @staticmethod
    def parse_devices(devices):
        """A count (or "-1" / -1: every visible device) or a list of indices: the indices, or None for none."""
        if isinstance(devices, str):
            devices = devices.strip()
            devices = [int(x) for x in devices.split(",") if x.strip()] if "," in devices else int(devices)
        visible = list(range(torch.cuda.device_count()))
        if isinstance(devices, int):
            if devices == -1:
                devices = len(visible)
            if devices == 0:
                return None
            ids = list(range(devices))
        else:
            ids = list(devices)
        missing = [i for i in ids if i not in visible]
        if missing:
            raise ValueError(f"devices={devices!r}: CUDA devices {missing} are not visible here ({len(visible)} "
                             "visible).")
        return ids or None

    @staticmethod
    def get_parallel_devices(devices):
        return [torch.device("cuda", i) for i in devices]

    @staticmethod
    def auto_device_count():
        return torch.cuda.device_count()

    @staticmethod
    def is_available():
        return torch.cuda.device_count() > 0

    @staticmethod
    def name():
        return "cuda"
