"""``diffu config show|token``: the effective configuration, and the API token for editor plugins."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "config", help="show the configuration or the API token", description="Inspect diffu's configuration."
    )
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the effective settings and where each one comes from")
    show.set_defaults(func=cmd_show)
    token = sub.add_parser("token", help="print the API token clients send (creating it if needed)")
    token.set_defaults(func=cmd_token)


def cmd_show(args: argparse.Namespace) -> int:
    from assistant import paths
    from assistant.config import load_config, render_toml

    del args
    config, sources = load_config()
    print(f"# config file:  {paths.config_file()}{'' if paths.config_file().exists() else ' (absent)'}")
    print(f"# token file:   {paths.token_file()}")
    print(f"# runtime dir:  {paths.runtime_dir()}")
    print(f"# log dir:      {paths.log_dir()}")
    print("# precedence: flags > DIFFU_* environment > config file > defaults")
    print(render_toml(config, sources), end="")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from assistant import api_token
    from assistant.config import load_config

    del args
    config, _ = load_config()
    print(config.api_key or api_token.load_or_create_token())
    return 0
