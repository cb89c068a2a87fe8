"""rlbatch: measured batch sizing for online RL of language models (GRPO, PPO)."""

__version__ = "0.1.0"
