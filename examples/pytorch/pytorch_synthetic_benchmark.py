"""Training throughput on synthetic images, with Horovod's benchmark flags.

    horovodrun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --no-cuda
    horovodrun -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --no-cuda \
        --model resnet18 --image-size 64 --batch-size 16 --num-iters 5

The models are written here in plain torch (no torchvision needed): the ResNet family with the
torchvision layer layout (resnet50 is the default, as in Horovod) and a small CNN for quick runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="resnet50", choices=sorted(MODELS), help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm to do reduction")
    parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
    parser.add_argument("--num-classes", type=int, default=1000)
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


# -- models -----------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.downsample = _shortcut(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


def _shortcut(inplanes: int, outplanes: int, stride: int) -> nn.Module | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, inplanes = [], 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stage = []
            for j in range(blocks):
                stage.append(block(inplanes, planes, stride=2 if i > 0 and j == 0 else 1))
                inplanes = planes * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SmallCNN(nn.Module):
    """A few convolutions: for runs that must finish in seconds on a CPU."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


MODELS = {
    "resnet18": lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n),
    "resnet34": lambda n: ResNet(BasicBlock, [3, 4, 6, 3], n),
    "resnet50": lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n),
    "resnet101": lambda n: ResNet(Bottleneck, [3, 4, 23, 3], n),
    "resnet152": lambda n: ResNet(Bottleneck, [3, 8, 36, 3], n),
    "small_cnn": SmallCNN,
}


# -- benchmark ---------------------------------------------------------------------------------------------
def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


def main() -> None:
    args = parse_args()
    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # Horovod: one GPU per process
    else:
        torch.set_num_threads(1)  # one core per rank
    device = torch.device("cuda" if args.cuda else "cpu")

    model = MODELS[args.model](args.num_classes).to(device)
    # Adasum takes no learning-rate scaling; averaging needs the effective batch's rate.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, args.num_classes, (args.batch_size,), device=device)

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    unit = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {unit}s: {hvd.size()}")
    log("Running warmup...")
    for _ in range(args.num_warmup_batches):
        benchmark_step()
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        if args.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            benchmark_step()
        if args.cuda:
            torch.cuda.synchronize()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        log(f"Iter #{i}: {rate:.1f} img/sec per {unit}")
        rates.append(rate)

    mean = statistics.fmean(rates)
    spread = 1.96 * statistics.pstdev(rates)  # ~95% interval
    log(f"Img/sec per {unit}: {mean:.1f} +-{spread:.1f}")
    log(f"Total img/sec on {hvd.size()} {unit}(s): {hvd.size() * mean:.1f} +-{hvd.size() * spread:.1f}")


if __name__ == "__main__":
    main()
