"""--cuda-graphs step: the whole training step (forward, backward with DDP's all-reduces, the
optimizer step) recorded once as one CUDA graph and replayed every step after.

Why: torch.compile's CUDA graphs (--cuda-graphs on) replay each compiled piece, but between the
replays the host still runs autograd, DDP's reducer and the optimizer. At local batch 64 that
host time is the step's time (4.9 ms per step on one H200, 5.8 ms on one H100: 11-13k img/s);
captured whole, the host only copies the batch in and replays: 26.4k img/s on one H100 with eager
kernels, the same parameters bit for bit as the eager steps (benchmarks/whole_step_graph.py), and
29.6k in the trainer with compiled ones (docs/benchmarks.md).

How (torch's CUDA graphs notes, "Whole-network capture" and "DDP"):
- the first WARM_STEPS steps run eagerly on a side stream (DDP rebuilds its buckets after its
  first iteration and must have run 11 iterations before a capture; the optimizer creates its
  momentum buffers; torch.compile, when on, compiles);
- the next step is captured: the Python of the step runs once while CUDA records its kernels,
  into a private memory pool: the batch tensors, activations, gradients, the loss;
- every step after copies its batch into the captured input tensors and replays the graph.
The host work that must change from step to step stays out of the graph: the learning rate is a
device tensor per parameter group, which the graph reads and `__call__` fills from the
scheduler's value before each replay (the scheduler and the optimizer's state_dict keep their
float); gradients are zeroed inside the graph, never freed (set_to_none would free the memory
the graph writes to).
What it needs: CUDA, NCCL (gloo's all-reduce runs on the CPU, outside any graph), the same
shapes every step (the loaders drop the ragged tail), no host synchronisation inside the step
(fp16's GradScaler and its skipped steps are unproven in a graph; gradient accumulation runs
several forwards per step; a comm hook keeps Python state): config.py refuses those
combinations, compiling.graphs_mode says when auto picks this mode.
What it changes in the measurement: the phases forward/backward/communication/optimizer are one
replay, so only the data phase and the step are timed (measure.Meter: their fractions and the
busy time are null), and the steady-state window opens after the capture (Meter.warmup_steps).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

# eager steps before the capture: DDP's rebuilt buckets and its 11 warm-up iterations (defined
# torch-free in trainer/config.py with STEPS_BEFORE_WINDOW, for the study's checks)
from scalestudy.trainer.config import STEP_GRAPH_WARM_STEPS as WARM_STEPS


class NullMeter:
    """The meter inside a capture: a phase records no timing event (an event recorded while a
    stream captures is a graph node, never a timestamp) and no diagnostic delay."""

    def phase(self, name: str):
        return contextlib.nullcontext()

    def diag_delay(self, phase: str) -> None:
        pass


class StepGraph:
    """One training step as a CUDA graph: `step(meter, x, y)` runs eagerly WARM_STEPS times, is
    captured on the next call, then replayed. `step` returns device tensors (the loss, the
    correct count); the replays return the graph's own, overwritten by the next replay (read or
    accumulate them before). `graph_type` is torch.cuda.CUDAGraph except in the CPU test's
    stand-in; `side` the stream of the eager steps and the capture."""

    def __init__(
        self,
        step: Callable,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        side=None,
        graph_type=None,
    ) -> None:
        self.step, self.optimizer, self.device = step, optimizer, device
        self.cuda = device.type == "cuda"
        self.side = side if side is not None else (torch.cuda.Stream(device) if self.cuda else None)
        self.graph_type = graph_type or torch.cuda.CUDAGraph
        self.graph = None
        self.calls = 0
        self.inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self.outputs: tuple | None = None
        # one learning-rate tensor per parameter group: what the captured optimizer reads
        self.lrs = [
            torch.tensor(float(g["lr"]), device=device, dtype=torch.float32)
            for g in optimizer.param_groups
        ]

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, meter, x: torch.Tensor, y: torch.Tensor, group: int = 1, last: bool = True):
        """One step (the loop's call; group/last are 1/True: no accumulation under a graph)."""
        assert group == 1 and last, "a whole-step CUDA graph holds no gradient accumulation"
        self.calls += 1
        if self.calls <= WARM_STEPS:
            with self._on_side():
                return self.step(meter, x, y)
        if self.graph is None:
            self.capture(x, y)
        self.inputs[0].copy_(x, non_blocking=True)
        self.inputs[1].copy_(y, non_blocking=True)
        for lr, group in zip(self.lrs, self.optimizer.param_groups, strict=True):
            lr.fill_(float(group["lr"]))  # the scheduler's value (a kernel, no host sync)
        self.graph.replay()
        return self.outputs

    def capture(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Record the step with the batch tensors the replays copy into (the capture runs no
        kernel: the replay after it trains on this step's batch)."""
        self.inputs = (x.clone(), y.clone())
        self.graph = self.graph_type()  # torch.cuda.graph synchronises the device on entry
        with self.tensor_lrs(), self._on_side(), self._recording():
            self.outputs = self.step(NullMeter(), *self.inputs)

    @contextlib.contextmanager
    def tensor_lrs(self):
        """The optimizer's groups hold the lr tensors (the captured step reads them); their
        float values come back after."""
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for lr, group in zip(self.lrs, self.optimizer.param_groups, strict=True):
            group["lr"] = lr
        try:
            yield
        finally:
            for value, group in zip(saved, self.optimizer.param_groups, strict=True):
                group["lr"] = value

    def _recording(self):
        if self.cuda:
            # thread_local: the NVML sampler's and async checkpoint's threads may call CUDA
            # during the capture; only this thread's calls are recorded or refused
            return torch.cuda.graph(self.graph, stream=self.side, capture_error_mode="thread_local")
        return self.graph.recording(self)  # the CPU stand-in (tests)

    @contextlib.contextmanager
    def _on_side(self):
        """Eager steps and the capture on the side stream, ordered after the default stream's
        work and before what follows."""
        if not self.cuda:
            yield
            return
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            yield
        current.wait_stream(self.side)
