"""Nsight and torch.profiler outputs -> tidy rows: pure parsers and the kernel classifier."""
