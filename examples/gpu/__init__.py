"""GPU workloads written with PyTorch: a transformer language model's training job
(train_lm.py) and a serving engine over safetensors weights (serve_lm.py, weights from
weights_lm.py). On a machine without a GPU they run their smallest sizes on the CPU, so the
same code is tested in CI."""
