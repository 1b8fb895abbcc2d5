"""Python imports this module at start-up in every process whose PYTHONPATH holds this folder (the `site` module's
`sitecustomize` hook). The tests put it there (`_env.child_env`); it injects the faults that `DAPO_TEST_*`
variables ask for (`dapo_faults`), so that the package itself carries no test machinery."""

import os

FAULTS = (
    "DAPO_TEST_KILL_AT",
    "DAPO_TEST_FAIL_AT",
    "DAPO_TEST_POISON_STEP",
    "DAPO_TEST_SYNC",
    "DAPO_TEST_SAME_SEEDS",
    "DAPO_TEST_HOLD",
    "DAPO_TEST_SLOW_AT",
)
if any(os.environ.get(name) for name in FAULTS):
    import dapo_faults

    dapo_faults.install_on_import(dapo_faults.Faults.from_env())
