"""MONAI's ``UNet`` (``monai.networks.nets.UNet``), written the way MONAI writes it: built recursively as
``nn.Sequential(down, SkipConnection(subblock), up)``, each level's down path a strided ``ResidualUnit``
(two ``Convolution`` subunits with InstanceNorm and PReLU, a strided conv on the residual), the up path a
transposed ``Convolution`` and a one-subunit ``ResidualUnit``, the top one ending in a bare conv; 2D and 3D.
The code is ours; the architecture's facts are public.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from tests.models.zoo_monai import CONV, Convolution, same_padding


class SkipConnection(nn.Module):
    """Concatenate the input with the submodule's output along ``dim``."""

    def __init__(self, submodule, dim: int = 1, mode: str = "cat") -> None:
        super().__init__()
        self.submodule = submodule
        self.dim = dim
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.submodule(x)
        if self.mode == "cat":
            return torch.cat([x, y], dim=self.dim)
        if self.mode == "add":
            return torch.add(x, y)
        if self.mode == "mul":
            return torch.mul(x, y)
        raise NotImplementedError(f"Unsupported mode {self.mode}.")


class ResidualUnit(nn.Module):
    def __init__(
        self,
        spatial_dims,
        in_channels,
        out_channels,
        strides=1,
        kernel_size=3,
        subunits=2,
        adn_ordering="NDA",
        act="PRELU",
        norm="INSTANCE",
        dropout=None,
        bias=True,
        last_conv_only=False,
        padding=None,
    ):
        super().__init__()
        self.spatial_dims = spatial_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.conv = nn.Sequential()
        self.residual = nn.Identity()
        if not padding:
            padding = same_padding(kernel_size)
        schannels = in_channels
        sstrides = strides
        subunits = max(1, subunits)

        for su in range(subunits):
            conv_only = last_conv_only and su == (subunits - 1)
            unit = Convolution(
                spatial_dims,
                schannels,
                out_channels,
                strides=sstrides,
                kernel_size=kernel_size,
                adn_ordering=adn_ordering,
                act=act,
                norm=norm,
                dropout=dropout,
                bias=bias,
                conv_only=conv_only,
                padding=padding,
            )
            self.conv.add_module(f"unit{su:d}", unit)
            # after the first loop set channels and strides to what they should be for subsequent units
            schannels = out_channels
            sstrides = 1

        # apply convolution to input to change number of output channels and size to match that coming from self.conv
        if math.prod([strides] if isinstance(strides, int) else strides) != 1 or in_channels != out_channels:
            rkernel_size = kernel_size
            rpadding = padding
            if math.prod([strides] if isinstance(strides, int) else strides) == 1:  # only the channels: a 1x1 kernel
                rkernel_size = 1
                rpadding = 0
            self.residual = CONV[spatial_dims](in_channels, out_channels, rkernel_size, strides, rpadding, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        res: torch.Tensor = self.residual(x)  # create the additive residual from x
        cx: torch.Tensor = self.conv(x)  # apply x to sequence of operations
        return cx + res  # add the residual to the output


class UNet(nn.Module):
    def __init__(
        self,
        spatial_dims=2,
        in_channels=1,
        out_channels=2,
        channels=(4, 8, 16),
        strides=(2, 2),
        kernel_size=3,
        up_kernel_size=3,
        num_res_units=2,
        act="PRELU",
        norm="INSTANCE",
        dropout=0.0,
        bias=True,
        adn_ordering="NDA",
    ) -> None:
        super().__init__()
        if len(channels) < 2:
            raise ValueError("the length of `channels` should be no less than 2.")
        self.dimensions = spatial_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.channels = channels
        self.strides = strides
        self.kernel_size = kernel_size
        self.up_kernel_size = up_kernel_size
        self.num_res_units = num_res_units
        self.act = act
        self.norm = norm
        self.dropout = dropout
        self.bias = bias
        self.adn_ordering = adn_ordering

        def _create_block(inc, outc, channels, strides, is_top):
            c = channels[0]
            s = strides[0]
            subblock: nn.Module
            if len(channels) > 2:
                subblock = _create_block(c, c, channels[1:], strides[1:], False)  # continue recursion down
                upc = c * 2
            else:
                # the next layer is the bottom so stop recursion, create the bottom layer as the sublock for this layer
                subblock = self._get_bottom_layer(c, channels[1])
                upc = c + channels[1]
            down = self._get_down_layer(inc, c, s, is_top)  # create layer in downsampling path
            up = self._get_up_layer(upc, outc, s, is_top)  # create layer in upsampling path
            return self._get_connection_block(down, up, subblock)

        self.model = _create_block(in_channels, out_channels, self.channels, self.strides, True)

    def _get_connection_block(self, down_path, up_path, subblock):
        return nn.Sequential(down_path, SkipConnection(subblock), up_path)

    def _get_down_layer(self, in_channels, out_channels, strides, is_top):
        if self.num_res_units > 0:
            return ResidualUnit(
                self.dimensions,
                in_channels,
                out_channels,
                strides=strides,
                kernel_size=self.kernel_size,
                subunits=self.num_res_units,
                act=self.act,
                norm=self.norm,
                dropout=self.dropout,
                bias=self.bias,
                adn_ordering=self.adn_ordering,
            )
        return Convolution(
            self.dimensions,
            in_channels,
            out_channels,
            strides=strides,
            kernel_size=self.kernel_size,
            act=self.act,
            norm=self.norm,
            dropout=self.dropout,
            bias=self.bias,
            adn_ordering=self.adn_ordering,
        )

    def _get_bottom_layer(self, in_channels, out_channels):
        return self._get_down_layer(in_channels, out_channels, 1, False)

    def _get_up_layer(self, in_channels, out_channels, strides, is_top):
        conv: nn.Module = Convolution(
            self.dimensions,
            in_channels,
            out_channels,
            strides=strides,
            kernel_size=self.up_kernel_size,
            act=self.act,
            norm=self.norm,
            dropout=self.dropout,
            bias=self.bias,
            conv_only=is_top and self.num_res_units == 0,
            is_transposed=True,
            adn_ordering=self.adn_ordering,
        )
        if self.num_res_units > 0:
            ru = ResidualUnit(
                self.dimensions,
                out_channels,
                out_channels,
                strides=1,
                kernel_size=self.kernel_size,
                subunits=1,
                act=self.act,
                norm=self.norm,
                dropout=self.dropout,
                bias=self.bias,
                last_conv_only=is_top,
                adn_ordering=self.adn_ordering,
            )
            conv = nn.Sequential(conv, ru)
        return conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.model(x)
        return x
