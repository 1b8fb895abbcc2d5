"""`dapo tracking-store`, the command the workflow's tracking_store rule runs: the store and experiment the runs log
into, made as the trainer makes them."""

from __future__ import annotations

from dapo.cli import main


def test_the_workflows_store_keeps_artifacts_where_the_trainers_does(tmp_path):
    """`dapo tracking-store` (the workflow's tracking_store rule) creates the experiment as the trainer's Tracker
    does: an SQLite store's artifacts beside the database, not MLflow's default ./mlruns."""
    from mlflow.tracking import MlflowClient

    from dapo.tracking import Tracker

    def location(uri: str) -> str:
        return MlflowClient(tracking_uri=uri).get_experiment_by_name("dapo-tiny").artifact_location

    by_workflow = f"sqlite:///{tmp_path / 'workflow' / 'mlflow.db'}"
    assert main(["tracking-store", "--tracking-uri", by_workflow, "--experiment", "dapo-tiny"]) == 0
    by_trainer = f"sqlite:///{tmp_path / 'trainer' / 'mlflow.db'}"
    Tracker(by_trainer, "dapo-tiny", spool_dir=tmp_path / "spool").finish()
    assert location(by_workflow) == (tmp_path / "workflow" / "mlartifacts").as_uri()
    assert location(by_trainer) == (tmp_path / "trainer" / "mlartifacts").as_uri()
    # a run started on the workflow's store goes into its experiment; a second call keeps it
    t = Tracker(by_workflow, "dapo-tiny", spool_dir=tmp_path / "spool2")
    t.finish()
    assert t.experiment_id == MlflowClient(tracking_uri=by_workflow).get_experiment_by_name("dapo-tiny").experiment_id
    assert main(["tracking-store", "--tracking-uri", by_workflow, "--experiment", "dapo-tiny"]) == 0
