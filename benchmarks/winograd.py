"""Could a different convolution algorithm make the CPU trainer faster? Winograd F(2x2, 3x3)
against the oneDNN convolution that both trainers run.

On the CPU the training step is the convolutions (91%, docs/benchmarks.md), already at ~90% of
the core's matrix-product rate, so a better *trainer* cannot be much faster there. The one lever
left is fewer multiplications: Winograd's F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", CVPR 2016) computes each 2x2 output tile of a 3x3 stride-1
convolution with 16 multiplications instead of 36, i.e. 2.25x fewer in the products, at the
cost of transforming inputs and outputs (memory traffic). oneDNN has no Winograd path on AVX2
hosts, so this writes it in plain torch ops (autograd gives its backward: the gradient products
run in the transformed domain too) and times it, forward and backward, against `F.conv2d`, for
every stride-1 3x3 convolution shape of the real network (found by running `build_model` once
with hooks, not typed in), each output first checked against `F.conv2d` (max |difference| /
max |output|). Beside it, the three batched products alone ("products only"): the bound of any
F(2x2, 3x3) kernel, however well its transforms were written. It prints each shape's times and
ratios, and what the network's stride-1 3x3 convolutions would cost per step if each took the
faster of direct and Winograd, and with the bound.

    python benchmarks/winograd.py [--width 64] [--batch 64] [--threads 1] [--repeats 3]
                                  [--compile on|off]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from scalestudy.trainer.models import build_model  # noqa: E402

# F(2x2, 3x3): Y = A^T [(G g G^T) * (B^T d B)] A for a 4x4 input tile d and the 3x3 filter g
# (Lavin and Gray 2016, section 4.1). B^T and A^T are 0/+-1 matrices, so their products are
# written as adds of strided slices (below), which torch.compile fuses into one loop each.
G = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=torch.float32)


def _input_transform(x: torch.Tensor, dim: int, tiles: int) -> torch.Tensor:
    """B^T d along `dim` for `tiles` 4-wide windows at stride 2: a new leading dim of 4."""
    d = [x.narrow(dim, j, 2 * tiles - 1).unfold(dim, 1, 2).squeeze(-1) for j in range(4)]
    return torch.stack([d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]])


def winograd_conv3x3(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.conv2d(x, weight, padding=1) (stride 1, no bias) by Winograd F(2x2, 3x3): 16 batched
    matrix products of (tiles x C_in) @ (C_in x C_out)."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    th, tw = (h + 1) // 2, (w + 1) // 2  # 2x2 output tiles per image
    xp = F.pad(x, (1, 2 * tw + 1 - w, 1, 2 * th + 1 - h))
    v = _input_transform(_input_transform(xp, 3, tw), 3, th)  # 4, 4, n, c, th, tw
    v = v.permute(0, 1, 3, 2, 4, 5).reshape(16, c, n * th * tw)
    u = torch.einsum("ij,kcjl,ml->imck", G, weight, G).reshape(16, c, k)
    m = torch.bmm(v.transpose(1, 2), u).view(4, 4, n, th, tw, k)
    # A^T m A: rows, then columns
    r = torch.stack([m[0] + m[1] + m[2], m[1] - m[2] - m[3]])
    y = torch.stack([r[:, 0] + r[:, 1] + r[:, 2], r[:, 1] - r[:, 2] - r[:, 3]], 1)
    y = y.permute(2, 5, 3, 0, 4, 1).reshape(n, k, 2 * th, 2 * tw)  # n, k, th, 2, tw, 2
    return y[:, :, :h, :w]


def direct_conv3x3(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, weight, padding=1)


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
    best = float("inf")
    for i in range(repeats + 1):
        xi = x.detach().requires_grad_()
        wi = weight.detach().requires_grad_()
        start = time.perf_counter()
        y = conv(xi, wi)
        y.backward(torch.ones_like(y))
        if i:
            best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def products_ms(c: int, k: int, h: int, w: int, batch: int, repeats: int) -> float:
    """The three batched products of one Winograd forward + backward alone, in ms (fastest of
    `repeats` after one untimed): forward v @ u, input gradient g @ u^T, weight gradient
    v^T @ g, with the transposed operands as the backward has them. What a Winograd kernel
    whose transforms cost nothing would take: the bound of any F(2x2, 3x3) implementation."""
    p = batch * ((h + 1) // 2) * ((w + 1) // 2)
    v, u, g = torch.randn(16, p, c), torch.randn(16, c, k), torch.randn(16, p, k)
    best = float("inf")
    for i in range(repeats + 1):
        start = time.perf_counter()
        torch.bmm(v, u), torch.bmm(g, u.transpose(1, 2)), torch.bmm(v.transpose(1, 2), g)
        if i:
            best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="images per rank (local batch)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1 per rank)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compile",
        choices=("on", "off"),
        default="on",
        help="also time the Winograd convolution under torch.compile",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    variants = {"winograd": winograd_conv3x3}
    if args.compile == "on":
        variants["winograd compiled"] = torch.compile(winograd_conv3x3, dynamic=False)

    shapes = stride1_3x3_shapes(args.width, args.batch)
    print(
        f"width {args.width}, batch {args.batch}, {args.threads} thread(s), forward + backward,"
        f" best of {args.repeats}; torch {torch.__version__}"
    )
    direct_total, best_total, bound_total = 0.0, 0.0, 0.0
    for (c, k, h, w), count in sorted(shapes.items(), key=lambda item: -item[0][2]):
        x = torch.randn(args.batch, c, h, w)
        weight = torch.randn(k, c, 3, 3) * (2.0 / (9 * c)) ** 0.5
        reference = direct_conv3x3(x, weight)
        error = (winograd_conv3x3(x, weight) - reference).abs().max() / reference.abs().max()
        direct = fwd_bwd_ms(direct_conv3x3, x, weight, args.repeats)
        times = {name: fwd_bwd_ms(fn, x, weight, args.repeats) for name, fn in variants.items()}
        times["products only"] = bound = products_ms(c, k, h, w, args.batch, args.repeats)
        row = "  ".join(f"{name} {ms:.2f} ms ({direct / ms:.2f}x)" for name, ms in times.items())
        print(
            f"  {c:>4}->{k:<4} {h:>2}x{w:<2} x{count}: direct {direct:.2f} ms  {row}"
            f"  rel. error {error:.1e}"
        )
        direct_total += count * direct
        best_total += count * min(direct, *(times[name] for name in variants))
        bound_total += count * min(direct, bound)
    print(
        f"stride-1 3x3 convolutions per step: direct {direct_total:.0f} ms, the faster of the two"
        f" per shape {best_total:.0f} ms: {direct_total - best_total:.0f} ms saved per step"
        f" ({direct_total / best_total:.2f}x on these convolutions); with free transforms (the"
        f" products only) {bound_total:.0f} ms ({direct_total / bound_total:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
