"""Command line: the language server (default), a one-shot `complete`, `doctor` and `train`."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from dg_lsp import __version__

log = logging.getLogger("dg_lsp")


def _setup_logging(level: str, log_file: str | None) -> None:
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    if root.level > logging.DEBUG:
        # pygls logs every message body at INFO: document text does not belong in logs.
        logging.getLogger("pygls").setLevel(logging.WARNING)
    # Never download anything at run time; only local directories are loaded.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass


def _force_offline() -> None:
    """The server never downloads: only local directories are loaded, whatever the environment says.

    Set before anything imports huggingface_hub, which reads these variables once at import.
    """
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


def _settings_from_args(args: argparse.Namespace):
    from dg_lsp.settings import Settings

    overrides = {}
    for key in ("model", "backend", "device", "quantization", "max_tokens", "denoising_steps", "seed"):
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "candidates", None) is not None:
        overrides["num_candidates"] = args.candidates
    overrides["trust_remote_code"] = _policy(args).trust_remote_code
    try:
        return Settings.from_dict(overrides)
    except ValueError as exc:
        raise SystemExit(f"dg-lsp: {exc}") from None


def _policy(args: argparse.Namespace):
    """What the person at the keyboard allowed: --trust-remote-code, --model remote:URL, env, config file."""
    from dg_lsp.settings import LocalPolicy

    return LocalPolicy.load(getattr(args, "trust_remote_code", False), getattr(args, "model", None))


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a flag given before the subcommand must not be reset by the subparser's default.
    quiet = argparse.SUPPRESS
    p.add_argument(
        "--model",
        default=quiet,
        help="'embedded' (default: SmolLM2-135M adapted to diffusion infill), 'embedded-tiny' (5M: fast, "
        "rarely right), a model directory, or remote:http://host:port",
    )
    p.add_argument("--backend", default=quiet, help="auto | diffusion-gemma | masked | ar | remote")
    p.add_argument("--device", default=quiet, help="auto | cpu | cuda | cuda:N")
    p.add_argument("--quantization", default=quiet, help="auto | none | int4 | int8 | 8bit | nf4")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=quiet)
    p.add_argument(
        "--steps", dest="denoising_steps", type=int, default=quiet, help="denoising steps per canvas"
    )
    p.add_argument("--seed", type=int, default=quiet)
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=quiet,
        help="let a model directory's own Python code run (the LSP setting can only turn it off)",
    )
    p.add_argument(
        "--api-key-env",
        dest="api_key_env",
        default=quiet,
        metavar="NAME",
        help="for --model remote:URL: the environment variable holding its key (default DG_LSP_ENGINE_TOKEN)",
    )


def _add_transport_flags(p: argparse.ArgumentParser) -> None:
    """The flags LSP clients append on their own: vscode-languageclient adds `--stdio` for a command
    started with TransportKind.stdio (and `--clientProcessId=N` for node servers); without them the
    server exits before the editor can talk to it."""
    quiet = argparse.SUPPRESS
    p.add_argument("--stdio", action="store_true", default=quiet, help="serve on stdin/stdout (the default)")
    # The editor's pid also arrives as `processId` in `initialize`, which the server already watches.
    p.add_argument(
        "--clientProcessId", "--client-process-id", dest="client_process_id", default=quiet, help=quiet
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dg-lsp",
        description="Language server for code infill with diffusion language models.",
    )
    parser.add_argument("--version", action="version", version=f"dg-lsp {__version__}")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-file", help="write logs here instead of stderr")
    parser.add_argument("--tcp", action="store_true", help="serve over TCP instead of stdio")
    _add_transport_flags(parser)
    parser.add_argument("--host", default="127.0.0.1", help="TCP address (loopback unless --allow-remote)")
    parser.add_argument("--port", type=int, default=2087)
    parser.add_argument(
        "--allow-remote", action="store_true", help="allow a non-loopback --host (no authentication!)"
    )
    _add_model_flags(parser)
    sub = parser.add_subparsers(dest="command")

    _add_transport_flags(sub.add_parser("serve", help="run the language server (the default)"))

    c = sub.add_parser("complete", help="run the infill pipeline once at a position and print the result")
    c.add_argument("file", type=Path)
    c.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    c.add_argument("--character", type=int, required=True, help="1-based column of the cursor (code points)")
    c.add_argument("--end-line", type=int, help="rewrite the span up to this 1-based line")
    c.add_argument("--end-character", type=int, help="... and this 1-based column")
    c.add_argument("--language", help="language id (default: from the file extension)")
    c.add_argument("--candidates", type=int)
    c.add_argument(
        "--json", action="store_true", help="print candidates, span kind and engine figures as JSON"
    )
    _add_model_flags(c)

    d = sub.add_parser("doctor", help="check torch, device, model and grammars, and say what is wrong")
    _add_model_flags(d)

    e = sub.add_parser(
        "serve-engine",
        help="serve the model to a team over the FIM HTTP API on Ray Serve (`pip install -e '.[team]'`)",
    )
    e.add_argument("--engine-port", type=int, default=8765)
    e.add_argument("--token-file", help="clients must send this file's token (also $DG_LSP_ENGINE_TOKEN)")
    e.add_argument("--request-timeout", type=float, default=30.0, help="seconds a request may take")
    e.add_argument("--replicas", type=int, default=1, help="engine replicas (one per GPU on a GPU cluster)")
    e.add_argument("--max-replicas", type=int, help="autoscale between --replicas and this many")
    e.add_argument("--no-batching", action="store_true", help="one request per forward pass")
    e.add_argument("--max-batch", type=int, default=16, help="requests batched into one forward at most")
    e.add_argument(
        "--continuous-batching",
        action="store_true",
        help="requests join the running decode between steps instead of waiting for the next batch",
    )
    e.add_argument("--batch-wait-ms", type=float, default=5.0, help="wait this long for a batch to fill")
    e.add_argument("--address", help="join this Ray cluster (default: start a local Ray)")
    e.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    e.add_argument("--cpus-per-replica", type=float, default=1.0)
    e.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    e.add_argument("--no-ray", action="store_true", help="serve in this process (one engine, no replicas)")
    _add_model_flags(e)

    # Listed for --help only: main() hands `train ...` to the trainer before this parser runs.
    sub.add_parser("train", help="train a model: dg-lsp train CONFIG [options] (see dg-lsp train --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # the trainer owns its flags, --help included
        _setup_logging("INFO", None)
        from dg_lsp.training.train import main as train_main

        return train_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tcp and getattr(args, "stdio", False):
        parser.error("--stdio and --tcp are two transports: pass one")
    if args.command in (None, "serve", "serve-engine"):
        _force_offline()
    if getattr(args, "api_key_env", None) and getattr(args, "model", "").startswith("remote:"):
        # Local choice, read by the remote backend (dg_lsp/engine/remote.py); never from a setting.
        from dg_lsp.engine.remote import KEY_ENV_ENV, KEY_URL_ENV, _norm

        os.environ[KEY_ENV_ENV] = args.api_key_env
        os.environ[KEY_URL_ENV] = _norm(args.model)
    _setup_logging(args.log_level, args.log_file)
    if args.command == "complete":
        return cmd_complete(args)
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "serve-engine":
        return cmd_serve_engine(args)
    return cmd_serve(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from dg_lsp.server.app import create_server

    settings = _settings_from_args(args)
    if args.tcp:
        if not _is_loopback(args.host):
            if not args.allow_remote:
                print(
                    f"dg-lsp: refusing to listen on non-loopback host {args.host!r}; "
                    "pass --allow-remote to override (the protocol has no authentication)",
                    file=sys.stderr,
                )
                return 2
            log.warning("listening on %s: anyone who can reach it can read the documents you send", args.host)
        server = create_server(settings, _policy(args))
        _exit_now(server.start_tcp(args.host, args.port))
    # Keep the protocol stream clean: anything a library prints goes to stderr instead.
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr
    server = create_server(settings, _policy(args))
    _exit_now(server.start_io(sys.stdin.buffer, stdout))


def _exit_now(code: int | None) -> NoReturn:
    """Exit without the interpreter's teardown of torch and transformers, which takes seconds:
    editors kill a server that lingers after `exit`, and everything worth keeping is already flushed."""
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)


def cmd_serve_engine(args: argparse.Namespace) -> int:
    from dg_lsp.engine.remote import load_token

    if not _is_loopback(args.host) and not args.allow_remote:
        print(f"dg-lsp: refusing non-loopback host {args.host!r} without --allow-remote", file=sys.stderr)
        return 2
    try:
        token = load_token(args.token_file)
    except (OSError, ValueError) as exc:
        print(f"dg-lsp: {exc}", file=sys.stderr)
        return 2
    if token is None and not _is_loopback(args.host):
        print("dg-lsp: off loopback, serve-engine needs --token-file or DG_LSP_ENGINE_TOKEN", file=sys.stderr)
        return 2
    for name in ("replicas", "max_batch", "threads"):
        if getattr(args, name) < 1:
            print(f"dg-lsp: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    settings = _settings_from_args(args)
    try:
        if args.no_ray:
            return _serve_engine_here(args, settings, token)
        from dg_lsp.team import ray_serve
    except ImportError as exc:
        print(f"dg-lsp: serve-engine needs the team extra (pip install -e '.[team]'): {exc}", file=sys.stderr)
        return 1
    cfg = ray_serve.TeamConfig(
        settings=settings,
        replicas=args.replicas,
        max_replicas=args.max_replicas,
        batching=not args.no_batching,
        continuous=args.continuous_batching,
        max_batch=args.max_batch,
        batch_wait_ms=args.batch_wait_ms,
        cpus_per_replica=args.cpus_per_replica,
        threads=args.threads,
        token=token,
        host=args.host,
        port=args.engine_port,
        request_timeout_s=args.request_timeout,
    )
    try:
        ray_serve.serve_forever(cfg, address=args.address, num_cpus=args.num_cpus)
    except KeyboardInterrupt:
        pass
    return 0


def _serve_engine_here(args: argparse.Namespace, settings, token: str | None) -> int:
    from dg_lsp.engine.loader import ModelLoadError, load_engine
    from dg_lsp.team.local import InProcessServer

    try:
        engine = load_engine(settings)
    except ModelLoadError as exc:
        print(f"dg-lsp: {exc}", file=sys.stderr)
        return 1
    engine.warmup()
    server = InProcessServer(
        engine,
        args.host,
        args.engine_port,
        token=token,
        request_timeout_s=args.request_timeout,
        batching=not args.no_batching,
        continuous=args.continuous_batching,
    )
    auth = "bearer token required" if token else "no token (loopback only)"
    log.info("serving %s on %s (%s, no Ray)", engine.name, server.url, auth)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_complete(args: argparse.Namespace) -> int:
    from dg_lsp import context, pipeline
    from dg_lsp.engine.loader import ModelLoadError, load_engine

    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"dg-lsp: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    offset = _offset_1based(text, args.line, args.character)
    end = None
    if args.end_line is not None:
        end = _offset_1based(text, args.end_line, args.end_character or 1)
    language = context.language_for(args.language, args.file.as_uri()) if args.language else None
    language = language or context.language_for(None, args.file.resolve().as_uri())
    # One answer for a waiting user: the latency budget exists to keep typing fluid, not for this.
    settings = dataclasses.replace(_settings_from_args(args), latency_budget_ms=0)
    try:
        engine = load_engine(settings)
    except ModelLoadError as exc:
        print(f"dg-lsp: {exc}", file=sys.stderr)
        return 1
    trees = context.DocumentTrees()
    uri = args.file.resolve().as_uri()
    trees.open(uri, language or args.language, text)
    snapshot = trees.snapshot(uri)
    result = pipeline.complete(engine, snapshot, offset, settings, end, doc_key=uri)
    if args.json:
        print(
            json.dumps(
                {
                    "file": str(args.file),
                    "offset": offset,
                    "end": result.end,
                    "language": language,
                    "span_kind": result.span_kind,
                    "candidates": result.texts,
                    "skipped": result.skipped,
                    "rejected": result.rejected,
                    "stats": result.stats.as_dict(),
                    "engine": engine.describe(),
                },
                indent=2,
            )
        )
    else:
        if not result.texts:
            print(f"(no completion: {result.skipped})", file=sys.stderr)
        else:
            print(result.texts[0])
        s = result.stats
        facts = engine.describe()
        print(
            f"-- {result.span_kind}: {s.generated_tokens} tokens, {s.forward_passes} forward passes, "
            f"{s.total_ms:.0f} ms ({facts.get('backend')})",
            file=sys.stderr,
        )
        if facts.get("dual_cache_off"):  # a masked model decoding without its dual cache: why
            print(f"-- dual cache off: {facts['dual_cache_off']}", file=sys.stderr)
    return 0


def _offset_1based(text: str, line: int, column: int) -> int:
    lines = text.splitlines(keepends=True)
    if line < 1:
        return 0
    if line > len(lines):
        return len(text)
    start = sum(len(x) for x in lines[: line - 1])
    body = lines[line - 1].rstrip("\r\n")
    return start + max(0, min(column - 1, len(body)))


def cmd_doctor(args: argparse.Namespace) -> int:
    from dg_lsp.doctor import run_doctor

    return run_doctor(_settings_from_args(args))


if __name__ == "__main__":
    raise SystemExit(main())
