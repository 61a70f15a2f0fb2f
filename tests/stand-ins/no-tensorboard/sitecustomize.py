"""STAND-IN for a Python without tensorboard, used only by the tests (tests/test_scalars.py).

Put this directory first on PYTHONPATH and every process started with it (torchrun's ranks
included) fails `import tensorboard` as if the package were not installed: a None entry in
sys.modules makes the import raise ModuleNotFoundError. Nothing else is changed.
"""

import sys

sys.modules["tensorboard"] = None
