"""A loss function around a module-level model imported from the file beside this one."""

import torch.nn.functional as F
from blocks import Noisy

model = Noisy()


def loss(x, y, labels=None):
    return F.mse_loss(model(x, 0.5), y)
