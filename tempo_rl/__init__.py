"""Reinforcement learning as recurrent-tensor programs: environments as UDFs, algorithms
as recurrences over iterations and timesteps."""
