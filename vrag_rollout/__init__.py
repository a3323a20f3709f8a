"""Multi-turn visual document-retrieval agent rollouts on vLLM for EasyR1-style RL trainers."""
