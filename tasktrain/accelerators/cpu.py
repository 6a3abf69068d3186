"""CPU statistics as Lightning's CPU accelerator reports them (DeviceStatsMonitor logs them): system-wide CPU, RAM and
swap use in percent, read with psutil. psutil is optional here (DeepSpeed, a dependency, installs it anyway): it is
imported only when the statistics are read, and its absence is an error that says to install it."""
import importlib.util

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
