"""Lightning's `lightning.pytorch.accelerators` path: `trainer.accelerator` is one of these objects (the kind of the
run's device, with the methods a Lightning user calls on it: get_device_stats, is_available, auto_device_count,
parse_devices, ...), and DeviceStatsMonitor reads the device statistics from them (cpu.py). Devices themselves are
chosen by the Trainer's `accelerator=` argument and owned by the strategies: these objects describe, they move nothing."""
from tasktrain.accelerators.accelerator import Accelerator
from tasktrain.accelerators.cpu import CPUAccelerator
from tasktrain.accelerators.cuda import CUDAAccelerator

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "accelerator_for"]


def accelerator_for(device):
    """The accelerator object of a torch.device's kind (Lightning's trainer.accelerator for a run on it)."""
    kinds = {"cpu": CPUAccelerator, "cuda": CUDAAccelerator}
    if device.type not in kinds:
        raise NotImplementedError(f"trainer.accelerator: tasktrain has no accelerator object for {device.type!r} "
                                  "devices (only 'cpu' and 'cuda').")
    return kinds[device.type]()
