"""The ``multusd`` command: serve, check-config, generate-config, --version."""

from __future__ import annotations

import argparse
import sys

from multusd import __version__
from multusd.config.daemonconf import DEFAULT_CONFIG_PATH

DESCRIPTION = ("multusd: Multus CNI's thick plugin as a host service. The container runtime "
               "calls /opt/cni/bin/multus-shim, which forwards each call to this daemon.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multusd", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"multusd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon (started by multusd.socket)")
    check = commands.add_parser("check-config", help="print every problem in the config; "
                                                     "exit 1 if there is one")
    generate = commands.add_parser("generate-config",
                                   help="write <cniConfigDir>/00-multus.conf for the runtime")
    generate.add_argument("--remove", action="store_true",
                          help="delete 00-multus.conf if multusd generated it (package removal)")
    for sub in (serve, check, generate):
        sub.add_argument("--config", default=DEFAULT_CONFIG_PATH,
                         help=f"daemon-config.json (default {DEFAULT_CONFIG_PATH})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args.config)
    if args.command == "check-config":
        return check_config(args.config)
    if args.command == "generate-config":
        from multusd.daemon import log
        from multusd.config.confwrite import run

        log.setup("verbose", to_stderr=True, journal=False)  # a oneshot: stderr is the journal
        return run(args.config, remove=args.remove)
    build_parser().print_help()
    return 2


def check_config(path: str) -> int:
    from multusd.config import daemonconf as config
    from multusd.errors import ConfigError

    try:
        loaded = config.load(path)
    except ConfigError as exc:
        print(f"{path}: {len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem.format()}", file=sys.stderr)
        return 1
    for warning in loaded.warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    print(f"{path}: OK")
    return 0


def serve(path: str) -> int:
    from multusd.config import daemonconf as config
    from multusd.daemon import log
    from multusd.daemon.lifecycle import Daemon, StartupError
    from multusd.errors import ConfigError

    try:
        loaded = config.load(path)
    except ConfigError as exc:
        print(f"multusd: {exc.msg}", file=sys.stderr)
        return 1
    log.setup(loaded.log_level, loaded.log_file, loaded.log_options, loaded.log_to_stderr)
    import logging

    for warning in loaded.warnings:
        logging.getLogger("multusd").warning("config %s: %s", path, warning)
    try:
        return Daemon(loaded).run()
    except StartupError as exc:
        logging.getLogger("multusd").error("cannot start: %s", exc)
        print(f"multusd: cannot start: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
