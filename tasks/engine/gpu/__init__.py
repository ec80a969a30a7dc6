"""GPU checkpointing: the CUDA driver's checkpoint API (driver.py); the capability check
before it is tasks/data/gpu_capability.py."""
