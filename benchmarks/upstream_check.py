"""The model libraries themselves, as their authors write them: each model built by its library's own
constructor (timm, MONAI, segmentation-models-pytorch, diffusers; transformers through :data:`EXTRA`),
traced for its parameters in train mode as blocks (the CLI's default), generated, bound to the model, and
checked in float64 against autograd through the original module at another batch and size: one step's
gradients and loss, then three SGD steps' parameters; then the generated test file runs in its own process.

    PYTHONPATH=../shared/upstream/torchvision_stub /work/upvenv/bin/python -m benchmarks.upstream_check \
        [--only LABEL ...] [--output benchmarks/results/upstream.md [--append]] [--timeout S]

Not part of the suite and never run by CI: it needs the libraries that ``../shared/upstream/setup.sh``
installs (pinned) and the torchvision stand-in beside it; a row whose library is missing says so. Each
model runs in its own process (``--one LABEL``) under ``--timeout``, so a hang or a crash costs one row.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10
"""Largest difference from autograd allowed, relative to the largest gradient (or parameter)."""


@dataclass
class Model:
    family: str
    build: Callable[[], torch.nn.Module]
    traced: dict[str, tuple[int, ...]]
    checked: dict[str, tuple[int, ...]]
    loss: str = "cross_entropy"
    dtypes: dict[str, str] = field(default_factory=dict)
    stub: bool = True
    """Run with the torchvision stand-in on ``PYTHONPATH`` (timm, smp, MONAI; not transformers, and not diffusers,
    whose ``UNet2DModel`` import reaches ``torchvision.io``, which the stand-in lacks)."""
    modes: str = ""
    """``--modes`` entries set after the whole model is put in train mode (the fix a refusal printed)."""
    static: bool = False
    """Traced with ``static_sizes=True`` (the fix a refusal of code that follows the input's size prints, where
    the library cannot be edited): checked at the traced shapes, which its guards alone take."""


def _timm(name: str, **options) -> Callable[[], torch.nn.Module]:
    def build():
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **options)

    return build


def _monai(name: str, **options) -> Callable[[], torch.nn.Module]:
    def build():
        from monai.networks import nets

        return getattr(nets, name)(**options)

    return build


def _smp(name: str, **options) -> Callable[[], torch.nn.Module]:
    def build():
        import segmentation_models_pytorch as smp

        return getattr(smp, name)(encoder_weights=None, classes=2, **options)

    return build


class Denoiser(torch.nn.Module):
    """diffusers' UNet as a diffusion training step calls it: noisy images and a per-sample int64
    timestep in, the predicted noise (``.sample``) out."""

    def __init__(self, unet: torch.nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep):
        return self.unet(sample, timestep).sample


def _diffusers(name: str, **options) -> Callable[[], torch.nn.Module]:
    def build():
        import diffusers

        return Denoiser(getattr(diffusers, name)(**options))

    return build


def _image(size: int, other: tuple[int, int], channels: int = 3) -> tuple[dict, dict]:
    return {"x": (2, channels, size, size)}, {"x": (3, channels, *other)}


def _timm_cnn(name: str, size: int = 32, other=(64, 32), **options) -> Model:
    return Model("timm CNN", _timm(name, **options), *_image(size, other))


def _timm_vit(name: str, size: int = 32, other=None, **options) -> Model:
    traced, checked = _image(size, other or (size, size))
    return Model("timm ViT/hybrid", _timm(name, **options), traced, checked)


_UNET_2D = dict(
    sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4
)
_SWINUNETR_2D = Model(
    "MONAI",
    _monai(
        "SwinUNETR",
        in_channels=1,
        out_channels=2,
        feature_size=12,
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 1, 1),
        spatial_dims=2,
    ),
    {"x_in": (2, 1, 64, 64)},
    {"x_in": (3, 1, 128, 64)},
    loss="mse_loss",
)
"""MONAI's SwinUNETR in 2-d, small; also traced with ``--static-sizes`` (the fix its refusal prints)."""
_SMP_UNET_EFFICIENTNET = Model(
    "smp",
    _smp("Unet", encoder_name="tu-efficientnet_b0", encoder_depth=3, decoder_channels=(32, 16, 8)),
    *_image(32, (64, 32)),
    loss="mse_loss",
)
"""smp's U-Net on a timm EfficientNet encoder; also traced with ``--modes`` (the fix its refusal prints)."""
MODELS: dict[str, Model] = {
    # timm CNNs, their smallest variants at 32x32, checked at 64x32 (batch 3)
    "resnet10t": _timm_cnn("resnet10t"),
    "resnet18": _timm_cnn("resnet18"),
    "resnet26d": _timm_cnn("resnet26d"),
    "seresnext26d_32x4d": _timm_cnn("seresnext26d_32x4d"),
    "efficientnet_b0": _timm_cnn("efficientnet_b0"),
    "mobilenetv3_small_050": _timm_cnn("mobilenetv3_small_050"),
    "mobilenetv2_050": _timm_cnn("mobilenetv2_050"),
    "mobilenetv4_conv_small": _timm_cnn("mobilenetv4_conv_small"),
    "mixnet_s": _timm_cnn("mixnet_s"),
    "regnetx_002": _timm_cnn("regnetx_002"),
    "regnety_002": _timm_cnn("regnety_002"),
    "convnext_atto": _timm_cnn("convnext_atto"),
    "convnextv2_atto": _timm_cnn("convnextv2_atto"),
    "ghostnet_050": _timm_cnn("ghostnet_050"),
    "resnest14d": _timm_cnn("resnest14d"),
    "hgnetv2_b0": _timm_cnn("hgnetv2_b0"),
    "rexnet_100": _timm_cnn("rexnet_100"),
    "lcnet_050": _timm_cnn("lcnet_050"),
    "densenet121": _timm_cnn("densenet121"),
    "dla34": _timm_cnn("dla34"),
    "tresnet_m": _timm_cnn("tresnet_m"),
    "cs3darknet_focus_s": _timm_cnn("cs3darknet_focus_s"),
    "resnetv2_50x1_bit": _timm_cnn("resnetv2_50x1_bit"),
    "repvgg_a0": _timm_cnn("repvgg_a0"),
    "ese_vovnet19b_dw": _timm_cnn("ese_vovnet19b_dw"),
    "nf_resnet26": _timm_cnn("nf_resnet26"),
    # timm ViT, DeiT, Swin and hybrids (the plain transformers' depth cut to 2; their image size is fixed
    # where the model fixes it)
    "vit_tiny_patch16_224": _timm_vit(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, dynamic_img_size=False
    ),
    "deit_tiny_distilled_patch16_224": _timm_vit("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2),
    "swin_tiny_patch4_window7_224": _timm_vit(
        "swin_tiny_patch4_window7_224", size=64, img_size=64, window_size=4, depths=(1, 1, 2, 1)
    ),
    "swinv2_tiny_window8_256": _timm_vit(
        "swinv2_tiny_window8_256", size=64, img_size=64, window_size=4, depths=(1, 1, 2, 1)
    ),
    "coatnet_nano_rw_224": _timm_vit("coatnet_nano_rw_224", size=64, img_size=64),
    "maxvit_nano_rw_256": _timm_vit("maxvit_nano_rw_256", size=64, img_size=64),
    "efficientformerv2_s0": _timm_vit("efficientformerv2_s0", size=64, img_size=64),
    "mobilevit_xxs": _timm_vit("mobilevit_xxs", size=64, other=(128, 64)),  # its branches as traced (below)
    "levit_128s": _timm_vit("levit_128s", size=32, img_size=32),
    "repvit_m1": _timm_vit("repvit_m1", size=32, other=(48, 32)),
    "botnet26t_256": _timm_vit("botnet26t_256", size=64, img_size=64),
    "edgenext_xx_small": _timm_vit("edgenext_xx_small", size=64, other=(96, 64)),
    "fastvit_t8": _timm_vit("fastvit_t8", size=32, other=(48, 32)),
    "poolformer_s12": _timm_vit("poolformer_s12", size=32, other=(48, 32)),
    "pvt_v2_b0": _timm_vit("pvt_v2_b0", size=32, other=(48, 32)),
    # the fix the three refusals of code that follows the input's size print (pvt_v2.py:295, edgenext.py:81,
    # swin_unetr.py:596): a trace at fixed sizes, checked at those sizes (another batch is refused, as it must be)
    "pvt_v2_b0 --static-sizes": Model(
        "timm ViT/hybrid", _timm("pvt_v2_b0"), {"x": (2, 3, 32, 32)}, {"x": (2, 3, 32, 32)}, static=True
    ),
    "edgenext_xx_small --static-sizes": Model(
        "timm ViT/hybrid", _timm("edgenext_xx_small"), {"x": (2, 3, 64, 64)}, {"x": (2, 3, 64, 64)}, static=True
    ),
    # MONAI
    "monai_unet_2d": Model(
        "MONAI",
        _monai(
            "UNet", spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1
        ),
        *_image(32, (24, 40), 1),
        loss="mse_loss",
    ),
    "monai_basicunet_2d": Model(
        "MONAI",
        _monai("BasicUNet", spatial_dims=2, in_channels=1, out_channels=2, features=(4, 4, 8, 8, 16, 4)),
        *_image(32, (48, 32), 1),
        loss="mse_loss",
    ),
    "monai_segresnet_3d": Model(
        "MONAI",
        _monai(
            "SegResNet",
            spatial_dims=3,
            in_channels=1,
            out_channels=2,
            init_filters=8,
            blocks_down=(1, 1),
            blocks_up=(1,),
        ),
        {"x": (2, 1, 8, 8, 8)},
        {"x": (3, 1, 12, 8, 16)},
        loss="mse_loss",
    ),
    "monai_attentionunet_2d": Model(
        "MONAI",
        _monai("AttentionUnet", spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8, 16), strides=(2, 2)),
        *_image(32, (24, 40), 1),
        loss="mse_loss",
    ),
    "monai_dynunet_2d": Model(
        "MONAI",
        _monai(
            "DynUNet",
            spatial_dims=2,
            in_channels=1,
            out_channels=2,
            kernel_size=(3, 3, 3),
            strides=(1, 2, 2),
            upsample_kernel_size=(2, 2),
            filters=(4, 8, 16),
        ),
        *_image(32, (24, 40), 1),
        loss="mse_loss",
    ),
    "monai_unetr_3d": Model(
        "MONAI",
        _monai(
            "UNETR",
            in_channels=1,
            out_channels=2,
            img_size=(16, 16, 16),
            feature_size=4,
            hidden_size=32,
            mlp_dim=64,
            num_heads=2,
            spatial_dims=3,
        ),
        {"x_in": (2, 1, 16, 16, 16)},
        {"x_in": (3, 1, 16, 16, 16)},
        loss="mse_loss",
    ),
    "monai_swinunetr_2d": _SWINUNETR_2D,
    "monai_swinunetr_2d --static-sizes": replace(_SWINUNETR_2D, checked=_SWINUNETR_2D.traced, static=True),
    # segmentation-models-pytorch
    "smp_unet_resnet18": Model(
        "smp",
        _smp("Unet", encoder_name="resnet18", encoder_depth=3, decoder_channels=(32, 16, 8)),
        *_image(32, (64, 32)),
        loss="mse_loss",
    ),
    "smp_fpn_resnet18": Model("smp", _smp("FPN", encoder_name="resnet18"), *_image(64, (96, 64)), loss="mse_loss"),
    "smp_deeplabv3plus_resnet18": Model(
        "smp", _smp("DeepLabV3Plus", encoder_name="resnet18"), *_image(64, (96, 64)), loss="mse_loss"
    ),
    "smp_linknet_resnet18": Model(
        "smp", _smp("Linknet", encoder_name="resnet18"), *_image(32, (64, 32)), loss="mse_loss"
    ),
    "smp_unetplusplus_resnet18": Model(
        "smp",
        _smp("UnetPlusPlus", encoder_name="resnet18", encoder_depth=3, decoder_channels=(32, 16, 8)),
        *_image(32, (64, 32)),
        loss="mse_loss",
    ),
    # PAN's pyramid attention pools its 1/16 map three times: 128x128 is the smallest square that runs
    "smp_pan_resnet18": Model("smp", _smp("PAN", encoder_name="resnet18"), *_image(128, (192, 128)), loss="mse_loss"),
    "smp_unet_efficientnet_b0": _SMP_UNET_EFFICIENTNET,
    # with the fix its refusal prints (norm_act.py:136): the blocks whose features the encoder drops in eval mode
    "smp_unet_efficientnet_b0 --modes blocks.3-6=eval": replace(
        _SMP_UNET_EFFICIENTNET, modes=",".join(f"encoder.model.blocks.{index}=eval" for index in range(3, 7))
    ),
    # diffusers: the denoiser of a diffusion training step (a per-sample int64 timestep)
    "diffusers_unet2d": Model(
        "diffusers",
        _diffusers(
            "UNet2DModel",
            **_UNET_2D,
            attention_head_dim=None,
            down_block_types=("DownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "UpBlock2D"),
        ),
        {"sample": (2, 3, 16, 16), "timestep": (2,)},
        {"sample": (3, 3, 24, 16), "timestep": (3,)},
        loss="mse_loss",
        dtypes={"timestep": "int64"},
        stub=False,
    ),
    "diffusers_unet2d_attention": Model(
        "diffusers",
        _diffusers(
            "UNet2DModel",
            **_UNET_2D,
            attention_head_dim=4,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        ),
        {"sample": (2, 3, 16, 16), "timestep": (2,)},
        {"sample": (3, 3, 24, 16), "timestep": (3,)},
        loss="mse_loss",
        dtypes={"timestep": "int64"},
        stub=False,
    ),
}
EXTRA = "SYMGRAD_UPSTREAM_MODELS"
"""An environment variable naming a module (``package.module``) whose ``MODELS`` dict of :class:`Model`
joins these (transformers' models, which run without the torchvision stand-in: ``stub=False``)."""


def models() -> dict[str, Model]:
    found = dict(MODELS)
    if os.environ.get(EXTRA):
        from importlib import import_module

        found.update(import_module(os.environ[EXTRA]).MODELS)
    return found


def _randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Running statistics away from 0 and 1, so that eval mode and the moved statistics are a real test."""
    for name, buffer in model.named_buffers():
        if name.endswith("running_mean"):
            buffer.copy_(torch.randn(buffer.shape, generator=generator, dtype=buffer.dtype))
        elif name.endswith("running_var"):
            buffer.copy_(torch.rand(buffer.shape, generator=generator, dtype=buffer.dtype) + 0.5)


def _data(model: Model, shapes: dict, generator: torch.Generator) -> dict:
    return {
        key: (
            torch.randint(1000, shape, generator=generator)
            if model.dtypes.get(key) == "int64"
            else torch.randn(shape, generator=generator, dtype=torch.float64)
        )
        for key, shape in shapes.items()
    }


def check_one(label: str, model: Model, folder: Path, test_timeout: float, row: dict) -> None:
    """Trace, generate, bind and compare one model; run its generated test file: the row's fields, into
    ``row`` as they come (its ``stage`` says how far it went)."""
    import torch.nn.functional as F

    import symgrad
    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text
    from symgrad.trace import LossChoice, trace

    row["stage"] = "build"
    row["traced"], row["checked"] = (_shapes(model.traced), _shapes(model.checked))
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(11)
    network = model.build().double().train()
    _randomize(network, generator)
    row["parameters"] = sum(value.numel() for value in network.parameters())
    target_name = "labels" if model.loss == "cross_entropy" else "target"
    row["stage"] = "trace"
    start = time.perf_counter()
    if model.modes:  # the whole model in train mode, then each entry, as symgrad trace --modes sets them
        from symgrad.modes import apply_modes

        apply_modes(network, model.modes)
    text = trace(
        network,
        model.traced,
        wrt="parameters",
        name="step",
        loss=LossChoice(model.loss, target_name),
        mode=None if model.modes else "train",
        blocks=True,
        dtypes=model.dtypes,
        static_sizes=model.static,
    )
    row["trace s"] = time.perf_counter() - start
    row["stage"] = "generate"
    start = time.perf_counter()
    rendered = build_text(text, "step.yaml", documents=False).rendered
    row["generate s"] = time.perf_counter() - start
    for name, content in rendered.files.items():
        (folder / name).write_text(content)
    (folder / "step.yaml").write_text(text)
    generated = module_from_source(rendered.files["step.py"], "step")

    row["stage"] = "compare"
    inputs = _data(model, model.checked, generator)
    with torch.no_grad():
        prediction = copy.deepcopy(network)(*inputs.values())
    target = (
        torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
        if target_name == "labels"
        else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
    )
    reference, free = copy.deepcopy(network), copy.deepcopy(network)
    step = symgrad.bind(generated, network)
    mine = torch.optim.SGD(network.parameters(), lr=0.05)
    theirs = torch.optim.SGD(free.parameters(), lr=0.05)
    worst = {"grad error": 0.0, "loss error": 0.0, "buffer error": 0.0}
    for index in range(3):  # each bound step against autograd's from the same parameters and buffers
        reference.load_state_dict(network.state_dict())
        for each in (network, reference, free):
            each.zero_grad()
        torch.manual_seed(7 + index)  # the same dropout masks in all three
        loss = step(**inputs, **{target_name: target})
        loss.backward()
        torch.manual_seed(7 + index)
        expected = getattr(F, model.loss)(reference(*inputs.values()), target)
        expected.backward()
        torch.manual_seed(7 + index)
        getattr(F, model.loss)(free(*inputs.values()), target).backward()
        worst["loss error"] = max(
            worst["loss error"], abs(loss.item() - expected.item()) / max(abs(expected.item()), 1e-300)
        )
        theirs_grads = dict(reference.named_parameters())
        pairs = [(value.grad, theirs_grads[key].grad) for key, value in network.named_parameters()]
        scale = max((b.abs().max().item() for _, b in pairs if b is not None), default=1.0) or 1.0
        worst["grad error"] = max(
            worst["grad error"],
            max(((a - b).abs().max().item() / scale for a, b in pairs if b is not None), default=0.0),
        )
        moved = dict(reference.named_buffers())
        worst["buffer error"] = max(
            [worst["buffer error"]]
            + [
                (value - moved[key]).abs().max().item() / max(moved[key].abs().max().item(), 1.0)
                for key, value in network.named_buffers()
                if value.is_floating_point()
            ]
        )
        mine.step()
        theirs.step()
    row.update(worst)
    # the free-running autograd copy: how far three steps' rounding carries (not a check: a chaotic network
    # carries a one-ulp difference far)
    free_parameters = dict(free.named_parameters())
    row["drift after 3 steps"] = max(
        (value - free_parameters[key]).abs().max().item() for key, value in network.named_parameters()
    )
    row["equal"] = max(worst.values()) <= TOLERANCE

    row["stage"] = "generated tests"
    start, used = time.perf_counter(), _children_cpu()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(folder / "test_step.py")],
            capture_output=True,
            text=True,
            timeout=test_timeout,
            cwd=folder,
        )
        last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()[-200:]
        row["tests"] = (
            last.split(" in ")[0]
            if result.returncode == 0 and "skipped" not in last
            else f"{last.split(' in ')[0]}: {_failure(result.stdout)}"
        )
        row["failed tests"] = [
            line.split("::")[1].split(" ")[0].split("[")[0]
            for line in result.stdout.splitlines()
            if line.startswith("FAILED") and "::" in line
        ]
    except subprocess.TimeoutExpired:
        row["tests"] = f"STOPPED after {test_timeout:.0f} s"
    row["tests s"] = time.perf_counter() - start
    row["tests cpu s"] = _children_cpu() - used
    if "Jacobian mismatch" in row["tests"]:  # the code's or the check's: the same check on autograd's derivatives
        row["stage"] = "gradcheck trust"
        try:
            probe = subprocess.run(
                [sys.executable, "-m", "benchmarks.gradcheck_trust", str(folder)],
                capture_output=True,
                text=True,
                timeout=test_timeout,
                cwd=ROOT,
            )
            row["trust"] = " / ".join(line for line in probe.stdout.splitlines() if line.startswith("grad"))
        except subprocess.TimeoutExpired:
            row["trust"] = f"the autograd comparison STOPPED after {test_timeout:.0f} s"
    row["stage"] = "done"


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's finished children: a test file's own, which a loaded
    machine does not stretch as it stretches the wall-clock time."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _shapes(shapes: dict) -> str:
    return "; ".join(f"{key}={list(shape)}" for key, shape in shapes.items())


def _failure(stdout: str) -> str:
    """The failed tests' names and the first lines of the first failure."""
    failed = [
        line.split("::")[1].split(" - ")[0]
        for line in stdout.splitlines()
        if line.startswith("FAILED") and "::" in line
    ]
    lines = [" ".join(line[1:].split()) for line in stdout.splitlines() if line.startswith("E ")]
    return (", ".join(failed) + ": " + " / ".join(lines[:3]))[:400]


def _one(label: str, output: Path, test_timeout: float) -> int:
    """The child: one model's row as JSON in ``output``, written at every stage (a crash keeps the last)."""
    row: dict = {"label": label}
    try:
        model = models()[label]
        with tempfile.TemporaryDirectory() as temporary:
            check_one(label, model, Path(temporary), test_timeout, row)
    except BaseException as error:  # noqa: BLE001 - one row, the first line of whatever stopped it
        row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[
            :1000
        ]
    output.write_text(json.dumps(row))
    return 0


def _run(label: str, model: Model, timeout: float, test_timeout: float) -> dict:
    environment = dict(os.environ)
    stub = str(ROOT.parent / "shared" / "upstream" / "torchvision_stub")
    parts = [
        part for part in environment.get("PYTHONPATH", "").split(os.pathsep) if part and "torchvision_stub" not in part
    ]
    environment["PYTHONPATH"] = os.pathsep.join(([stub] if model.stub else []) + parts + [str(ROOT)])
    environment.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        start = time.perf_counter()
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.upstream_check",
                    "--one",
                    label,
                    "--json",
                    output.name,
                    "--test-timeout",
                    str(test_timeout),
                ],
                env=environment,
                cwd=ROOT,
                timeout=timeout,
                capture_output=True,
                text=True,
            )
            text = Path(output.name).read_text()
            row = json.loads(text) if text else {"label": label, "error": "the process died without a row"}
        except subprocess.TimeoutExpired:
            row = {"label": label, "error": f"STOPPED after {timeout:.0f} s"}
        row["total s"] = time.perf_counter() - start
    return row


