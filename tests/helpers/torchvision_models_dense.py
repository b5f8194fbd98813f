"""torchvision's MobileNetV2 (inverted residuals: 1x1 expansion, 3x3
depthwise, 1x1 linear projection, ReLU6) and DenseNet-121 (BN-ReLU-conv
dense layers concatenated onto their block's input, transitions halving the
channels and the image), written in spmdnet the way a torchvision user
writes them against ``torch``: same construction order, same initialisation
loops, same module names (``state_dict()`` keys equal torchvision's)."""
from collections import OrderedDict

import spmdnet as torch
import spmdnet.nn.functional as F
from spmdnet import nn


def _make_divisible(v, divisor=8):
    """The nearest multiple of ``divisor`` to ``v``, at least ``divisor``,
    never below 90% of ``v`` (MobileNet's channel rounding)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNReLU6(nn.Sequential):
    """torchvision's ``Conv2dNormActivation`` as MobileNetV2 uses it:
    "same" padding, no bias, BatchNorm, ReLU6; children named 0, 1, 2."""

    def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups,
                      bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = [ConvBNReLU6(inp, hidden, kernel_size=1)] if expand_ratio != 1 else []
        layers += [ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
                   nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


# expansion t, channels c, repeats n, first stride s
MOBILENET_V2_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                        [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000, dropout=0.2):
        super().__init__()
        cin, last = _make_divisible(32), _make_divisible(1280)
        features = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in MOBILENET_V2_SETTING:
            cout = _make_divisible(c)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU6(cin, last, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes=1000):
    return MobileNetV2(num_classes)


class _DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv to ``bn_size * growth`` channels, BN-ReLU-3x3 conv
    to ``growth``, on the concatenation of every earlier output."""

    def __init__(self, cin, growth_rate, bn_size):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1,
                               padding=1, bias=False)

    def forward(self, features):
        out = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(out)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, cin, bn_size, growth_rate):
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"denselayer{i + 1}",
                            _DenseLayer(cin + i * growth_rate, growth_rate, bn_size))

    def forward(self, x):
        features = [x]
        for _, layer in self.items():
            features.append(layer(features))
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, kernel_size=1, stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNet(nn.Module):
    def __init__(self, growth_rate=32, block_config=(6, 12, 24, 16), num_init_features=64,
                 bn_size=4, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(OrderedDict([
            ("conv0", nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3,
                                bias=False)),
            ("norm0", nn.BatchNorm2d(num_init_features)),
            ("relu0", nn.ReLU(inplace=True)),
            ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
        ]))
        channels = num_init_features
        for i, num_layers in enumerate(block_config):
            self.features.add_module(f"denseblock{i + 1}",
                                     _DenseBlock(num_layers, channels, bn_size, growth_rate))
            channels += num_layers * growth_rate
            if i != len(block_config) - 1:
                self.features.add_module(f"transition{i + 1}",
                                         _Transition(channels, channels // 2))
                channels //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(channels))
        self.classifier = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        out = F.relu(self.features(x), inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        return self.classifier(torch.flatten(out, 1))


def densenet121(num_classes=1000):
    return DenseNet(32, (6, 12, 24, 16), 64, num_classes=num_classes)
