"""The ``multusd`` command: serve, check-config, generate-config and the operator tools."""

from __future__ import annotations

import argparse
import os
import sys

from multusd import __version__, go_field
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
    status = commands.add_parser("status", help="the daemon, the node and every sandbox "
                                                "recorded in cniDir (works with the daemon "
                                                "stopped)")
    show = commands.add_parser("show", help="everything recorded about one sandbox, compared "
                                            "with the pod's network-status")
    show.add_argument("sandbox", metavar="POD|CONTAINER_ID",
                      help="NAMESPACE/NAME, a pod name, or a container ID (or a prefix of one)")
    show.add_argument("--no-api", action="store_true",
                      help="do not ask the API server for the pod's network-status")
    doctor = commands.add_parser("doctor", help="check everything multusd needs; exit 1 and "
                                                "say what to fix when a check fails")
    doctor.add_argument("--rbac", default="", metavar="PATH",
                        help="the RBAC file a fix names (default /usr/share/multusd/rbac.yaml)")
    gc = commands.add_parser("gc", help="run DEL again for unreleased sandboxes (their DEL "
                                        "kept failing past deleteRetryWindow); list the "
                                        "sandboxes whose network namespace is gone, --release "
                                        "runs DEL for them; --forget drops one sandbox's records")
    mode = gc.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="only list them, change nothing")
    mode.add_argument("--release", action="store_true",
                      help="release them: DEL each from its own records, as the runtime would")
    mode.add_argument("--forget", metavar="CONTAINER_ID", default="",
                      help="for a sandbox whose DEL cannot succeed (a plugin binary is gone): "
                           "DEL what can be released, then drop all its records knowingly")
    sockcheck = commands.add_parser("socket-check", help="whose socket the shim's path is "
                                                         "(multusd.socket's, another daemon's, "
                                                         "none); --repair brings it back")
    action = sockcheck.add_mutually_exclusive_group()
    action.add_argument("--repair", action="store_true",
                        help="restart multusd.socket if the file is gone or dead (never when "
                             "another daemon listens there)")
    action.add_argument("--remove-dead", action="store_true",
                        help="delete the file if nobody listens on it (package removal)")
    for sub in (serve, check, generate, status, show, doctor, gc, sockcheck):
        sub.add_argument("--config", default=DEFAULT_CONFIG_PATH,
                         help=f"daemon-config.json (default {DEFAULT_CONFIG_PATH})")
    for sub in (status, show, doctor, gc):
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args.config)
    if args.command == "check-config":
        return check_config(args.config)
    if args.command == "generate-config":
        from multusd.daemon import log
        from multusd.config.generateconfig import run

        log.setup("verbose", to_stderr=True, journal=False)  # a oneshot: stderr is the journal
        return run(args.config, remove=args.remove)
    if args.command == "socket-check":
        from multusd.tools import sockcheck

        return sockcheck.run(args.config, repair=args.repair, remove_dead=args.remove_dead)
    if args.command in TOOLS:
        return run_tool(args)
    build_parser().print_help()
    return 2


TOOLS = ("status", "show", "doctor", "gc")


def run_tool(args: argparse.Namespace) -> int:
    """The operator tools (multusd/tools/): they read the on-disk state, the daemon may be down."""
    if args.command == "status":
        from multusd.tools import status

        return status.run(args.config, as_json=args.json)
    if args.command == "show":
        from multusd.tools import show

        return show.run(args.config, args.sandbox, as_json=args.json, use_api=not args.no_api)
    if args.command == "doctor":
        from multusd.tools import doctor

        return doctor.run(args.config, as_json=args.json, rbac_path=args.rbac)
    from multusd.tools import gc

    if args.forget:
        return gc.forget(args.config, args.forget, as_json=args.json)
    return gc.run(args.config, release=args.release, dry_run=args.dry_run, as_json=args.json)


def check_config(path: str) -> int:
    from multusd.config import daemonconf
    from multusd.errors import ConfigError

    try:
        loaded = daemonconf.load(path)
    except ConfigError as exc:
        print(f"{path}: {len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem.format()}", file=sys.stderr)
        return 1
    for warning in loaded.warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    plugins = plugin_dirs_report(str(go_field(loaded.raw, "binDir") or ""))
    if not loaded.kubeconfig:
        print(f"{path}: OK (no kubeconfig: the delegates of the config only)")
        print(plugins)
        return 0
    from multusd.errors import MultusError
    from multusd.kube.clientconfig import ClientConfig
    from multusd.config import nodename
    from multusd.tools.common import service_environment

    try:  # loaded, not contacted: reaching the API server is `multusd doctor`'s
        client_config = ClientConfig(loaded.kubeconfig)
    except MultusError as exc:
        print(f"{path}: 1 problem(s):\n  kubeconfig: {exc.msg}", file=sys.stderr)
        return 1
    environ = {**service_environment(), **os.environ}
    node = nodename.resolve(loaded.node_name, environ, client_config.node_identity)
    print(f"{path}: OK")
    print(f"  API server: {client_config.server_url} (kubeconfig {loaded.kubeconfig})")
    print(f"  {node.describe()}")
    print(plugins)
    return 0


def plugin_dirs_report(bin_dir: str) -> str:
    """Where delegate plugins are looked up and what each directory holds; a warning (on
    stderr) when none of them holds a plugin."""
    from multusd.cni.invoke import plugins_in, search_path

    dirs = search_path(bin_dir)
    found = {d: plugins_in(d) for d in dirs}
    lines = [f"  plugins: binDir {bin_dir}" if bin_dir else
             "  plugins: binDir is not set; searched in this order:"]
    for directory in dirs:
        names = found[directory]
        if names is None:
            what = "no such directory"
        else:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            what = f"{len(names)} plugin(s)" + (f": {shown}" if names else "")
        lines.append(f"    {directory}: {what}")
    if not any(found.values()):
        print("  warning: binDir: no plugin found in " + ", ".join(dirs) + "; install the "
              "delegate plugins (containernetworking-plugins) or set binDir to where they "
              "are", file=sys.stderr)
    elif not bin_dir:
        lines.append("    found: " + ", ".join(d for d in dirs if found[d]) + " (each plugin "
                     "is run from the first directory that has it)")
    return "\n".join(lines)


def serve(path: str) -> int:
    from multusd.config import daemonconf
    from multusd.daemon import log
    from multusd.daemon.lifecycle import Daemon, StartupError
    from multusd.errors import ConfigError

    try:
        loaded = daemonconf.load(path)
    except ConfigError as exc:
        print(f"multusd: {exc.msg}", file=sys.stderr)
        _status(f"cannot start: {exc.msg}; fix it: systemd retries every few seconds")
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
        _status(f"cannot start: {exc}")
        return 3


def _status(text: str) -> None:
    """The reason a failed start shows in ``systemctl status multusd`` (a no-op off systemd)."""
    from multusd.daemon import systemd

    systemd.notify(f"STATUS={text[:400]}")


if __name__ == "__main__":
    sys.exit(main())
