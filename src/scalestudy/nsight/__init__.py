"""Nsight and torch.profiler outputs -> tidy rows: pure parsers and the kernel classifier.

schema.py     the profile CSV schemas (columns, categories, phase ranges), their rows, CSVs
classify.py   kernel / op name -> category
readers.py    a file's text, its rank, the tool's SKIPPED line (the capture's checks too)
tables.py     numbers with units, the CSV table after a tool's noise lines (parsers only)
projection.py the phase ranges projected onto the GPU (launches of every thread)
nsys.py       nsys stats CSVs and the SQLite export -> kernels and ranges rows
ncu.py        ncu details CSV -> profile_ncu rows
ncu_metrics.py the counters profile ncu asks for beyond the details page, how ncu.py counts them
torch_ops.py  torch.profiler export -> kernels and ranges rows
"""
