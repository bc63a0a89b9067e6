"""``queenctl``: run the command; every failure is one line on stderr and a documented exit
code (queenctl.client lists them)."""
from __future__ import annotations

import sys

import click

from queenctl import client, operator  # noqa: F401  (operator registers its command groups)
from queenctl.commands import accept_global_options, cli

# --json, --url, --token and --timeout after any subcommand as well as before it.
accept_global_options(cli)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="queenctl", standalone_mode=False)
    except client.CtlError as exc:
        click.echo(f"queenctl: {exc.message}", err=True)
        return exc.code
    except click.exceptions.Abort:
        click.echo("queenctl: aborted", err=True)
        return client.FAILED
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "queenctl"
        click.echo(f"queenctl: {exc.format_message()} (see {where} --help)", err=True)
        return client.USAGE
    except click.ClickException as exc:
        click.echo(f"queenctl: {exc.format_message()}", err=True)
        return exc.exit_code
    except SystemExit as exc:  # the commands' own exit codes (nothing found, ...)
        return exc.code if isinstance(exc.code, int) else client.FAILED
    return client.OK


if __name__ == "__main__":
    sys.exit(main())
