"""The tiny world as the trainer's plug-in (`dapo.trainer.components.World`): `dapo train` and `dapo eval` pass
`TinyWorld(cfg)` in, so the trainer itself imports nothing of the tiny world."""

from __future__ import annotations

from pathlib import Path

from dapo.config import RunConfig
from dapo.tinyworld.build import TINY, resolve_model_path, resolve_source


class TinyWorld:
    """`model.path: tiny` is the world's base model and `data.*: tiny` / `tiny-large` its splits (built on first use,
    under the world's lock); runs from the habits world's base model get its habit tagger."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def model_path(self, path: str) -> str:
        return resolve_model_path(self.cfg) if path == TINY else path

    def data_source(self, split: str, source: str) -> str:
        return resolve_source(self.cfg, split, source)

    def tagger(self, model_path: str):  # noqa: ANN201 (dapo.trainer.components.HabitTagger, not imported here)
        """The habits world's tagger for runs from its base model: `model.path: tiny`, or the world's model
        directory, as the workflow passes it (with the world's splits prepared as files)."""
        world_model = Path(self.cfg.tiny.dir, "model").resolve()
        if self.cfg.tiny.kind == "habits" and (model_path == TINY or Path(model_path).resolve() == world_model):
            from dapo.tinyworld.habits import Tagger

            return Tagger()
        return None