def _verdict(row: dict) -> str:
    if "error" in row:
        refused = any(word in row["error"] for word in ("fix:", "(fix")) and row.get("stage") in ("trace", "generate")
        return "refused" if refused and "bug in symgrad" not in row["error"] else "failing"
    if not row.get("equal"):
        return "failing"
    if not row.get("failed tests") and not str(row.get("tests", "")).startswith("STOPPED"):
        return "equal"
    if str(row.get("tests", "")).startswith("STOPPED"):
        return "equal; test file stopped (time limit)"
    if _only_untrustworthy_checks_failed(row):
        return "equal; the file's gradcheck not meaningful here"
    return "equal, test file fails"


def _only_untrustworthy_checks_failed(row: dict) -> bool:
    """Whether every test that failed is a gradcheck or gradgradcheck that autograd's own derivatives fail too."""
    failed = row.get("failed tests") or []
    verdicts = dict(line.split(" explicit: ", 1) for line in row.get("trust", "").split(" / ") if " explicit: " in line)
    checks = {
        "test_gradcheck_of_the_explicit_backward": "gradcheck",
        "test_gradgradcheck_of_the_explicit_backward": "gradgradcheck",
    }
    return bool(failed) and all(
        checks.get(name) in verdicts and "not meaningful" in verdicts[checks[name]] for name in failed
    )


