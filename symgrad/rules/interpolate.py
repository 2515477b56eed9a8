"""``interpolate`` in every mode: nearest by whole scale factors sums each block in the backward; every
other case is a separable linear map whose adjoint is ``resample.py``'s (:func:`separable_adjoint`), or
autograd's own ``upsample_*_backward`` kernel where the derivation is fused. The primitives it emits are
``resample.py``'s."""

from __future__ import annotations

import sympy

from ..algebra import op
from ..spec_values import Like
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, boolean, choice
from .resample import INTERPOLATION_RANK, separable_adjoint


def optional_bool(value, context: ParamContext):
    if value is not None and not isinstance(value, bool):
        raise context.fail(f"must be true, false or unset, not {value!r}", f"write `{context.name}: true`")
    return value


def positive_sizes(value, context: ParamContext):
    """Positive ints, or ``{like: NODE}``: NODE's spatial sizes, read when the code runs."""
    if value is None:
        return None
    if isinstance(value, Like):
        return value.sizes()
    if isinstance(value, list) and any(isinstance(v, Like) for v in value):  # [{like: x, size: 'shape[2] // 2'}, ...]
        return tuple(v.size_at(position + 2) if isinstance(v, Like) else v for position, v in enumerate(value))
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise context.fail(
            f"must be a positive int or a list of them, not {value!r}", f"write e.g. `{context.name}: 8`"
        )
    return tuple(values) if isinstance(value, list) else value  # one value stays one, as PyTorch takes it


def scale_factors(value, context: ParamContext):
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6 for v in values):
        raise context.fail(
            f"must be a positive number or a list of them, not {value!r}", "write e.g. `scale_factor: 2`"
        )
    values = tuple(int(v) if float(v).is_integer() else float(v) for v in values)
    return values if isinstance(value, list) else values[0]  # one value stays one, as PyTorch takes it


UPSAMPLE_KERNELS = {
    ("nearest", 1): "upsample_nearest1d",
    ("nearest", 2): "upsample_nearest2d",
    ("nearest", 3): "upsample_nearest3d",
    ("nearest-exact", 1): "_upsample_nearest_exact1d",
    ("nearest-exact", 2): "_upsample_nearest_exact2d",
    ("nearest-exact", 3): "_upsample_nearest_exact3d",
    ("linear", 1): "upsample_linear1d",
    ("bilinear", 2): "upsample_bilinear2d",
    ("bicubic", 2): "upsample_bicubic2d",
    ("trilinear", 3): "upsample_trilinear3d",
}
"""(mode, spatial dims) -> the aten kernel ``F.interpolate`` runs, whose ``_backward`` autograd runs."""


