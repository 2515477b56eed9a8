"""``python -m symgrad``: the same command line as ``symgrad``."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="symgrad")
