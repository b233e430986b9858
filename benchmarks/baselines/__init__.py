"""Hand-written PPO baselines: CleanRL-style PyTorch and PureJaxRL-style JAX."""