class Interpolate(Rule):
    """``F.interpolate`` in every mode. In ``nearest`` mode by whole scale factors each entry is
    copied into an s×s block, so the adjoint sums each block, ``avg_pool(grad, s) * prod(s)``.
    Every other case (fractional factors, ``size``, linear, bilinear, bicubic, trilinear, area,
    nearest-exact, align_corners, antialias) is separable: see the note in ``resample.py``."""

    op = "interpolate"
    calls = ("interpolate",)
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {
        "size": Param(None, positive_sizes),
        "scale_factor": Param(None, scale_factors),
        "mode": Param(
            "nearest", choice("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
        ),
        "align_corners": Param(None, optional_bool),
        "recompute_scale_factor": Param(None, optional_bool),
        "antialias": Param(False, boolean),
    }
    summary = "resampling: nearest, nearest-exact, (bi/tri)linear, bicubic, area; by size or scale_factor"

    def _per_axis(self, value, spatial: int):
        return None if value is None else (value if isinstance(value, tuple) else (value,) * spatial)

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        spatial = len(x) - 2
        mode = params["mode"]
        check.require(
            1 <= spatial <= 3, "interpolate needs [N, C, ...] with 1 to 3 spatial dims", "pass a batched input"
        )
        check.require(
            INTERPOLATION_RANK.get(mode, spatial) == spatial,
            f"mode '{mode}' needs a {INTERPOLATION_RANK.get(mode, 0) + 2}-d input, not {len(x)}-d",
            "use linear for 3-d, bilinear or bicubic for 4-d, trilinear for 5-d inputs",
        )
        size, scale = params["size"], params["scale_factor"]
        check.require(
            (size is None) != (scale is None), "needs exactly one of size and scale_factor", "give one of them"
        )
        for name, value in (("size", size), ("scale_factor", scale)):
            check.require(
                not isinstance(value, tuple) or len(value) == spatial,
                f"{name} needs {spatial} entries, one per spatial dim",
                f"give one value or a list of {spatial}",
            )
        check.require(
            params["align_corners"] is None or mode in INTERPOLATION_RANK,
            f"align_corners only applies to linear, bilinear, bicubic and trilinear, not '{mode}'",
            "drop align_corners",
        )
        check.require(
            not params["antialias"] or mode in ("bilinear", "bicubic"),
            "antialias only applies to bilinear and bicubic (PyTorch rejects it otherwise)",
            "drop antialias",
        )
        check.require(
            params["recompute_scale_factor"] is None or scale is not None,
            "recompute_scale_factor only applies with scale_factor",
            "drop recompute_scale_factor",
        )
        if size is not None:
            return (x[0], x[1], *self._per_axis(size, spatial))
        # PyTorch: floor(float(n) * s) in double; exact rationals for symbolic sizes
        return (
            x[0],
            x[1],
            *(
                sympy.floor(n * sympy.nsimplify(s, rational=True))
                if isinstance(n, sympy.Basic)
                else int(float(n) * s // 1)
                for n, s in zip(x[2:], self._per_axis(scale, spatial))
            ),
        )

    def _whole_nearest(self, params) -> bool:
        scale = params["scale_factor"]
        return (
            params["mode"] == "nearest"
            and scale is not None
            and all(isinstance(s, int) for s in self._per_axis(scale, 1))
        )

    def _settings(self, node):
        spatial = len(node.shapes["input"]) - 2
        return dict(
            size=self._per_axis(node.params["size"], spatial),
            scale_factor=self._per_axis(node.params["scale_factor"], spatial),
            mode=node.params["mode"],
            align_corners=node.params["align_corners"],
            recompute_scale_factor=node.params["recompute_scale_factor"],
            antialias=node.params["antialias"],
        )

    def forward(self, node):
        settings = self._settings(node)
        if self._whole_nearest(node.params):
            return Forward(op("interpolate_nearest", node.operands["input"], scale=settings["scale_factor"]))
        return Forward(op("interpolate", node.operands["input"], **settings))

    def pullback(self, node, grad, wanted):
        settings = self._settings(node)
        if self._whole_nearest(node.params):
            scale = settings["scale_factor"]
            return {"input": op("block_sum", grad, dims=len(scale), scale=scale)}
        kernel = UPSAMPLE_KERNELS.get((settings["mode"], len(node.shapes["input"]) - 2))
        if node.fused and kernel and not settings["antialias"]:
            # the scales F.interpolate hands its kernel: the factors given, unless recomputed from the sizes
            given = settings["scale_factor"] is not None and not settings["recompute_scale_factor"]
            scales = tuple(float(factor) for factor in settings["scale_factor"]) if given else None
            return {
                "input": op("upsample_backward", grad, node.operands["input"], kernel=kernel, scales=scales, **settings)
            }
        per_axis = [
            dict(
                function="interpolate",
                size=settings["size"][axis] if settings["size"] else None,
                scale=settings["scale_factor"][axis] if settings["scale_factor"] else None,
                mode=settings["mode"],
                align_corners=settings["align_corners"],
                recompute_scale_factor=settings["recompute_scale_factor"],
                antialias=settings["antialias"],
            )
            for axis in range(len(node.shapes["input"]) - 2)
        ]
        return {"input": separable_adjoint(node, grad, 2, "interpolation", per_axis)}

    def table_row(self):
        return (
            self.op,
            "out = interpolate(input): nearest by whole s copies each entry into an s×s block; every other "
            "mode is separable, out = A_H · input · A_Wᵀ per channel",
            "nearest by whole s: grad_input = avg_pool(grad_out, s) * prod(s); otherwise grad_input = A_Hᵀ · grad_out · A_W, "
            "each A read off by interpolating the identity along its axis",
        )


RULES = [Interpolate()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("interpolate", {"x": (1, 2, 2, 3)}, {"op": "interpolate", "scale_factor": [2, 3]}, ("x",)),
    (
        "interpolate bilinear",
        {"x": (1, 1, 3, 4)},
        {"op": "interpolate", "scale_factor": 1.5, "mode": "bilinear"},
        ("x",),
    ),
    (
        "interpolate bicubic",
        {"x": (1, 1, 3, 3)},
        {"op": "interpolate", "size": [5, 4], "mode": "bicubic", "align_corners": True},
        ("x",),
    ),
    ("interpolate linear", {"x": (1, 2, 5)}, {"op": "interpolate", "size": 3, "mode": "linear"}, ("x",)),
    (
        "interpolate trilinear",
        {"x": (1, 1, 2, 3, 2)},
        {"op": "interpolate", "scale_factor": [2, 1.5, 1], "mode": "trilinear"},
        ("x",),
    ),
    ("interpolate area", {"x": (1, 1, 5, 4)}, {"op": "interpolate", "size": [3, 3], "mode": "area"}, ("x",)),
    (
        "interpolate nearest-exact",
        {"x": (1, 1, 3, 4)},
        {"op": "interpolate", "scale_factor": 1.5, "mode": "nearest-exact"},
        ("x",),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "interpolate": [
        Sample(
            "interpolate-nearest",
            {"x": [2, 3, 3, 4], "y": [2, 3, 6, 8]},
            [{"op": "interpolate", "scale_factor": 2, "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-nearest-3d-per-axis",
            {"x": [2, 2, 3, 2, 2], "y": [2, 2, 3, 4, 6]},
            [{"op": "interpolate", "scale_factor": [1, 2, 3], "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=1.5-mode=bilinear",
            {"x": [2, 3, 5, 4], "y": [2, 3, 7, 6]},
            [{"op": "interpolate", "scale_factor": 1.5, "mode": "bilinear", "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-size=[7,3]-mode=bilinear-align_corners=True",
            {"x": [2, 2, 5, 4], "y": [2, 2, 7, 3]},
            [{"op": "interpolate", "size": [7, 3], "mode": "bilinear", "align_corners": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=[2,0.6]-mode=bicubic-align_corners=False",
            {"x": [1, 2, 4, 5], "y": [1, 2, 8, 3]},
            [{"op": "interpolate", "scale_factor": [2, 0.6], "mode": "bicubic", "align_corners": False, "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-size=[4,3]-mode=bicubic-antialias=True",
            {"x": [2, 2, 9, 8], "y": [2, 2, 4, 3]},
            [{"op": "interpolate", "size": [4, 3], "mode": "bicubic", "antialias": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=0.5-mode=bilinear-antialias=True",
            {"x": [2, 2, 8, 7], "y": [2, 2, 4, 3]},
            [{"op": "interpolate", "scale_factor": 0.5, "mode": "bilinear", "antialias": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-size=11-mode=linear",
            {"x": [2, 3, 6], "y": [2, 3, 11]},
            [{"op": "interpolate", "size": 11, "mode": "linear", "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=[2,1.5,1]-mode=trilinear-align_corners=True",
            {"x": [1, 2, 3, 4, 3], "y": [1, 2, 6, 6, 3]},
            [
                {
                    "op": "interpolate",
                    "scale_factor": [2, 1.5, 1],
                    "mode": "trilinear",
                    "align_corners": True,
                    "out": "out",
                }
            ],
            ["x"],
        ),
        Sample(
            "interpolate-size=[3,2]-mode=area",
            {"x": [2, 2, 7, 5], "y": [2, 2, 3, 2]},
            [{"op": "interpolate", "size": [3, 2], "mode": "area", "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=1.5-mode=nearest",
            {"x": [2, 2, 5, 4], "y": [2, 2, 7, 6]},
            [{"op": "interpolate", "scale_factor": 1.5, "mode": "nearest", "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-size=[8,3]-mode=nearest-exact",
            {"x": [2, 2, 5, 4], "y": [2, 2, 8, 3]},
            [{"op": "interpolate", "size": [8, 3], "mode": "nearest-exact", "out": "out"}],
            ["x"],
        ),
        Sample(
            "interpolate-scale_factor=1.7-mode=bilinear-recompute_scale_factor=True",
            {"x": [2, 2, 5, 4], "y": [2, 2, 8, 6]},
            [
                {
                    "op": "interpolate",
                    "scale_factor": 1.7,
                    "mode": "bilinear",
                    "recompute_scale_factor": True,
                    "out": "out",
                }
            ],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "interpolate": [
        Spelling('nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)', module=True),
        Spelling("F.interpolate(x, scale_factor=2)"),
        Spelling(
            'nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True)', {"x": (2, 2, 2, 3, 2)}, module=True
        ),
    ],
}
