"""symgrad: explicit, closed-form, differentiable gradient code for convolutional networks."""

__version__ = "0.1.0"
