"""GPU checkpointing: the CUDA driver's checkpoint API and the capability check."""
