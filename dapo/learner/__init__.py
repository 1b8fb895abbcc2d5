"""The learner: the policy under DeepSpeed behind one small interface (`Learner`), and the KL term's frozen
`ReferencePolicy`. The interface and its contracts (collective calls, the global normaliser, the lr schedule,
non-finite steps): docs/architecture.md, "learner/"."""

from dapo.distributed import init_distributed, shutdown
from dapo.learner.batch import LossSpec, PolicyBatch, pad_rows, response_mask
from dapo.learner.learner import UPDATE_SKIPPED, Learner, StalenessError
from dapo.learner.optim import lr_at
from dapo.learner.reference import ReferencePolicy

__all__ = [
    "UPDATE_SKIPPED",
    "Learner",
    "LossSpec",
    "PolicyBatch",
    "ReferencePolicy",
    "StalenessError",
    "init_distributed",
    "lr_at",
    "pad_rows",
    "response_mask",
    "shutdown",
]
