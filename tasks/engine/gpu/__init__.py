"""GPU checkpointing: the CUDA driver's checkpoint API (driver.py); the capability check is tasks/data/gpu_capability.py."""
