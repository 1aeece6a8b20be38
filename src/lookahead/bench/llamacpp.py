"""The ``llamacpp`` benchmark method: llama.cpp's plain greedy decoding of the same GGUF file.

Two engines, the first that is there:

* ``llama_cpp`` (llama-cpp-python): our prompt's token ids go in as they are, each step
  takes the arg-max of the logits (as HF greedy does), and decoding stops at the model's own
  end-of-sequence ids, so the tokens compare one for one with ours;
* a ``llama-completion`` (or ``llama-cli``) binary (``--llamacpp-bin``): the prompt goes in as
  text (our chat template's text, its special tokens parsed by llama.cpp), the answer comes
  back as text, which is encoded with our tokenizer to compare; the times come from the
  binary's own ``llama_perf_context_print`` lines (model load excluded).

Either way the thread count is torch's (``--threads``) and the token limit the benchmark's.
A ``Measurement``'s ``seconds`` is prompt evaluation plus decoding; ``time_to_first_token``
the prompt evaluation and the first token's choice. :func:`comparison_table` gives the
decode-only rates beside the end-to-end ones, and every run against llama.cpp's fastest mode
(this one or ``llama-server``'s, ``bench/llamacpp_server.py``).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lookahead.bench.methods import EXTERNAL_METHODS, Measurement
from lookahead.bench.groups import dataset_summaries
from lookahead.bench.report import ALL

logger = logging.getLogger(__name__)

LLAMACPP = "llamacpp"
# Every llama.cpp method: this engine's and llama-server's modes (bench/llamacpp_server.py).
LLAMACPP_METHODS = EXTERNAL_METHODS
# The binaries that take a prompt and print a completion, most suited first.
BINARY_NAMES = ("llama-completion", "llama-cli")
# Context room beyond the longest prompt and answer the benchmark asks for.
_CONTEXT = 8192


def have_bindings() -> bool:
    """Whether llama-cpp-python imports (with its shared library)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def find_binary(path: str | None) -> Path | None:
    """``path`` checked (a file, or a folder holding one of ``BINARY_NAMES``), else the first
    of ``BINARY_NAMES`` on ``PATH``; None when there is none."""
    if path is not None:
        given = Path(path).expanduser()
        for candidate in (given, *(given / name for name in BINARY_NAMES)):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"--llamacpp-bin: no {' or '.join(BINARY_NAMES)} at {given}")
    for name in BINARY_NAMES:
        if found := shutil.which(name):
            return Path(found)
    return None


# ----------------------------------------------------------------------------- bindings


class BindingsEngine:
    """Greedy decoding through llama-cpp-python, on our token ids.

    ``gguf``: the model file; ``eos_token_ids``: where decoding stops (the HF model's);
    ``threads``: llama.cpp's threads for both the prompt and the decoding; ``logits_all``:
    keep every position's logits (:meth:`prompt_logits`); ``f32_cache``: a float32 KV cache
    instead of llama.cpp's float16 one (whose rounding, 2e-4 in the logits, decides near
    ties: the tests compare with HF in float32).
    """

    name = "llama_cpp"

    def __init__(self, gguf: Path, eos_token_ids: list[int], threads: int,
                 logits_all: bool = False, f32_cache: bool = False) -> None:
        import llama_cpp

        self._lib = llama_cpp
        cache = {"type_k": 0, "type_v": 0} if f32_cache else {}  # 0: GGML_TYPE_F32
        self.llm = llama_cpp.Llama(str(gguf), n_ctx=_CONTEXT, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, logits_all=logits_all,
                                   verbose=False, **cache)
        self.eos = set(eos_token_ids)
        self.vocab = self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        """``float32 [vocab]``: the logits of the last token evaluated."""
        pointer = self._lib.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.vocab,))

    def measure(self, input_ids: torch.Tensor, max_new_tokens: int) -> Measurement:
        """Greedy decoding of ``input_ids`` ([1, L]) for up to ``max_new_tokens``."""
        prompt = input_ids[0].tolist()
        self.llm.reset()  # a fresh cache: no prefix of an earlier prompt is reused
        start = time.perf_counter()
        self.llm.eval(prompt)
        tokens = [int(np.argmax(self._last_logits()))]
        first = time.perf_counter()
        while len(tokens) < max_new_tokens and tokens[-1] not in self.eos:
            self.llm.eval(tokens[-1:])
            tokens.append(int(np.argmax(self._last_logits())))
        end = time.perf_counter()
        return Measurement(tokens=tokens, seconds=end - start, time_to_first_token=first - start,
                           steps=len(tokens))

    def prompt_logits(self, token_ids: list[int]) -> np.ndarray:
        """``float32 [len(token_ids), vocab]``: the logits after each token, teacher-forced
        (the engine must have been made with ``logits_all``)."""
        self.llm.reset()
        self.llm.eval(token_ids)
        return np.array(self.llm.scores[:len(token_ids)], copy=True)


