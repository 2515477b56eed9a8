"""How the ``symgrad`` command line fails: in one line, exit status 2 (:func:`fail`), and every error it did
not foresee said in one line too (:class:`OneLineErrors`, the command group's class)."""

from __future__ import annotations

import os
import sys

import click

from .errors import SymgradError


def fail(error: Exception) -> None:
    click.echo(str(error) if isinstance(error, SymgradError) else f"error: {error}", err=True)
    sys.exit(2)


class OneLineErrors(click.Group):
    """Every command gives a result or a one-line error, never a traceback: an error symgrad did not
    foresee is said in one line, as its own (``SYMGRAD_TRACEBACK=1`` shows where it was raised)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (
            click.exceptions.ClickException,
            click.exceptions.Exit,
            click.exceptions.Abort,
            SystemExit,
            KeyboardInterrupt,
        ):
            raise
        except SymgradError as error:
            fail(error)
        except Exception as error:  # noqa: BLE001 - said in one line, as asked
            if os.environ.get("SYMGRAD_TRACEBACK"):
                raise
            first = (str(error).strip().splitlines() or [""])[0][:300]
            click.echo(
                f"error: symgrad {ctx.invoked_subcommand or ''} failed: {type(error).__name__}: {first} (fix: "
                "this is a bug in symgrad: please report it with the command and its spec; "
                "SYMGRAD_TRACEBACK=1 shows where)",
                err=True,
            )
            sys.exit(2)
