"""`marconi serve`: wired into `marconi.cli` through `register(subparsers)`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from marconi.commands.extras import require
from marconi.commands.parsing import warn_alpha
from marconi.settings import DEFAULT, RUN, argument_type
from marconi.systems import SYSTEMS

if TYPE_CHECKING:
    from marconi.server.config import ServerConfig


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `serve` command to a `marconi` argparse subparser set."""
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible server over the engine, with prefix-cache metrics",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and "
                    "/metrics. With no --model: a tiny random-weight hybrid model, no download.")
    p.add_argument("--model", type=Path, default=None,
                   help="local Hugging Face checkpoint folder (config.json, safetensors, "
                        "tokenizer files); default: the embedded tiny model")
    p.add_argument("--served-model-name", default=None,
                   help="name clients pass as `model` (default: the folder's name)")
    p.add_argument("--capacity", default="1GB",
                   help="bound on cached KV + SSM state bytes, as in simulate (default: 1GB)")
    p.add_argument("--cache-size", dest="capacity", action=_OldName, help=argparse.SUPPRESS)
    p.add_argument("--system", default=DEFAULT.system,
                   choices=[n for n, s in SYSTEMS.items() if s.engine is None],
                   help="the in-process caching system (real-engine systems replay traces "
                        "only) the engine runs")
    p.add_argument("--alpha", type=argument_type(RUN["alpha"]), default=DEFAULT.alpha,
                   help=RUN["alpha"].help)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    p.add_argument("--max-tokens", type=int, default=16,
                   help="completion length when a request gives none")
    p.add_argument("--max-body-size", default=None,
                   help="largest request body, e.g. 4MB; larger gets 413 (default: 256 bytes "
                        "per token of the model's context, at least 1 MiB)")
    p.add_argument("--max-messages", type=int, default=4096,
                   help="most messages in one chat body; more gets 400 (default: 4096)")
    p.add_argument("--max-content-parts", type=int, default=4096,
                   help="most content parts in one chat body, all messages together; "
                        "more gets 400 (default: 4096)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send a request's headers, from connecting "
                        "or from the request's first byte; then its connection is closed "
                        "(default: 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may stall (no bytes arriving) before 408 "
                        "(default: 30)")
    p.add_argument("--body-deadline", type=float, default=120.0,
                   help="seconds a whole request body may take, however it is paced (a "
                        "byte every few seconds never stalls --body-timeout); then 408 "
                        "(default: 120)")
    p.add_argument("--max-connections", type=int, default=512,
                   help="open connections; a request on one more gets 503 (default: 512)")
    p.add_argument("--seed", type=int, default=0, help="random weights of the embedded model")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads")
    p.set_defaults(func=run_command)
    return p


class _OldName(argparse.Action):
    """A flag's old name: still taken, with one line on stderr naming the new one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"marconi serve: {option_string} is now {new} (as simulate names it); "
              f"{option_string} will go", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from marconi.server.config import ServerConfig

    warn_alpha(args.alpha)
    return ServerConfig(model=args.model, served_name=args.served_model_name,
                        capacity=args.capacity, system=args.system, alpha=args.alpha,
                        host=args.host, port=args.port, max_queue=args.max_queue,
                        max_tokens=args.max_tokens, seed=args.seed,
                        max_body_size=args.max_body_size, max_messages=args.max_messages,
                        max_content_parts=args.max_content_parts,
                        header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                        body_deadline=args.body_deadline,
                        max_connections=args.max_connections)


def run_command(args: argparse.Namespace) -> int:
    require("server", "fastapi", "uvicorn", "prometheus_client")
    require("engine", "torch", "transformers")
    import torch
    import uvicorn

    from marconi.server.app import create_app, settle, uvicorn_config
    from marconi.server.backend import build_backend, describe

    config = config_from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    _log_to_stderr()
    backend = build_backend(config)
    print(describe(backend, config), flush=True)
    app = create_app(backend, config)
    settle()
    uvicorn.Server(uvicorn_config(app, host=config.host, port=config.port,
                                  log_level="info")).run()
    return 0


def _log_to_stderr() -> None:
    """The server's own lines (a client gone, a crash) and the engine's (its one kernel
    notice) beside uvicorn's, from INFO up."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("marconi.server", "marconi.engines.hf"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
