"""The vLLM engine's sleep level between rollouts, read by the engine and by `dapo plan`'s memory budget. What each
GPU holds in each phase of a colocated step: docs/distributed.md, "Colocation".

Level 2, not 1: level 1 copies the engine's weights to host memory and back every step, but the sync overwrites them
right after waking; level 2 skips the copy and the host memory it needs (a full copy of the weights per GPU).
"""

ENGINE_SLEEP_LEVEL = 2
