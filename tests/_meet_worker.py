"""One rank of a job that meets its peers (`dapo.distributed.init_distributed`) and all-reduces in a loop under a
`FailureWatch` with a heartbeat, as the trainer does, for tests/test_rendezvous.py. Prints where it met, then the
step it is in; ends as `dapo train` would: exit 75 on a lost peer or a failed meeting, 1 on a failure, 0 after
`steps` steps (0: loop until stopped), rank 0 lingering LINGER_S in the watch first (the others ended normally:
they are not lost).
    python _meet_worker.py STEPS HEARTBEAT_TIMEOUT_S RENDEZVOUS_TIMEOUT_S [LINGER_S]
"""

from __future__ import annotations

import logging
import socket
import sys
import time

import torch

from dapo import distributed as dist

RESUME = 75


def main() -> int:
    steps, heartbeat_s, rendezvous_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    linger_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        info = dist.init_distributed(timeout_s=600, rendezvous_timeout_s=rendezvous_s)
    except dist.RendezvousError as e:
        print(f"RendezvousError: {e}", flush=True)
        return RESUME
    print(f"met: rank {info.rank} of {info.world_size} on {socket.gethostname()}", flush=True)
    dist.at_forced_exit(lambda code: print(f"forced exit with {code}", flush=True))  # `dapo train` writes EXIT.json
    with dist.FailureWatch(heartbeat_timeout_s=heartbeat_s, lost_exit_code=RESUME) as watch:
        try:
            step = 0
            while steps == 0 or step < steps:
                step += 1
                total = dist.all_reduce(torch.tensor([1.0]))
                print(f"step {step}: {total.item():.0f}", flush=True)
                time.sleep(0.2)
            if info.rank == 0:
                time.sleep(linger_s)
        except Exception as e:
            lost = watch.peer_lost(e)
            if lost is not None:
                print(f"PeerLost: {lost}", flush=True)
                return RESUME
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
