"""Imported once by the pool's forkserver: warms math-verify there, so every worker forked from it (the first
ones and each replacement of a killed one) starts warm, in milliseconds instead of seconds."""

from dapo.rewards.mv_check import VerifierBroken, warm_up

try:
    warm_up()
except VerifierBroken:
    # Not fatal here: a preload error would take the forkserver down with an unrelated message. Each worker runs
    # the warm-up again before it reports ready (`BoundedPool`), and that failure reaches the caller, with this
    # message, as an exception.
    pass