# ----------------------------------------------------------------------------- the binary


@dataclass(frozen=True)
class Timings:
    """llama.cpp's own times of one run (``llama_perf_context_print``), in milliseconds."""

    prompt_ms: float
    prompt_tokens: int
    eval_ms: float
    eval_runs: int

    @property
    def seconds(self) -> float:
        return (self.prompt_ms + self.eval_ms) / 1000


# "common_perf_print:" in llama.cpp builds of 2026, "llama_perf_context_print:" before.
_PERF = re.compile(r"(?:common_perf_print|llama_perf_context_print):\s+(?P<what>prompt eval|eval)"
                   r" time =\s+(?P<ms>[\d.]+) ms /\s+(?P<count>\d+) (?:tokens|runs)")


def parse_timings(output: str) -> Timings:
    """The prompt and decoding times a ``llama-completion`` run printed (stdout and stderr
    together); ``ValueError`` when they are not there. ``eval_runs`` is the tokens fed back:
    the new tokens less the first (which comes from the prompt's pass)."""
    found = {m["what"]: (float(m["ms"]), int(m["count"])) for m in _PERF.finditer(output)}
    if "prompt eval" not in found or "eval" not in found:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise ValueError(f"llama.cpp printed no timings (common_perf_print); it ended "
                         f"with:\n{tail}")
    (prompt_ms, prompt_tokens), (eval_ms, eval_runs) = found["prompt eval"], found["eval"]
    return Timings(prompt_ms, prompt_tokens, eval_ms, eval_runs)


def binary_command(binary: Path, gguf: Path, prompt: str, max_new_tokens: int,
                   threads: int, f32_cache: bool = False) -> list[str]:
    """The command of one greedy run: no chat mode (the prompt is already templated: in chat
    mode it would be templated again), the prompt's backslashes left as they are (code has
    "\\n" in strings), no prompt echo, top-1 sampling; ``f32_cache``: as for
    :class:`BindingsEngine`."""
    cache = ["-ctk", "f32", "-ctv", "f32"] if f32_cache else []
    return [str(binary), "-m", str(gguf), "-p", prompt, "-n", str(max_new_tokens),
            "-t", str(threads), "-tb", str(threads), "-c", str(_CONTEXT), "--temp", "0",
            "--top-k", "1", "--seed", "0", "--no-display-prompt", "--no-warmup", "-no-cnv",
            "--no-escape", *cache]


