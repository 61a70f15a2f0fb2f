"""The two networks of the study.

`resnet18`: torchvision's ResNet-18 with the CIFAR stem (3x3 stride-1 conv, no max-pool), the
network CIFAR ResNet-18 results are quoted for (11,173,962 parameters at width 64, 0.56 GMAC per
32x32 image).
torchvision's ImageNet stem (7x7 stride 2 + max-pool) shrinks a 32x32 image to 8x8 before layer1, is
~15x cheaper and reaches far lower accuracy, so it would not measure the usual workload.

The network has torchvision's structure and attribute names (conv1, bn1, layer1..layer4, fc; in
each block conv1, bn1, relu, conv2, bn2, downsample), built in torchvision's order and initialised
as torchvision does, so at width 64 its state_dict matches torchvision's resnet18 with the stem
replaced, and a seed gives the same weights (tests/test_flops.py checks both against
torchvision). `BasicBlock` is written here rather than imported: `import torchvision` imports
torch._dynamo through torchvision.ops, 2.7 s of the trainer's import on a 2-core machine (`python
-X importtime`), paid before a bad flag could be refused. A DDP rank imports torch._dynamo later
anyway (DDP's constructor reads its config), so training itself saves only torchvision's own
~0.2 s. `width` scales every stage (W, 2W, 4W, 8W) so CPU tests train in seconds.

`cnn`: a small MNIST-sized network (two conv layers, one hidden linear layer).

`training_flops_per_image`: the FLOPs one training image costs (forward + backward), counted by
torch.utils.flop_counter on the network itself, never typed in by hand: the numerator of MFU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from scalestudy import vocab


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, the input (or its 1x1
    projection, `downsample`, where the shape changes) added before the last ReLU. Modules are
    created in torchvision's order, so the RNG draws of their default initialisation match."""

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class CifarResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.inplanes = width
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()  # the CIFAR stem keeps 32x32 resolution into layer1
        self.layer1 = self._make_layer(width, blocks=2, stride=1)
        self.layer2 = self._make_layer(2 * width, blocks=2, stride=2)
        self.layer3 = self._make_layer(4 * width, blocks=2, stride=2)
        self.layer4 = self._make_layer(8 * width, blocks=2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * width, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes: int = 10, width: int = 64, in_channels: int = 3) -> nn.Module:
    return CifarResNet18(num_classes=num_classes, width=width, in_channels=in_channels)


def cnn(num_classes: int = 10, width: int = 32, in_channels: int = 1) -> nn.Module:
    """Two 3x3 convs (W, 2W channels), 2x2 max-pool, a 128-unit hidden layer; any input size."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(7),  # fixed-size head whatever the input resolution
        nn.Flatten(),
        nn.Linear(2 * width * 49, 128),
        nn.ReLU(inplace=True),
        nn.Linear(128, num_classes),
    )


def build_model(name: str, *, num_classes: int, width: int, in_channels: int) -> nn.Module:
    if name == "resnet18":
        return resnet18(num_classes=num_classes, width=width, in_channels=in_channels)
    if name == "cnn":
        return cnn(num_classes=num_classes, width=width, in_channels=in_channels)
    raise ValueError(f"model must be one of {vocab.MODELS}, got {name!r}")


# images of the counting batch: any size gives the same per-image count (every counted op is
# linear in the batch); 2 keeps BatchNorm's training-mode statistics defined
FLOP_COUNT_BATCH = 2


def training_flops_per_image(
    name: str, *, num_classes: int, width: int, image_shape: tuple[int, int, int]
) -> int:
    """FLOPs of one training image: forward and backward of the network on a batch, counted by
    torch.utils.flop_counter.FlopCounterMode (2 FLOPs per multiply-add; the ops it has formulas
    for: convolutions and matrix products, the usual MFU convention; BN, ReLU, the loss and the
    optimizer step are not counted), divided by the batch. Runs on the meta device: no memory, no
    arithmetic, a fraction of a second. The backward counts what autograd runs: the first
    convolution has no input gradient, so the total is slightly under 3 x forward (CIFAR
    ResNet-18 at width 64: 3.329 GFLOP, forward 1.111). image_shape: C x H x W."""
    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, width=width, in_channels=image_shape[0])
        x = torch.empty(FLOP_COUNT_BATCH, *image_shape)
        y = torch.zeros(FLOP_COUNT_BATCH, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() // FLOP_COUNT_BATCH
