"""Could a different convolution algorithm make the CPU trainer faster? Winograd F(2x2, 3x3)
and F(4x4, 3x3) against the oneDNN convolution that both trainers run.

On the CPU the training step is the convolutions (91%, docs/benchmarks.md), already at ~90% of
the core's matrix-product rate, so a better *trainer* cannot be much faster there. The one lever
left is fewer multiplications: Winograd's F(m x m, 3x3) (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", CVPR 2016) computes each m x m output tile of a 3x3 stride-1
convolution with (m+2)^2 multiplications instead of 9 m^2: 2.25x fewer in the products for
m = 2, 4x for m = 4 (with larger rounding error), at the cost of transforming inputs and outputs
(memory traffic). oneDNN has no Winograd path on AVX2 hosts, so this writes both in plain torch
ops (autograd gives their backward: the gradient products run in the transformed domain too)
and times them, forward and backward, eager and compiled, against `F.conv2d`, for every
stride-1 3x3 convolution shape of the real network (found by running `build_model` once with
hooks, not typed in), each output first checked against `F.conv2d` (max |difference| / max
|output|). Beside them, the three batched products alone ("products only"): the bound of any
F(m x m, 3x3) kernel, however well its transforms were written. It prints each shape's times and
ratios, and what the network's stride-1 3x3 convolutions would cost per step if each took the
faster of direct and Winograd, and with the bound. Where torch has NNPACK, its convolution too
(forward + backward, and the forward alone, where its own kernels run).

    python benchmarks/winograd.py [--width 64] [--batch 64] [--threads 1] [--repeats 3]
                                  [--compile on|off]
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalestudy.cli import Parser  # noqa: E402
from scalestudy.trainer.models import build_model  # noqa: E402

# F(m x m, 3x3): Y = A^T [(G g G^T) * (B^T d B)] A for an (m+2) x (m+2) input tile d and the
# 3x3 filter g (Lavin and Gray 2016: F(2x2, 3x3) in section 4.1, F(4x4, 3x3) in 4.2). B^T and A^T
# are small constant matrices, so their products are written as weighted sums of strided
# slices (below), which torch.compile fuses into one loop each.
TRANSFORMS = {  # m: (B^T, G, A^T)
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}


def _combine(matrix: list[list[float]], parts: list[torch.Tensor]) -> torch.Tensor:
    """matrix @ parts over a new leading dim: each row a weighted sum of the parts."""
    rows = []
    for row in matrix:
        terms = [
            p if c == 1 else -p if c == -1 else c * p for c, p in zip(row, parts, strict=True) if c
        ]
        rows.append(functools.reduce(torch.add, terms))
    return torch.stack(rows)


def _input_transform(x: torch.Tensor, dim: int, tiles: int, m: int) -> torch.Tensor:
    """B^T d along `dim` for `tiles` (m+2)-wide windows at stride m: a new leading dim of m+2."""
    span = m * (tiles - 1) + 1
    d = [x.narrow(dim, j, span).unfold(dim, 1, m).squeeze(-1) for j in range(m + 2)]
    return _combine(TRANSFORMS[m][0], d)


def winograd_conv3x3(x: torch.Tensor, weight: torch.Tensor, m: int = 2) -> torch.Tensor:
    """F.conv2d(x, weight, padding=1) (stride 1, no bias) by Winograd F(m x m, 3x3), m 2 or 4:
    (m+2)^2 batched matrix products of (tiles x C_in) @ (C_in x C_out)."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    a = m + 2
    th, tw = -(-h // m), -(-w // m)  # m x m output tiles per image
    xp = F.pad(x, (1, m * tw + 1 - w, 1, m * th + 1 - h))
    v = _input_transform(_input_transform(xp, 3, tw, m), 3, th, m)  # a, a, n, c, th, tw
    v = v.permute(0, 1, 3, 2, 4, 5).reshape(a * a, c, n * th * tw)
    g = torch.tensor(TRANSFORMS[m][1], dtype=weight.dtype)
    u = torch.einsum("ij,kcjl,ml->imck", g, weight, g).reshape(a * a, c, k)
    prod = torch.bmm(v.transpose(1, 2), u).view(a, a, n, th, tw, k)
    a_t = TRANSFORMS[m][2]
    rows = _combine(a_t, [prod[i] for i in range(a)])  # m (row), a, n, th, tw, k
    y = _combine(a_t, [rows[:, j] for j in range(a)])  # m (column), m (row), n, th, tw, k
    y = y.permute(2, 5, 3, 1, 4, 0).reshape(n, k, m * th, m * tw)
    return y[:, :, :h, :w]


def direct_conv3x3(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, weight, padding=1)


def nnpack_conv3x3(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same convolution by the NNPACK that torch bundles (its own Winograd/FFT kernels for
    AVX2; torch's backward of it is the generic convolution backward)."""
    return torch._nnpack_spatial_convolution(x, weight, None, [1, 1], [1, 1])


def best_ms(run, repeats: int, prepare=tuple) -> float:
    """The fastest of `repeats` timed calls run(*prepare()) in ms, after one untimed call;
    prepare's work (fresh autograd leaves) stays out of the time."""
    best = float("inf")
    for i in range(repeats + 1):
        args = prepare()
        start = time.perf_counter()
        run(*args)
        if i:
            best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def forward_ms(conv, x: torch.Tensor, weight: torch.Tensor, repeats: int) -> float:
    """The fastest of `repeats` forward passes in ms (no autograd), after one untimed pass."""
    with torch.no_grad():
        return best_ms(lambda: conv(x, weight), repeats)


def stride1_3x3_shapes(width: int, batch: int) -> collections.Counter:
    """(C_in, C_out, H, W) -> how many of the network's convolutions have it: the 3x3, stride-1,
    padding-1 convolutions of one forward of build_model('resnet18') on a CIFAR batch."""
    model = build_model("resnet18", num_classes=10, width=width, in_channels=3)
    shapes: collections.Counter = collections.Counter()

    def record(module, inputs, _output):
        _, c, h, w = inputs[0].shape
        shapes[(c, module.out_channels, h, w)] += 1

    for module in model.modules():
        if (
            isinstance(module, nn.Conv2d)
            and module.kernel_size == (3, 3)
            and module.stride == (1, 1)
            and module.padding == (1, 1)
            and module.groups == 1
            and module.dilation == (1, 1)
        ):
            module.register_forward_hook(record)
    with torch.no_grad():
        model(torch.zeros(batch, 3, 32, 32))
    return shapes


def fwd_bwd_ms(conv, x: torch.Tensor, weight: torch.Tensor, repeats: int) -> float:
    """The fastest of `repeats` forward + backward passes in ms, after one untimed pass."""

    def step(xi: torch.Tensor, wi: torch.Tensor) -> None:
        y = conv(xi, wi)
        y.backward(torch.ones_like(y))

    def leaves() -> tuple[torch.Tensor, torch.Tensor]:
        return x.detach().requires_grad_(), weight.detach().requires_grad_()

    return best_ms(step, repeats, leaves)


def products_ms(c: int, k: int, h: int, w: int, batch: int, m: int, repeats: int) -> float:
    """The three batched products of one F(m x m, 3x3) forward + backward alone, in ms (fastest
    of `repeats` after one untimed): forward v @ u, input gradient g @ u^T, weight gradient
    v^T @ g, with the transposed operands as the backward has them. What a Winograd kernel
    whose transforms cost nothing would take: the bound of any F(m x m, 3x3) implementation."""
    p = batch * -(-h // m) * -(-w // m)
    a2 = (m + 2) ** 2
    v, u, g = torch.randn(a2, p, c), torch.randn(a2, c, k), torch.randn(a2, p, k)
    return best_ms(
        lambda: (torch.bmm(v, u), torch.bmm(g, u.transpose(1, 2)), torch.bmm(v.transpose(1, 2), g)),
        repeats,
    )


TILES = (2, 4)  # F(2x2, 3x3) and F(4x4, 3x3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="winograd.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="images per rank (local batch)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 per rank)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compile",
        choices=("on", "off"),
        default="on",
        help="also time the Winograd convolutions under torch.compile",
    )
    args = parser.parse_args(argv)
    for flag in ("width", "batch", "threads", "repeats"):  # --repeats 0 printed inf and nan
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # one compiled graph per shape and tile size (10 for the network), all of one function:
    # past dynamo's default limit of 8 the last shapes would silently run eager
    torch._dynamo.config.recompile_limit = 64
    variants = {}  # (m, name) -> the convolution
    for m in TILES:
        variants[m, "eager"] = functools.partial(winograd_conv3x3, m=m)
        if args.compile == "on":
            variants[m, "compiled"] = torch.compile(variants[m, "eager"], dynamic=False)

    # torch's NNPACK works only after this call has initialised it (else every call fails)
    nnpack = torch.backends.nnpack.is_available()
    shapes = stride1_3x3_shapes(args.width, args.batch)
    print(
        f"width {args.width}, batch {args.batch}, {args.threads} thread(s), forward + backward,"
        f" best of {args.repeats}; torch {torch.__version__}"
    )
    direct_total = 0.0
    best = {m: 0.0 for m in (*TILES, "either")}  # the faster of direct and Winograd, per shape
    bound = {m: 0.0 for m in TILES}  # the same with the products-only bound
    for (c, k, h, w), count in sorted(shapes.items(), key=lambda item: -item[0][2]):
        x = torch.randn(args.batch, c, h, w)
        weight = torch.randn(k, c, 3, 3) * (2.0 / (9 * c)) ** 0.5
        reference = direct_conv3x3(x, weight)
        direct = fwd_bwd_ms(direct_conv3x3, x, weight, args.repeats)
        print(f"  {c:>4}->{k:<4} {h:>2}x{w:<2} x{count}: direct {direct:.3g} ms")
        direct_total += count * direct
        fastest = direct
        for m in TILES:
            got = winograd_conv3x3(x, weight, m)
            error = (got - reference).abs().max() / reference.abs().max()
            times = {
                name: fwd_bwd_ms(fn, x, weight, args.repeats)
                for (mm, name), fn in variants.items()
                if mm == m
            }
            only = products_ms(c, k, h, w, args.batch, m, args.repeats)
            row = "  ".join(
                f"{name} {ms:.3g} ms ({direct / ms:.2f}x)" for name, ms in times.items()
            )
            print(
                f"    F({m}x{m},3x3): {row}  products only {only:.3g} ms ({direct / only:.2f}x)"
                f"  rel. error {error:.1e}"
            )
            best[m] += count * min(direct, *times.values())
            bound[m] += count * min(direct, only)
            fastest = min(fastest, *times.values())
        best["either"] += count * fastest
        if nnpack:
            error = (nnpack_conv3x3(x, weight) - reference).abs().max() / reference.abs().max()
            both = fwd_bwd_ms(nnpack_conv3x3, x, weight, args.repeats)
            fwd = forward_ms(nnpack_conv3x3, x, weight, args.repeats)
            fwd_direct = forward_ms(direct_conv3x3, x, weight, args.repeats)
            print(
                f"    NNPACK: {both:.3g} ms ({direct / both:.2f}x); forward only {fwd:.3g} ms"
                f" vs direct {fwd_direct:.3g} ms ({fwd_direct / fwd:.2f}x)  rel. error {error:.1e}"
            )
    print(f"stride-1 3x3 convolutions per step: direct {direct_total:.0f} ms")
    for m in TILES:
        print(
            f"  F({m}x{m},3x3): the faster of direct and it per shape {best[m]:.0f} ms"
            f" ({direct_total / best[m]:.2f}x); with free transforms (the products only)"
            f" {bound[m]:.0f} ms ({direct_total / bound[m]:.2f}x)"
        )
    print(
        f"  the fastest of direct and Winograd per shape {best['either']:.0f} ms"
        f" ({direct_total / best['either']:.2f}x): {direct_total - best['either']:.0f} ms saved"
        " per step"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
