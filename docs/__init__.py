"""The spec and ops references, shipped in the wheel as ``symgrad.docs`` for ``symgrad spec-help``."""