class BinaryEngine:
    """Greedy decoding by a ``llama-completion`` binary: a process per prompt."""

    name = "binary"

    def __init__(self, binary: Path, gguf: Path, tokenizer, eos_token_ids: list[int],
                 threads: int, f32_cache: bool = False) -> None:
        self.binary, self.gguf, self.tokenizer, self.threads = binary, gguf, tokenizer, threads
        self.eos, self.f32_cache = list(eos_token_ids), f32_cache
        self.last_output = b""  # the last run's answer as printed

    def measure(self, input_ids: torch.Tensor, max_new_tokens: int) -> Measurement:
        prompt = self.tokenizer.decode(input_ids[0].tolist(), skip_special_tokens=False)
        command = binary_command(self.binary, self.gguf, prompt, max_new_tokens, self.threads,
                                 self.f32_cache)
        # Bytes: a token may print part of a character.
        done = subprocess.run(command, capture_output=True, check=False,
                              stdin=subprocess.DEVNULL)
        self.last_output = done.stdout
        stdout, stderr = (done.stdout.decode("utf-8", "replace"),
                          done.stderr.decode("utf-8", "replace"))
        if done.returncode != 0:
            raise RuntimeError(f"{self.binary.name} failed ({done.returncode}): "
                               f"{stderr.strip()[-500:]}")
        timings = parse_timings(stdout + stderr)
        if timings.prompt_tokens != input_ids.shape[1]:
            logger.warning("llama.cpp read the prompt as %d tokens, ours is %d",
                           timings.prompt_tokens, input_ids.shape[1])
        return Measurement(tokens=self.answer_tokens(stdout, timings, max_new_tokens),
                           seconds=timings.seconds, time_to_first_token=timings.prompt_ms / 1000,
                           steps=timings.eval_runs + 1)

    def answer_tokens(self, stdout: str, timings: Timings, max_new_tokens: int) -> list[int]:
        """The printed answer in our tokens: its text encoded (the same text may come from
        other tokens, rarely), cut to the tokens llama.cpp made, and an end-of-sequence id
        where it stopped short of ``max_new_tokens`` (HF greedy returns that id too)."""
        made = min(timings.eval_runs + 1, max_new_tokens)
        tokens = self.tokenizer(stdout, add_special_tokens=False)["input_ids"][:made]
        if made < max_new_tokens and self.eos:
            tokens = tokens[:made - 1] + [self.eos[0]]
        return tokens


# ----------------------------------------------------------------------------- for the runner


def make_engine(gguf: Path, tokenizer, eos_token_ids: list[int], binary: str | None,
                threads: int | None = None):
    """The bindings where they import and no binary was named, else the binary; a
    ``ValueError`` saying what to install when there is neither."""
    threads = threads or torch.get_num_threads()
    if binary is None and have_bindings():
        return BindingsEngine(gguf, eos_token_ids, threads)
    found = find_binary(binary)
    if found is None:
        raise ValueError("the llamacpp method needs llama-cpp-python (pip install "
                         "llama-cpp-python) or a llama.cpp binary: pass --llamacpp-bin PATH "
                         f"to {' or '.join(BINARY_NAMES)}")
    return BinaryEngine(found, gguf, tokenizer, eos_token_ids, threads)


def gguf_of(model: str, cache_dir: str | None, option: str = "--model") -> Path:
    """The GGUF file llama.cpp runs for ``model``: a bundled model's, a local ``.gguf`` path,
    or the hub cache's copy of a hub GGUF name (``owner/repo``, ``owner/repo:Q5_K_M``,
    ``owner/repo/file.gguf``; downloaded there first where needed, read from the cache
    offline: :mod:`lookahead.models.hub`). ``option`` is the flag that named ``model``.

    Raises:
        ValueError: a model that has no GGUF file (llama.cpp runs GGUF files only), or a hub
            repository without a single file of the tag asked for; the message names
            ``option`` and what it takes.
        ModelNotAvailableError: a bundled model not installed, or a hub file neither on a
            reachable hub nor in the cache (the message says what to run).
    """
    from lookahead.models.gguf import find_gguf
    from lookahead.models.hub import parse_hub_name, resolve_hub_name
    from lookahead.models.registry import BUNDLED_MODELS

    for spec in BUNDLED_MODELS:
        if spec.name == model:
            return find_gguf(spec, cache_dir=cache_dir)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    # A local folder or file is never asked of the hub, even where it reads as owner/repo.
    hub = None if path.exists() else parse_hub_name(model)
    problem = f"got {model!r}"
    if hub is not None:
        try:
            found = resolve_hub_name(hub).gguf
        except ValueError as error:  # no single file carries the tag: it lists the files
            raise ValueError(f"{option}: {error}") from None
        if found is not None:
            return found
        problem = f"{model!r} is a transformers checkpoint on the hub"
    raise ValueError(f"the llama.cpp methods run a GGUF file: {option} must be a bundled "
                     "model, a .gguf file or a Hugging Face hub name of a GGUF file "
                     f"(owner/repo, owner/repo:Q5_K_M, owner/repo/file.gguf); {problem}")


