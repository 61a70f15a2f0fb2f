"""STAND-IN for an installed but broken tensorboard, used only by the tests (tests/test_scalars.py).

Put this directory first on PYTHONPATH and `import tensorboard` fails as an old tensorboard's
generated protobuf code does under protobuf >= 4 (a TypeError, not an ImportError).
"""

raise TypeError(
    "Descriptors cannot be created directly. If this call came from a _pb2.py file, your "
    "generated code is out of date and must be regenerated with protoc >= 3.19.0."
)