def _line(row: dict, model: Model | None) -> str:
    def number(key, form="{:.1e}"):
        return form.format(row[key]) if key in row else ""

    detail = f"at {row.get('stage', 'start')}: {row['error']}" if "error" in row else row.get("tests", "")
    if row.get("trust"):
        detail += f" — same check on autograd's derivatives: {row['trust']}"
    return (
        f"| {row['label']} | {model.family if model else ''} | {row.get('traced', '')} | "
        f"{row.get('checked', '')} | {_verdict(row)} | {number('grad error')} | "
        f"{number('drift after 3 steps')} | {number('trace s', '{:.0f}')} | {number('generate s', '{:.0f}')} | "
        f"{number('tests s', '{:.0f}')}{_cpu(row)} | {detail.replace('|', '/')} |"
    )


def _cpu(row: dict) -> str:
    return f" (CPU {row['tests cpu s']:.0f})" if row.get("tests cpu s") else ""


HEADER = [
    "| model | family | traced at | checked at | result | grad error (3 steps) | drift after 3 steps | trace s | "
    "generate s | test file s | stage reached / generated tests |",
    "|---|---|---|---|---|---:|---:|---:|---:|---:|---|",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="labels to run, in this order (default: all)")
    parser.add_argument("--output", type=Path, help="write the Markdown table here too, a row at a time")
    parser.add_argument("--append", action="store_true", help="replace or add these rows in --output's table")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one model may take in all")
    parser.add_argument("--test-timeout", type=float, default=300, help="seconds its generated test file may take")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.one:
        return _one(arguments.one, arguments.json, arguments.test_timeout)
    known = models()
    unknown = [label for label in arguments.only or [] if label not in known]
    if unknown:
        parser.error(f"no such label: {', '.join(unknown)} (labels: {', '.join(known)})")
    rows: dict[str, str] = {}
    if arguments.append and arguments.output and arguments.output.exists():
        rows = {
            line.split("|")[1].strip(): line
            for line in arguments.output.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| model", "|---"))
        }
    for label in arguments.only or known:
        row = _run(label, known[label], arguments.timeout, arguments.test_timeout)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows[label] = _line(row, known[label])
        if arguments.output:
            arguments.output.write_text("\n".join([*HEADER, *rows.values()]) + "\n")
    print("\n".join([*HEADER, *rows.values()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
