"""dapo: reproduce the DAPO paper's cumulative ablation (arXiv:2503.14476) end to end.

Importing the package pulls in nothing heavy: vLLM, DeepSpeed and MLflow are imported by the modules that
use them, so `import dapo` works on a machine without vLLM or a GPU.
"""

__version__ = "0.1.0"
