"""One rank of the ZeRO-3 reference-policy check in tests/test_learner_reference.py.

    RANK=r WORLD_SIZE=2 LOCAL_RANK=r MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/_reference_worker.py \
        MODEL_DIR BATCH.pt OUT_DIR

Builds a `ReferencePolicy` at ZeRO-3, computes the reference log-probs of the whole batch (each rank its shard,
gathered), and writes {"rank", "rows", "logp", "local_numel", "full_numel"} to OUT_DIR/rank<r>.pt: the rows of
the batch this rank computed, every row's log-probs, and how many parameter elements this rank stores against the
model's total.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from dapo.learner import ReferencePolicy, shutdown  # noqa: E402

TEMPERATURE = 0.7


def main(model_dir: str, batch_path: str, out_dir: str) -> None:
    ref = ReferencePolicy(
        model_dir, zero_stage=3, dtype="float32", micro_batch_tokens=40, logprob_chunk_size=5, temperature=TEMPERATURE
    )
    rank, world = ref.dist.rank, ref.dist.world_size
    batch = torch.load(batch_path, weights_only=False)
    rows = batch.shard_rows(rank, world)  # what this rank computes; every rank gets every row back
    logp = ref.compute_logprobs(batch)
    params = list(ref.engine.module.parameters())
    local = sum(p.ds_tensor.numel() for p in params)  # this rank's partition of each parameter
    full = sum(p.ds_numel for p in params)
    torch.save(
        {"rank": rank, "rows": rows, "logp": logp, "local_numel": local, "full_numel": full},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
