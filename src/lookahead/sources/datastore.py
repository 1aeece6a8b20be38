"""A datastore: a large, fixed body of text to copy continuations from.

Retrieval-based speculative decoding (REST, He et al., NAACL 2024) proposes what most often
followed the text's last tokens in a corpus. Our proposers copy from the request's own text
first and from ``TextMemory`` (earlier requests) next; where neither holds the last n-gram,
a ``Datastore`` answers from text the model never saw in this process -- for code, the Python
standard library that every Python installation carries. It changes what is proposed, never
what greedy decoding outputs.

On the first 20 HumanEval prompts with Qwen2.5-Coder-1.5B, replaying the recorded greedy
outputs (``benchmarks/replay_text_proposers.py --datastore stdlib --lookup-tokens 4``), the
standard library (7.9M tokens, its tests included) took the text candidates of lookahead
(N4 G2 L4, with memory) from 1.83 to 2.04 tokens per step, and on MT-Bench from 1.30 to 1.36.

``Datastore.python_code`` adds the packages installed beside the interpreter (its
site-packages) to the standard library. On the same replay with steps capped at 6 tokens,
its 66M tokens in this project's environment gave HumanEval 1.89 tokens per step where the
standard library gave 1.83, and MT-Bench 1.38 against 1.36, for 1 GB of cache on disk
(mapped, not read into memory).

Example::

    store = lookahead.Datastore.python_stdlib(tokenizer)        # tokenized once, then cached
    lookahead.generate(model, ids, 256, method="lookahead", datastore=store)

The store is read-only once built, so one object serves every request of a process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np

from lookahead.config import check_int

logger = logging.getLogger(__name__)

# Folders of the standard library that are not the standard library's own code.
_NOT_STDLIB = ("site-packages", "dist-packages")
# The index keys every 3-gram; a shorter suffix is a range of those keys.
_INDEXED = 3


class Datastore:
    """Token ids [n] of a corpus, indexed by every 3-gram, answering ``find``.

    tokens: the corpus as one sequence of token ids, its documents separated by ``separator``.
    min_match: the shortest suffix of the context that may match (1: the most frequent
        continuation of the last token is better than no proposal when nothing longer occurs).
    max_context: the longest suffix of the context that is matched (the longest one that
        occurs in the corpus wins).
    min_count: how many matches must agree on a proposed token (the first token of a lone
        match is proposed all the same).
    min_share: past the first token, the share of the still-agreeing matches that the most
        frequent next token must hold to be proposed.
    max_matches: matches examined per lookup, spread evenly over all of them (bounding the
        cost of a suffix that occurs everywhere).
    separator: the token that ends each document (never proposed); None: none.
    index: ``store.index`` of an earlier store of the same tokens (arrays may be memory-mapped),
        so that a large corpus is not sorted again; None: build it.
    """

    def __init__(self, tokens: Sequence[int] | np.ndarray, *, min_match: int = 1,
                 max_context: int = 8, min_count: int = 2, min_share: float = 0.3,
                 max_matches: int = 4096, separator: int | None = None,
                 index: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.min_match = check_int("min_match", min_match, 1, _INDEXED)
        self.max_context = check_int("max_context", max_context, self.min_match, 64)
        self.min_count = check_int("min_count", min_count, 1, 1 << 20)
        self.max_matches = check_int("max_matches", max_matches, 1, 1 << 24)
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"min_share must be a fraction in [0, 1], got {min_share!r}")
        self.min_share = float(min_share)
        self.separator = separator
        self.tokens = _as_token_array(tokens)
        # A 3-gram's key is the 3-gram as a number in base vocab + 1; it fits an int64 for
        # vocabularies up to 1.6M tokens. The extra digit pads the 3-grams that run past
        # the end, so that they match no context.
        self._pad = int(self.tokens.max()) + 1
        self._base = self._pad + 1
        if self._base ** _INDEXED >= 1 << 62:
            raise ValueError(f"tokens: ids up to {self._pad - 1} are too large to index")
        if index is None:
            keys = self._keys(self.tokens)
            # Positions by key (equal keys in corpus order): [n].
            order = np.argsort(keys, kind="stable").astype(self.tokens.dtype)
            index = (order, keys[order])
            logger.info("datastore of %d tokens indexed", len(self.tokens))
        self._order, self._sorted_keys = _check_index(index, len(self.tokens))

    @property
    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions [n] in the order of their 3-gram keys, those keys sorted [n] int64):
        what ``find`` searches, to be saved and passed back as ``index=``."""
        return self._order, self._sorted_keys

    def __len__(self) -> int:
        """Tokens in the corpus."""
        return len(self.tokens)

    def find(self, context: Sequence[int], length: int) -> list[int]:
        """Up to ``length`` tokens that most often followed the context's longest matching
        suffix (``min_match`` to ``max_context`` tokens); [] when none matched.

        Example: in ``Datastore([1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 9, 2, 3, 4, 6, 0])``,
        ``find([1, 2, 3], 2)`` is ``[4, 5]``: ``1, 2, 3`` occurs twice, followed by 4, 5.
        ``find([7, 2, 3], 2)`` matches ``2, 3`` three times: 4 is followed by 5 twice and
        by 6 once, so again ``[4, 5]``.
        """
        if length <= 0 or not context:
            return []
        rows = self.tokens[self._matches(context, length)[:, None] + np.arange(length)]
        return self._most_frequent_path(rows) if len(rows) else []

    def _matches(self, context: Sequence[int], length: int) -> np.ndarray:
        """Corpus indices just after occurrences of the longest matching suffix, each
        followed by at least ``length`` tokens: [matches]."""
        if max(context[-_INDEXED:]) >= self._pad:  # a token the corpus never holds
            return np.zeros(0, dtype=np.int64)
        for m in range(min(_INDEXED, len(context)), self.min_match - 1, -1):
            low, high = self._key_range(context[-m:])
            if high > low:
                break
        else:
            return np.zeros(0, dtype=np.int64)
        if high - low > self.max_matches:  # an even spread keeps the continuations' shares
            picks = np.linspace(low, high - 1, self.max_matches).astype(np.int64)
        else:
            picks = np.arange(low, high)
        starts = np.sort(self._order[picks].astype(np.int64)) + m  # in corpus order
        starts = starts[starts + length <= len(self.tokens)]
        if m == _INDEXED:
            starts = self._narrow(starts, context)
        return starts

    def _key_range(self, suffix: Sequence[int]) -> tuple[int, int]:
        """[low, high) of the sorted keys whose 3-grams begin with ``suffix`` (1-3 tokens)."""
        key = 0
        for token in suffix:
            key = key * self._base + int(token)
        width = self._base ** (_INDEXED - len(suffix))
        low, high = np.searchsorted(self._sorted_keys, [key * width, (key + 1) * width])
        return int(low), int(high)

    def _narrow(self, starts: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """Keep the matches of ever longer suffixes of ``context``, while any is left."""
        for k in range(_INDEXED + 1, min(self.max_context, len(context)) + 1):
            before = starts - k
            keep = before >= 0
            keep[keep] = self.tokens[before[keep]] == context[-k]
            if not keep.any():
                break  # no longer suffix occurs: the matches so far stand
            starts = starts[keep]
        return starts

    def _most_frequent_path(self, rows: np.ndarray) -> list[int]:
        """Walk the matches' continuations [matches, length] down their most frequent token
        while enough of them agree."""
        path: list[int] = []
        for depth in range(rows.shape[1]):
            values, first, counts = np.unique(rows[:, depth], return_index=True,
                                              return_counts=True)
            tied = np.flatnonzero(counts == counts.max())
            best = int(tied[np.argmin(first[tied])])  # a tie goes to the earliest match
            lone_first = depth == 0 and len(rows) == 1
            if counts[best] < self.min_count and not lone_first:
                break
            if depth > 0 and counts[best] < self.min_share * len(rows):
                break
            if values[best] == self.separator:  # the document ends: its next one is unrelated
                break
            path.append(int(values[best]))
            rows = rows[rows[:, depth] == values[best]]
        return path

    def _keys(self, tokens: np.ndarray) -> np.ndarray:
        """The key of the 3-gram at each position of ``tokens`` [n]: [n]. The last two run
        past the end, into padding (so their first tokens still match shorter suffixes)."""
        padding = np.full(_INDEXED - 1, self._pad, dtype=np.int64)
        padded = np.concatenate([tokens.astype(np.int64), padding])
        keys = np.zeros(len(tokens), dtype=np.int64)
        for i in range(_INDEXED):
            keys = keys * self._base + padded[i : i + len(tokens)]
        return keys

    @classmethod
    def from_texts(cls, tokenizer, texts: Iterable[str], **options) -> Datastore:
        """Tokenize ``texts`` (documents, each ended by the tokenizer's EOS) into a datastore."""
        tokens = tokenize_documents(tokenizer, list(texts))
        return cls(tokens, separator=_separator(tokenizer), **options)

    @classmethod
    def from_files(cls, tokenizer, paths: Iterable[str | Path], *, cache_dir: str | Path | None
                   = None, **options) -> Datastore:
        """A datastore of the text files among ``paths`` (folders are searched through).

        Files that do not decode as UTF-8 are skipped. The tokens and their index are cached
        under ``<cache_dir>/datastores`` (default: the user cache), keyed by the files (path,
        size, modification time) and the tokenizer, so a second process maps them from disk
        in a moment instead of tokenizing and sorting again.
        """
        files = sorted(_text_files(paths))
        if not files:
            raise ValueError(f"paths: no files found in {[str(p) for p in paths]}")
        cache = _cache_path(tokenizer, files, cache_dir)
        if cache.exists():
            tokens = np.load(cache, mmap_mode="r")
        else:
            texts = [text for text in map(_read_text, files) if text]
            logger.info("tokenizing %d files for a datastore", len(texts))
            tokens = tokenize_documents(tokenizer, texts)
            _save(cache, tokens)
        order_file, keys_file = (cache.with_suffix(f".{part}.npy") for part in ("order", "keys"))
        index = None
        if order_file.exists() and keys_file.exists():
            index = (np.load(order_file, mmap_mode="r"), np.load(keys_file, mmap_mode="r"))
        store = cls(tokens, separator=_separator(tokenizer), index=index, **options)
        if index is None:
            for path, array in zip((order_file, keys_file), store.index):
                _save(path, array)
        return store

    @classmethod
    def python_stdlib(cls, tokenizer, *, cache_dir: str | Path | None = None,
                      **options) -> Datastore:
        """A datastore of the running Python's standard library (``*.py``, tests included)."""
        return cls.from_files(tokenizer, _stdlib_files(), cache_dir=cache_dir, **options)

    @classmethod
    def python_code(cls, tokenizer, *, cache_dir: str | Path | None = None,
                    **options) -> Datastore:
        """A datastore of the Python code the running interpreter can import: its standard
        library and the packages installed in its site-packages (``*.py``). The first build
        tokenizes every file (about 2 minutes for 250 MB of code on 2 cores)."""
        paths = sysconfig.get_paths()
        sites = {Path(paths[key]) for key in ("purelib", "platlib")}
        files = _stdlib_files() + [f for site in sorted(sites) if site.is_dir()
                                   for f in site.rglob("*.py")]
        return cls.from_files(tokenizer, files, cache_dir=cache_dir, **options)


# The corpora a command line names, by name (else it names a file or folder).
NAMED = MappingProxyType({"stdlib": Datastore.python_stdlib, "python": Datastore.python_code})


def load_datastore(spec: str, tokenizer, *, cache_dir: str | Path | None = None) -> Datastore:
    """The datastore a command line names: ``"stdlib"`` (the Python standard library),
    ``"python"`` (it and the installed packages) or a file or folder of text."""
    check_spec(spec)
    if spec in NAMED:
        return NAMED[spec](tokenizer, cache_dir=cache_dir)
    return Datastore.from_files(tokenizer, [spec], cache_dir=cache_dir)


def check_spec(spec: str) -> None:
    """Raise FileNotFoundError unless ``spec`` names a corpus ("stdlib", "python") or an
    existing path (a command checks this before it loads a model)."""
    if spec not in NAMED and not Path(spec).exists():
        raise FileNotFoundError(f"datastore: expected 'stdlib', 'python' or a file or folder "
                                f"of text, got {spec!r}, which does not exist")


def tokenize_documents(tokenizer, texts: list[str]) -> np.ndarray:
    """Token ids [n] (int32) of ``texts``, each followed by the tokenizer's EOS token (or by
    token 0 when it has none), so that no match runs from one document into the next."""
    separator = _separator(tokenizer)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    total = sum(len(doc) + 1 for doc in ids)
    tokens = np.empty(total, dtype=np.int32)
    at = 0
    for doc in ids:
        tokens[at : at + len(doc)] = doc
        tokens[at + len(doc)] = separator
        at += len(doc) + 1
    return tokens


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [f for f in root.rglob("*.py") if not set(f.parts) & set(_NOT_STDLIB)]


def _check_index(index: tuple[np.ndarray, np.ndarray], size: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    order, keys = index
    if order.shape != (size,) or keys.shape != (size,) or keys.dtype != np.int64:
        raise ValueError(f"index: expected positions [{size}] and int64 keys [{size}] (a "
                         f"store's .index), got shapes {list(order.shape)} and "
                         f"{list(keys.shape)}, keys {keys.dtype}")
    return order, keys


def _save(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` whole or not at all (another process may be reading)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as f:
        np.save(f, array)
    os.replace(partial, path)


def _separator(tokenizer) -> int:
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def _as_token_array(tokens) -> np.ndarray:
    array = np.asanyarray(tokens)  # a memory map stays one
    if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be a non-empty 1-D sequence of token ids, got an array of "
                         f"shape {list(array.shape)} and dtype {array.dtype}")
    if int(array.min()) < 0:
        raise ValueError(f"tokens must be token ids (>= 0), got {int(array.min())}")
    # int32 halves the memory of a large corpus (7.9M tokens: 32 MB, and as much again for
    # the positions) where ids and positions fit.
    small = int(array.max()) < 1 << 31 and array.size < 1 << 31
    return array.astype(np.int32 if small else np.int64, copy=False)  # a mapped file stays so


def _text_files(paths: Iterable[str | Path]) -> Iterable[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            yield from (f for f in path.rglob("*") if f.is_file())
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"paths: {path} is neither a file nor a folder")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


def _cache_path(tokenizer, files: list[Path], cache_dir: str | Path | None) -> Path:
    from lookahead.models.registry import cache_root

    digest = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items())
    digest.update(json.dumps([type(tokenizer).__name__, vocab]).encode())
    for f in files:
        stat = f.stat()
        digest.update(f"{f.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    root = cache_root(cache_dir)
    return root / "datastores" / f"{digest.hexdigest()[:24]}.npy"
