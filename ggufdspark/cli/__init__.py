"""The ``ggufdspark`` command: a click group that only dispatches.

Each verb lives in ``ggufdspark/cli/<verb>.py`` as a click command named ``command`` that calls one
library function. Verbs are imported lazily so ``ggufdspark --help`` stays fast and a verb's heavy
imports cost nothing to the others. Library errors (``ggufdspark.errors``) and what the operating
system refuses (``OSError``: a missing directory, a path under a file, an unreadable input) become
one line on stderr and a non-zero exit here, in one place; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from ggufdspark import __version__
from ggufdspark.cli._common import WARNING, close_progress, safe_text
from ggufdspark.errors import GgufdsparkError
from ggufdspark.hubtext import strip_userinfo
from ggufdspark.interrupts import Terminated

# verb -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-engine": ("ggufdspark.cli.build_engine", "Fetch and build the pinned llama.cpp engine (cached)."),
    "doctor": ("ggufdspark.cli.doctor", "Report the engine, its DSpark support, devices and bindings."),
    "convert": ("ggufdspark.cli.convert", "Convert a safetensors DSpark drafter to a GGUF draft."),
    "convert-target": ("ggufdspark.cli.convert_target", "Convert an LFM2 / LFM2-VL target to GGUF."),
    "quantize": ("ggufdspark.cli.quantize", "Quantize a GGUF target or DSpark draft (Q4_K_M, Q8_0, ...)."),
    "inspect": ("ggufdspark.cli.inspect", "Describe a GGUF file from its header."),
    "check": ("ggufdspark.cli.check", "Check that a target and a DSpark draft belong together."),
    "serve": ("ggufdspark.cli.serve", "Run llama-server with the DSpark draft, tuned to the hardware."),
    "timings": ("ggufdspark.cli.timings", "Parse speculative-decoding timings from responses, logs or metrics."),
    "bench": ("ggufdspark.cli.bench", "Measure the speedup and run the lossless gate."),
    "tune": ("ggufdspark.cli.tune", "Find the best draft length for this machine and write a profile."),
    "publish": ("ggufdspark.cli.publish", "Publish a GGUF pair to the Hugging Face Hub."),
    "generate": ("ggufdspark.cli.generate", "Generate small or full-size synthetic test checkpoints."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, help_ = COMMANDS[name]
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                return _missing(name, help_)
            raise
        return mod.command

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            try:
                return super().invoke(ctx)
            finally:
                close_progress()  # a bar left open by a failed job ends before the message below
        except GgufdsparkError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            # messages quote files and engine logs: escaped, so they cannot drive the terminal
            click.echo(f"ggufdspark: error: {safe_text(strip_userinfo(e))}", err=True)
            sys.exit(e.exit_code)
        except Terminated as e:  # SIGTERM / SIGHUP inside interrupts.stop_signals_interrupt()
            try:
                click.echo(f"ggufdspark: stopped by {e.name}", err=True)
            except OSError:
                pass  # SIGHUP: the terminal may be gone
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("ggufdspark: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # the reader of our output went away (`... | head`): nothing left to tell anyone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as e:
            # what the operating system refused (a missing or unwritable directory, a file where a
            # directory should be, an unreadable input): one line naming the path, never a traceback
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"ggufdspark: error: {safe_text(strip_userinfo(os_error_text(e)))}", err=True)
            sys.exit(1)


def os_error_text(e: OSError) -> str:
    """``PATH: reason`` (both paths for a rename or copy), else the error itself."""
    reason = e.strerror or str(e)
    name = lambda f: os.fsdecode(f) if isinstance(f, bytes) else str(f)  # noqa: E731
    if e.filename is not None and e.filename2 is not None:
        return f"{name(e.filename)} -> {name(e.filename2)}: {reason}"
    if e.filename is not None:
        return f"{name(e.filename)}: {reason}"
    return reason


def _missing(name: str, help_: str) -> click.Command:
    @click.command(name=name, help=help_ + " (not available in this version)")
    def cmd():
        raise click.UsageError(f"'{name}' is not available in this version of ggufdspark")

    return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ggufdspark")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.pass_context
def cli(ctx, debug: bool, quiet: bool):
    """ggufdspark: DSpark speculative-decoding drafters for llama.cpp."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if quiet or not sys.stderr.isatty():
        # huggingface_hub's download bars redraw in place: a mess in logs and pipes (a user's own setting wins)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MarkedFormatter())
    logging.basicConfig(level=level, handlers=[handler])
    if not debug:  # the Hub client's HTTP library logs every request at INFO
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)


class MarkedFormatter(logging.Formatter):
    """Log records as their message; warnings and errors marked as such (``WARNING: ...``), so
    that a warning reads as one whichever module logged it. Text from files is escaped."""

    def format(self, record: logging.LogRecord) -> str:
        text = safe_text(strip_userinfo(super().format(record)))  # an endpoint's credentials never shown
        if record.levelno >= logging.ERROR:
            return f"ERROR: {text}"
        if record.levelno >= logging.WARNING:
            return WARNING + text
        return text


def main():
    cli(prog_name="ggufdspark")
