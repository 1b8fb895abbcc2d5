"""Imported once by the pool's forkserver: warms math-verify there, so every worker forked from it (the first
ones and each replacement of a killed one) starts warm, in milliseconds instead of seconds."""

from dapo.rewards.mv_check import warm_up

warm_up()
