"""symgrad: explicit, closed-form, differentiable gradient code for convolutional networks."""

__version__ = "0.1.0"

from .api import Generated, generate  # noqa: E402
from .errors import SpecError, SymgradError  # noqa: E402

__all__ = ["Generated", "SpecError", "SymgradError", "__version__", "generate"]