def add_arguments(parser) -> None:
    """``--llamacpp-bin`` for ``lookahead bench``."""
    parser.add_argument(
        "--llamacpp-bin", metavar="PATH",
        help="llama.cpp's binaries: a llama-completion (or llama-cli) or llama-server file, or "
        "their folder (a build's bin/). llamacpp runs llama-completion (default: "
        "llama-cpp-python if it imports, else llama-completion on PATH); llamacpp_server, "
        "llamacpp_ngram and llamacpp_draft run llama-server (default: the one on PATH)")


def decode_rate(runs: list[dict]) -> float:
    """Tokens a second after the first token, over ``runs`` (result records)."""
    tokens = sum(max(r["new_tokens"] - 1, 0) for r in runs)
    seconds = sum(r["seconds"] - r["time_to_first_token"] for r in runs)
    return tokens / seconds if seconds > 0 else 0.0


def fastest(rows: list[dict], methods) -> dict | None:
    """The summary row of ``methods`` with the most tokens a second (None: none ran)."""
    chosen = [row for row in rows if row["method"] in methods]
    return max(chosen, key=lambda row: row["tokens_per_second"], default=None)


def best_line(rows: list[dict], runs: list[dict]) -> str:
    """One line naming llama.cpp's fastest mode and ours, and how far ours leads."""
    from lookahead.config import method_names

    theirs, ours = fastest(rows, LLAMACPP_METHODS), fastest(rows, method_names())
    if theirs is None:
        return "llama.cpp: no mode ran"
    rate = theirs["tokens_per_second"]
    line = (f"llama.cpp best: {theirs['method']}, {rate:.1f} tok/s (decode only "
            f"{decode_rate(_runs_of(runs, theirs)):.1f})")
    if ours is not None:
        lead = f", {ours['tokens_per_second'] / rate:.2f}x llama.cpp best" if rate else ""
        line += (f"; fastest of ours: {ours['method']} ({ours['dtype']}), "
                 f"{ours['tokens_per_second']:.1f} tok/s (decode only "
                 f"{decode_rate(_runs_of(runs, ours)):.1f}){lead}")
    return line


def _runs_of(runs: list[dict], row: dict) -> list[dict]:
    return [r for r in runs if (r["method"], r["dtype"]) == (row["method"], row["dtype"])]


def comparison_table(results: dict) -> str:
    """Per data set (and "all" over several): each run's end-to-end and decode-only tokens a
    second, TTFT, texts equal to HF greedy in the same dtype, and its speed against
    llama.cpp's fastest mode (named in the column), then :func:`best_line` (Markdown)."""
    records = results["runs"]
    lines = []
    for dataset, rows in dataset_summaries(results).items():
        runs = records if dataset == ALL else [r for r in records if r["dataset"] == dataset]
        best = fastest(rows, LLAMACPP_METHODS)
        versus = f" vs llama.cpp best ({best['method']}) |" if best else ""
        lines += ["", f"### {dataset}: llama.cpp beside the others", "",
                  "| method | dtype | tok/s | decode tok/s | TTFT ms | identical |" + versus,
                  "|---|---|--:|--:|--:|--:|" + ("--:|" if best else "")]
        for row in rows:
            same = "baseline" if row["identical"] is None else f"{row['identical']}/{row['prompts']}"
            line = (f"| {row['method']} | {row['dtype']} | {row['tokens_per_second']:.1f} "
                    f"| {decode_rate(_runs_of(runs, row)):.1f} "
                    f"| {1000 * row['time_to_first_token']:.0f} | {same} |")
            if best:
                rate = best["tokens_per_second"]
                line += f" {row['tokens_per_second'] / rate:.2f}x |" if rate else " - |"
            lines.append(line)
        lines += ["", best_line(rows, runs)]
    return "\n".join(lines)
