"""--cuda-graphs step on a CPU: StepGraph's control logic (the eager warm-up, one capture, the
replays on the captured input tensors, the learning rate a replay reads) with a STAND-IN for
torch.cuda.CUDAGraph, RerunGraphStandIn below. It is NOT a CUDA graph and records nothing: its
capture runs the step and then puts back every tensor the step changed (a real capture runs no
kernel), and its replay runs the step again on the captured input tensors with the optimizer
holding the learning-rate objects its groups held during the capture (what the real graph
reads at replay: StepGraph's tensors, filled from the scheduler before each replay). What it cannot
show (the capture itself, NCCL inside a graph, the speed) is checked on a GPU: gpu-check's
cuda-graphs-step, benchmarks/whole_step_graph.py --check.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO

from scalestudy.trainer import step_graph
from scalestudy.trainer.recipe import lr_factor


class RerunGraphStandIn:
    """STAND-IN for torch.cuda.CUDAGraph (CPU tests only): see the module docstring."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.graph: step_graph.StepGraph | None = None
        self.captures = self.replays = 0

    def _state(self) -> list[torch.Tensor]:
        params = list(self.model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        moments = [s["momentum_buffer"] for s in self.optimizer.state.values()]
        return [*params, *self.model.buffers(), *grads, *moments]

    @contextlib.contextmanager
    def recording(self, graph: step_graph.StepGraph):
        self.graph, self.captures = graph, self.captures + 1
        # what a real capture bakes in: the objects the optimizer's groups hold as their
        # learning rate (StepGraph's tensors, which it fills before each replay; a float here
        # would be the capture step's value in every replay)
        self.lrs = [group["lr"] for group in self.optimizer.param_groups]
        saved = [t.detach().clone() for t in self._state()]
        yield
        with torch.no_grad():
            for t, s in zip(self._state(), saved, strict=True):
                t.copy_(s)

    def replay(self) -> None:
        self.replays += 1
        g = self.graph
        now = [group["lr"] for group in self.optimizer.param_groups]
        for lr, group in zip(self.lrs, self.optimizer.param_groups, strict=True):
            group["lr"] = lr
        try:
            outputs = g.step(step_graph.NullMeter(), *g.inputs)
        finally:
            for value, group in zip(now, self.optimizer.param_groups, strict=True):
                group["lr"] = value
        for mine, new in zip(g.outputs, outputs, strict=True):
            mine.copy_(new)


class Meter:
    """The trainer's meter as the step sees it: counts the timed phases."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(self, name: str):
        self.phases.append(name)
        return contextlib.nullcontext()

    def diag_delay(self, phase: str) -> None:
        pass


def trainer(total: int):
    """A small network, the recipe's optimizer (SGD Nesterov, two groups) and an LR schedule
    that changes every step, and a step as loop.train_step does it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.2,
        momentum=0.9,
        nesterov=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total, 3, "onecycle")
    )

    def step(meter, x, y, keep_grads: bool):
        with meter.phase("forward"):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        with meter.phase("backward"):
            loss.backward()
        with meter.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=not keep_grads)
        return loss.detach(), (logits.detach().argmax(1) == y).sum()

    return model, optimizer, scheduler, step


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
        for _ in range(n)
    ]


def train(steps: int, graphed: bool):
    model, optimizer, scheduler, step = trainer(steps)
    stand_in = RerunGraphStandIn(model, optimizer)
    run_step = lambda meter, x, y: step(meter, x, y, keep_grads=graphed)  # noqa: E731
    if graphed:
        run_step = step_graph.StepGraph(
            run_step, optimizer, torch.device("cpu"), graph_type=lambda: stand_in
        )
    meter, losses, rights = Meter(), [], []
    for x, y in batches(steps):
        loss, right = run_step(meter, x.clone(), y.clone())  # a fresh tensor each step
        losses.append(loss.item())
        rights.append(right.item())
        scheduler.step()
    return model, optimizer, losses, rights, meter, stand_in, run_step


def test_step_graph_trains_as_the_eager_steps_do():
    steps = 30
    plain = train(steps, graphed=False)
    graphed = train(steps, graphed=True)
    # the same parameters, momentum and per-step results: warm-up, capture and replays line up
    # with the eager steps one for one, each replay on its own batch with the scheduler's LR
    for a, b in zip(plain[0].state_dict().values(), graphed[0].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(plain[1].state.values(), graphed[1].state.values(), strict=True):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert graphed[2] == plain[2] and graphed[3] == plain[3]
    stand_in, sg = graphed[5], graphed[6]
    assert stand_in.captures == 1 and sg.captured
    assert stand_in.replays == steps - step_graph.WARM_STEPS
    # the eager warm-up steps are timed per phase; the capture and the replays time nothing
    assert graphed[4].phases == ["forward", "backward", "optimizer"] * step_graph.WARM_STEPS
    # the optimizer's groups hold floats again (state_dict, checkpoints, the scheduler)
    assert all(isinstance(g["lr"], float) for g in graphed[1].param_groups)


def test_a_replay_reads_the_schedulers_learning_rate():
    """If the replays kept the LR of the capture, the schedule would stop at the capture: the
    weights would differ from the eager run's (this is what lr.fill_ before a replay prevents)."""
    steps = 20
    model, optimizer, scheduler, step = trainer(steps)
    stand_in = RerunGraphStandIn(model, optimizer)
    sg = step_graph.StepGraph(
        lambda m, x, y: step(m, x, y, keep_grads=True),
        optimizer,
        torch.device("cpu"),
        graph_type=lambda: stand_in,
    )
    seen = []
    for x, y in batches(steps):
        sg(Meter(), x, y)
        seen.append(sg.lrs[0].item())
        scheduler.step()
    expected = [0.2 * lr_factor(s, steps, 3, "onecycle") for s in range(steps)]
    replayed = range(step_graph.WARM_STEPS, steps)
    assert [round(seen[s], 6) for s in replayed] == [round(expected[s], 6) for s in replayed]
    assert len(set(seen[step_graph.WARM_STEPS :])) > 1  # the schedule moved during the replays


class ReplayNothingStandIn(RerunGraphStandIn):
    """A broken graph (its replays do nothing): what the benchmark's check must catch."""

    def replay(self) -> None:
        self.replays += 1


def test_the_whole_step_benchmarks_check_runs_the_trainers_step_graph(one_rank_group):
    """benchmarks/whole_step_graph.py --check on a CPU: its graphed step is StepGraph around its
    DDP step, and it equals the eager steps (here with the stand-in; on a GPU with CUDA's graph).
    With a graph whose replays do nothing the check reports the difference."""
    spec = importlib.util.spec_from_file_location(
        "whole_step_graph", REPO / "benchmarks" / "whole_step_graph.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cpu = torch.device("cpu")
    args = bench.parse(["--width", "4", "--local-batch", "8", "--precision", "fp32"])
    args.check = step_graph.WARM_STEPS + 4
    xs, ys = bench.batches(args, cpu, seed=1)
    got = bench.check(args, cpu, None, xs, ys, lambda s: RerunGraphStandIn(s.model, s.opt))
    assert got["replays"] == 4 and got["max_param"] > 0
    assert got["max_param_diff"] == 0.0 and got["max_momentum_diff"] == 0.0
    broken = bench.check(args, cpu, None, xs, ys, lambda s: ReplayNothingStandIn(s.model, s.opt))
    assert broken["max_param_diff"] > 0 and broken["max_momentum_diff"] > 0
    with pytest.raises(SystemExit):  # the capture would fall inside the timed steps
        bench.parse(["--warmup", str(step_graph.WARM_STEPS), "--variants", "whole-eager"])
