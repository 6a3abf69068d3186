"""Lightning's `lightning.pytorch.accelerators` path, for what its callbacks read from it: the device statistics
DeviceStatsMonitor logs (cpu.py). Devices themselves are chosen by the Trainer's `accelerator=` argument and owned
by the strategies; there are no accelerator objects."""
