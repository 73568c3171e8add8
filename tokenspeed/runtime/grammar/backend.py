"""`--grammar-backend xgrammar | llguidance`: compiles output constraints for one tokenizer and vocabulary.

The backend's compiler (`xgrammar_compiler`, `llguidance_compiler`) turns a constraint into a compiled
grammar and a compiled grammar into one request's `GrammarState`; what is shared lives here. Compilation
runs in a thread pool (both libraries release the GIL), so neither the HTTP event loop nor a scheduler's
step loop waits for it. Compiled grammars are cached by (kind, text); a compile that passes
`--grammar-compile-timeout-secs` is abandoned for that request, and a constraint that timed out more than
`--grammar-compile-max-retries` times is refused at once from then on. Errors are `GrammarError`, whose
message names the request field and the problem the library found.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import re
import threading
from typing import Any, Protocol

# xgrammar prefixes its messages with "[time] /path/file.cc:line: "; the user needs the rest.
_LOCATION = re.compile(r"^\[[\d:.]+\] \S+:\d+: ")

_COMPILE_THREADS = 2  # grammars compile rarely (the cache holds repeats); two keep one slow one from blocking


class GrammarError(ValueError):
    """A constraint that does not compile, or did not within the time limit (a 400 to the client)."""


# --grammar-backend name -> (its compiler, "module:class", the package it needs)
COMPILERS = {
    "xgrammar": ("tokenspeed.runtime.grammar.xgrammar_compiler:XGrammarCompiler", "xgrammar"),
    "llguidance": ("tokenspeed.runtime.grammar.llguidance_compiler:LLGuidanceCompiler", "llguidance"),
}


def missing_package(grammar_backend: str) -> str:
    package = COMPILERS[grammar_backend][1]
    return f"--grammar-backend {grammar_backend} needs the {package} package: pip install {package}"


def check_installed(grammar_backend: str) -> None:
    """At start-up: refuse a grammar backend whose package is missing, naming the fix."""
    if grammar_backend not in COMPILERS:
        return
    try:
        importlib.import_module(COMPILERS[grammar_backend][1])
    except ImportError as exc:
        raise ValueError(missing_package(grammar_backend)) from exc


class Compiler(Protocol):
    """What a grammar library provides: built once for a tokenizer and vocabulary."""

    def compile(self, kind: str, text: str) -> Any:
        """A compiled grammar for `kind` (json_schema, regex, ebnf); raises on a bad constraint."""

    def matcher(self, compiled: Any) -> Any:
        """A fresh GrammarState (fill / accept) for one request."""


def clean_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return _LOCATION.sub("", text[0] if text else type(exc).__name__)


class GrammarBackend:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        *,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        any_whitespace: bool = True,
        name: str = "xgrammar",
    ) -> None:
        if name not in COMPILERS:
            raise ValueError(f"--grammar-backend {name!r}: choose one of {', '.join(COMPILERS)} (or none)")
        check_installed(name)
        module, _, cls = COMPILERS[name][0].partition(":")
        self.name = name
        self._compiler: Compiler = getattr(importlib.import_module(module), cls)(
            tokenizer, vocab_size, list(stop_token_ids), any_whitespace
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(_COMPILE_THREADS, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, str], concurrent.futures.Future] = {}
        self._timeouts: dict[tuple[str, str], int] = {}
        self.timeout_s = timeout_s
        self.max_retries = max_retries

    def _compile(self, kind: str, text: str) -> Any:
        if kind not in ("json_schema", "regex", "ebnf"):
            raise GrammarError(f"unknown constraint kind {kind!r}")
        return self._compiler.compile(kind, text)

    def submit(self, kind: str, text: str) -> concurrent.futures.Future:
        """The compile of (kind, text): shared with any earlier request for the same constraint."""
        key = (kind, text)
        with self._lock:
            if self._timeouts.get(key, 0) > self.max_retries:
                failed: concurrent.futures.Future = concurrent.futures.Future()
                failed.set_exception(
                    GrammarError(
                        f"{kind}: compiling it timed out {self._timeouts[key]} times "
                        f"(--grammar-compile-timeout-secs {self.timeout_s}); simplify the constraint"
                    )
                )
                return failed
            fut = self._futures.get(key)
            if fut is None or (fut.done() and fut.exception() is not None):
                fut = self._pool.submit(self._compile, kind, text)
                self._futures[key] = fut
            return fut

    def result(self, kind: str, fut: concurrent.futures.Future) -> Any:
        """The compiled grammar of a finished compile, or GrammarError naming the problem."""
        exc = fut.exception()
        if exc is None:
            return fut.result()
        if isinstance(exc, GrammarError):
            raise exc
        raise GrammarError(f"{kind}: {clean_error(exc)}") from exc

    def timed_out(self, kind: str, text: str) -> GrammarError:
        key = (kind, text)
        with self._lock:
            self._timeouts[key] = self._timeouts.get(key, 0) + 1
        return GrammarError(
            f"{kind}: the grammar did not compile within {self.timeout_s} s "
            "(--grammar-compile-timeout-secs); simplify the constraint"
        )

    async def check(self, kind: str, text: str) -> Any:
        """Compile (or find in the cache) for a request being admitted; GrammarError -> a 400."""
        fut = self.submit(kind, text)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.timeout_s)
        except TimeoutError:
            raise self.timed_out(kind, text) from None
        except Exception:
            pass  # reported by result()
        return self.result(kind, fut)

    def matcher(self, compiled: Any) -> Any:
        return self._compiler.matcher(compiled)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
