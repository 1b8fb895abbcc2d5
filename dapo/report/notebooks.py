"""Execute the analysis notebooks (jupytext percent scripts in `analysis/`) with papermill.

The kernel is this Python (the venv's), registered as a kernelspec in a temporary JUPYTER_PATH for the length
of the call, so nothing is installed into ~/.local or the venv and the notebook cannot pick up another Python
that lacks `dapo`. The executed notebook (.ipynb, with its outputs) is saved beside the report's outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ANALYSIS_DIR = Path(__file__).resolve().parent.parent.parent / "analysis"
KERNEL_NAME = "dapo-report"
NOTEBOOKS = ("table1", "figures")


class NotebookFailed(RuntimeError):
    """A notebook cell raised; the message names the notebook, the saved copy and the error."""


@contextlib.contextmanager
def temp_kernelspec() -> Iterator[str]:
    """A kernelspec running this Python's `ipykernel_launcher`, visible only inside the block; yields its name."""
    with tempfile.TemporaryDirectory(prefix="dapo-kernels-") as tmp:
        kdir = Path(tmp) / "kernels" / KERNEL_NAME
        kdir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python ({KERNEL_NAME})",
            "language": "python",
            "env": {
                "MPLBACKEND": "Agg",
                "PYTHONPATH": os.pathsep.join(
                    [str(ANALYSIS_DIR.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
                ),
            },
        }
        (kdir / "kernel.json").write_text(json.dumps(spec))
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = os.pathsep.join([tmp] + ([old] if old else []))
        try:
            yield KERNEL_NAME
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def execute_notebook(script: Path, output: Path, parameters: dict[str, Any], cwd: Path) -> Path:
    """Run a jupytext script as a notebook with papermill, injecting `parameters`; save it to `output`.

    Raises NotebookFailed (naming the saved, partly executed notebook) when a cell fails.
    """
    import jupytext
    import papermill as pm

    output.parent.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(script)
    with tempfile.TemporaryDirectory(prefix="dapo-nb-") as tmp, temp_kernelspec() as kernel:
        src = Path(tmp) / f"{script.stem}.ipynb"
        jupytext.write(nb, src)
        try:
            pm.execute_notebook(
                str(src),
                str(output),
                parameters=parameters,
                kernel_name=kernel,
                cwd=str(cwd),
                progress_bar=False,
                log_output=False,
                execution_timeout=900,
            )
        except pm.PapermillExecutionError as e:
            raise NotebookFailed(
                f"notebook {script.name} failed in cell {e.exec_count}: {e.ename}: {e.evalue} (executed copy: {output})"
            ) from e
    return output


def run_notebooks(parameters: dict[str, Any], out_dir: str | Path, names: tuple[str, ...] = NOTEBOOKS) -> list[Path]:
    """Execute analysis/<name>.py for each name into <out_dir>/notebooks/<name>.ipynb; returns their paths."""
    out = Path(out_dir).resolve()
    params = dict(parameters, out_dir=str(out))
    return [
        execute_notebook(ANALYSIS_DIR / f"{n}.py", out / "notebooks" / f"{n}.ipynb", params, cwd=Path.cwd())
        for n in names
    ]
