"""llama.cpp through ``llama-server``: its plain greedy and its own speculation, one binary.

Three benchmark methods, run only when named, each on a ``llama-server`` process the
benchmark starts once (on the benchmarked model's GGUF file) and stops at the end:

* ``llamacpp_server``: plain greedy decoding;
* ``llamacpp_ngram``: ``--spec-type ngram-mod`` at llama.cpp's defaults (n-grams of the
  context, which it keeps across requests, as a user's server does);
* ``llamacpp_draft``: ``--spec-type draft-simple`` with the benchmark's ``--draft-model`` GGUF
  as ``-md``, drafting ``--draft-tokens`` tokens a step.

Each prompt goes to the native ``/completion`` endpoint as our token ids (no text round
trip, no BOS added), greedy (``temperature`` 0, top-1), ``cache_prompt`` off so each prompt
is evaluated whole. The answer comes back as token ids (``return_tokens``; older servers
send only text, which is then encoded with our tokenizer). The times are the server's own
``timings``: ``seconds`` = ``prompt_ms`` + ``predicted_ms`` (HTTP and JSON excluded),
``time_to_first_token`` = ``prompt_ms``; ``steps`` = target passes, the tokens made less the
draft tokens accepted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch

from lookahead.bench.methods import Measurement

logger = logging.getLogger(__name__)

SERVER = "llama-server"
LLAMACPP_SERVER, LLAMACPP_NGRAM, LLAMACPP_DRAFT = (
    "llamacpp_server", "llamacpp_ngram", "llamacpp_draft")
# Method -> llama-server's speculation flags (the draft model's are added to draft-simple).
MODES = {
    LLAMACPP_SERVER: (),
    LLAMACPP_NGRAM: ("--spec-type", "ngram-mod"),
    LLAMACPP_DRAFT: ("--spec-type", "draft-simple"),
}
# The flag of the draft length, newest spelling first: 2026 builds renamed --draft-max (and
# refuse it); older ones know only --draft-max.
DRAFT_COUNT_FLAGS = ("--spec-draft-n-max", "--draft-max")
# Context room beyond the longest prompt and answer the benchmark asks for.
CONTEXT = 8192
# Loading a large GGUF on a busy machine takes a while; past this the server is given up on.
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 1800.0


def find_server(path: str | None) -> Path | None:
    """The ``llama-server`` binary: ``path`` itself if it is one, else the one beside it (a
    ``llama-completion`` file's folder) or in it (a folder); else the one on ``PATH``; None
    when there is none. A ``path`` without one is a ``FileNotFoundError`` naming
    ``--llamacpp-bin``."""
    if path is not None:
        given = Path(path).expanduser()
        folder = given.parent if given.is_file() else given
        for candidate in (given, folder / SERVER):
            if candidate.is_file() and candidate.name.startswith(SERVER):
                return candidate
        raise FileNotFoundError(f"--llamacpp-bin: no {SERVER} at {given}")
    found = shutil.which(SERVER)
    return Path(found) if found else None


def server_flags(binary: Path) -> set[str]:
    """The flags ``binary --help`` lists (words starting with "-"), to use the spellings this
    build knows; an empty set where the help cannot be read."""
    try:
        done = subprocess.run([str(binary), "--help"], capture_output=True, timeout=120,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("%s --help failed: %s", binary, error)
        return set()
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    return {word.rstrip(",") for word in text.split() if word.startswith("-")}


def server_command(binary: Path, gguf: Path, method: str, port: int, threads: int,
                   flags: set[str], draft_gguf: Path | None = None,
                   draft_tokens: int | None = None, f32_cache: bool = False) -> list[str]:
    """The ``llama-server`` command of ``method`` (a key of ``MODES``): one slot (``-np 1``),
    ``threads`` for the prompt and the decoding, on ``127.0.0.1:port``; no web UI and no
    prompt cache in host memory where this build has them (``flags``: :func:`server_flags`).
    ``llamacpp_draft`` needs ``draft_gguf``; ``draft_tokens`` goes to the first of
    ``DRAFT_COUNT_FLAGS`` the build lists. ``f32_cache``: a float32 KV cache."""
    if method not in MODES:
        raise ValueError(f"method must be one of {', '.join(MODES)}, got {method!r}")
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-tb", str(threads), "-c", str(CONTEXT), "-np", "1"]
    if "--no-webui" in flags:
        command.append("--no-webui")
    if "--cache-ram" in flags:  # prompts are evaluated whole: copying their state is waste
        command += ["--cache-ram", "0"]
    if f32_cache:
        command += ["-ctk", "f32", "-ctv", "f32"]
    command += MODES[method]
    if method == LLAMACPP_DRAFT:
        if draft_gguf is None:
            raise ValueError(f"{LLAMACPP_DRAFT} needs a draft model: pass --draft-model NAME")
        command += ["-md", str(draft_gguf)]
        count = next((flag for flag in DRAFT_COUNT_FLAGS if flag in flags), None)
        if draft_tokens is not None and count is not None:
            command += [count, str(draft_tokens)]
        elif draft_tokens is not None:
            logger.warning("%s lists none of %s: it drafts its default number of tokens",
                           binary.name, ", ".join(DRAFT_COUNT_FLAGS))
    return command


@dataclass(frozen=True)
class Reply:
    """What the benchmark reads of one ``/completion`` response."""

    tokens: list[int]  # the answer's ids (empty where the server does not send them)
    content: str
    prompt_ms: float
    predicted_ms: float
    prompt_tokens: int  # evaluated (none were taken from a cache)
    cached_tokens: int
    predicted: int  # tokens made
    draft_tokens: int
    draft_accepted: int
    stop_type: str  # "eos", "limit", "word" or "none"

    @property
    def seconds(self) -> float:
        return (self.prompt_ms + self.predicted_ms) / 1000


def parse_completion(response: dict) -> Reply:
    """A ``/completion`` response's JSON (llama-server's non-streamed, native format) read
    into a :class:`Reply`; a ``ValueError`` naming what is missing."""
    if "error" in response:
        raise ValueError(f"{SERVER} answered with an error: {response['error']}")
    timings = response.get("timings")
    if not isinstance(timings, dict) or "prompt_ms" not in timings or \
            "predicted_ms" not in timings:
        raise ValueError(f"the {SERVER} response has no timings (prompt_ms, predicted_ms); "
                         f"its keys: {sorted(response)}")
    return Reply(
        tokens=[int(t) for t in response.get("tokens") or ()],
        content=str(response.get("content", "")),
        prompt_ms=float(timings["prompt_ms"]),
        predicted_ms=float(timings["predicted_ms"]),
        prompt_tokens=int(timings.get("prompt_n", response.get("tokens_evaluated", 0))),
        cached_tokens=int(timings.get("cache_n", 0)),
        predicted=int(timings.get("predicted_n", response.get("tokens_predicted", 0))),
        draft_tokens=int(timings.get("draft_n", 0)),
        draft_accepted=int(timings.get("draft_n_accepted", 0)),
        stop_type=str(response.get("stop_type", "none")),
    )


def completion_request(prompt: list[int], max_new_tokens: int) -> dict:
    """The ``/completion`` body of one greedy, whole-prompt run of our ``prompt`` ids."""
    return {"prompt": prompt, "n_predict": max_new_tokens, "temperature": 0, "top_k": 1,
            "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True,
            "stream": False}


def free_port() -> int:
    """A TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent():
    """On Linux, a ``preexec_fn`` that has the child sent SIGTERM if the benchmark dies, so
    that not even a killed benchmark leaves a server behind; None elsewhere. libc is loaded
    here, in the parent: between fork and exec the child only makes the one call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class LlamaServer:
    """A ``llama-server`` process on ``127.0.0.1:port``, as a context manager: started by
    :meth:`start` (which waits for ``/health``), stopped by :meth:`close` whatever happened.

    Its output goes to a temporary file, whose last lines a failure quotes.
    """

    def __init__(self, command: list[str], port: int,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        self.command, self.port, self.start_timeout = command, port, start_timeout
        self.process: subprocess.Popen | None = None
        self._log = None
        # Straight to 127.0.0.1, whatever proxy the environment names.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:  # a failed or interrupted start leaves no process either
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the process and wait until ``/health`` says the model is loaded; a
        ``RuntimeError`` with the server's last lines if it exits or takes too long."""
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (open until close())
        logger.info("starting %s", " ".join(self.command))
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent())  # noqa: PLW1509 (one libc call, no Python locks)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{SERVER} exited ({self.process.returncode}) before it "
                                   f"was ready:\n{self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{SERVER} was not ready after {self.start_timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def _healthy(self) -> bool:
        try:
            with self._opener.open(self.url + "/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False  # not listening yet, or 503 while it loads the model

    def complete(self, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        """POST ``body`` to ``/completion``; the response's JSON. A ``RuntimeError`` with the
        server's answer (or last lines) when it fails."""
        request = urllib.request.Request(self.url + "/completion",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", "replace")[:500]
            raise RuntimeError(f"{SERVER} /completion failed ({error.code}): {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            raise RuntimeError(f"{SERVER} /completion failed ({error}):\n"
                               f"{self.log_tail()}") from None

    def log_tail(self, lines: int = 8) -> str:
        """The last ``lines`` lines the server printed."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s) and drop its log."""
        process, self.process = self.process, None
        try:
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        finally:  # killed where SIGTERM was not enough, or the wait was interrupted
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
            if self._log is not None:
                self._log.close()
                self._log = None


class ServerEngine:
    """One llama.cpp mode (a key of ``MODES``) on its own ``llama-server``, for the runner:
    :meth:`measure` as the other engines, :meth:`close` stops the server.

    ``tokenizer``: ours, to encode the answer where the server sends only text;
    ``eos_token_ids``: the HF model's (an answer that stopped at one ends with it, as HF's).
    """

    name = "server"

    def __init__(self, server: LlamaServer, tokenizer, eos_token_ids: list[int]) -> None:
        self.server, self.tokenizer, self.eos = server, tokenizer, list(eos_token_ids)

    def measure(self, input_ids: torch.Tensor, max_new_tokens: int) -> Measurement:
        """Greedy decoding of ``input_ids`` ([1, L]) for up to ``max_new_tokens``, timed by
        the server."""
        prompt = input_ids[0].tolist()
        reply = parse_completion(self.server.complete(completion_request(prompt,
                                                                         max_new_tokens)))
        if reply.prompt_tokens + reply.cached_tokens != len(prompt) or reply.cached_tokens:
            logger.warning("%s evaluated %d prompt tokens (%d cached), ours has %d", SERVER,
                           reply.prompt_tokens, reply.cached_tokens, len(prompt))
        tokens = self.answer_tokens(reply, max_new_tokens)
        return Measurement(tokens=tokens, seconds=reply.seconds,
                           time_to_first_token=reply.prompt_ms / 1000,
                           steps=max(reply.predicted - reply.draft_accepted, 1))

    def answer_tokens(self, reply: Reply, max_new_tokens: int) -> list[int]:
        """The answer's ids: the server's, else its text encoded with our tokenizer (cut to
        the tokens it made, and ending with an end-of-sequence id where it stopped at one,
        which the text does not show)."""
        if reply.tokens:
            return reply.tokens[:max_new_tokens]
        made = min(reply.predicted, max_new_tokens)
        tokens = self.tokenizer(reply.content, add_special_tokens=False)["input_ids"][:made]
        stopped = reply.stop_type == "eos" and reply.predicted <= max_new_tokens
        if stopped and self.eos and tokens[-1:] != self.eos[:1]:
            tokens = tokens[:made - 1] + [self.eos[0]]
        return tokens

    def close(self) -> None:
        self.server.close()


def start_engine(method: str, binary: Path, gguf: Path, tokenizer, eos_token_ids: list[int],
                 threads: int, draft_gguf: Path | None = None,
                 draft_tokens: int | None = None, flags: set[str] | None = None,
                 f32_cache: bool = False) -> ServerEngine:
    """A started :class:`ServerEngine` of ``method`` (``flags``: :func:`server_flags` of
    ``binary``, read here when not given)."""
    flags = server_flags(binary) if flags is None else flags
    port = free_port()
    command = server_command(binary, gguf, method, port, threads, flags, draft_gguf,
                             draft_tokens, f32_cache)
    server = LlamaServer(command, port)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return ServerEngine(server, tokenizer, eos_token_ids)


def start_engines(methods: tuple[str, ...], binary: str | None, gguf: Path, tokenizer,
                  eos_token_ids: list[int], draft_gguf: Path | None = None,
                  draft_tokens: int | None = None,
                  threads: int | None = None) -> dict[str, ServerEngine]:
    """A started engine for each of ``methods`` that is a ``MODES`` key (none: no binary is
    looked for). ``binary``: ``--llamacpp-bin`` (see :func:`find_server`); ``threads``:
    torch's by default. Where one fails to start, those started are stopped again."""
    chosen = [method for method in methods if method in MODES]
    if not chosen:
        return {}
    found = find_server(binary)
    if found is None:
        raise ValueError(f"the {', '.join(chosen)} method(s) need llama.cpp's {SERVER}: pass "
                         f"--llamacpp-bin PATH (a llama.cpp build's bin folder) or put "
                         f"{SERVER} on PATH")
    flags = server_flags(found)
    threads = threads or torch.get_num_threads()
    engines: dict[str, ServerEngine] = {}
    try:
        for method in chosen:
            engines[method] = start_engine(method, found, gguf, tokenizer, eos_token_ids,
                                           threads, draft_gguf, draft_tokens, flags)
    except BaseException:
        close_engines(engines)
        raise
    return engines


def close_engines(engines: dict) -> None:
    """Stop every engine of ``engines`` that has a process (a ``close`` method)."""
    with contextlib.ExitStack() as stack:  # every one is stopped even if one fails to
        for engine in engines.values():
            if (close := getattr(engine, "close", None)) is not None:
                stack.callback(close)
