"""``Datastore``: a fixed corpus that lookahead and prompt lookup copy from (REST-style)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import reference

import lookahead
from lookahead import Datastore, TextMemory
from lookahead.config import LookaheadConfig, PromptLookupConfig
from lookahead.sources.datastore import load_datastore, tokenize_documents
from lookahead.proposers.lookahead import LookaheadProposer
from lookahead.proposers.prompt_lookup import PromptLookupProposer

pytestmark = pytest.mark.usefixtures("one_thread")

DOCSTRING_CORPUS = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 9, 2, 3, 4, 6, 0]


def test_find_follows_the_most_frequent_continuation_of_the_longest_suffix() -> None:
    store = Datastore(DOCSTRING_CORPUS)
    assert store.find([1, 2, 3], 2) == [4, 5]  # the docstring's examples
    assert store.find([7, 2, 3], 2) == [4, 5]
    # Only "9 2 3" matches the longest suffix: one match proposes its first token alone.
    assert store.find([9, 2, 3], 3) == [4]
    assert store.find([7, 8, 3], 1) == [4]  # "3" alone, the shortest suffix
    assert len(store) == len(DOCSTRING_CORPUS)


def test_find_proposes_nothing_without_a_match() -> None:
    store = Datastore(DOCSTRING_CORPUS, min_match=2)
    assert store.find([7, 8, 3], 2) == []  # "8 3" never occurs, and "3" alone is too short
    assert store.find([3], 2) == []
    assert store.find([1, 2, 3], 0) == []
    assert store.find([], 2) == []
    assert store.find([1, 2, 99], 2) == []  # a token the corpus never holds
    assert store.find([4, 6, 0], 2) == []  # nothing follows the corpus's last 3-gram


def test_a_continuation_needs_enough_agreeing_matches() -> None:
    corpus = [1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 6, 0, 1, 2, 3, 4, 7, 0, 1, 2, 3, 8, 0]
    # 4 follows three of the four matches; after it 5, 6 and 7 once each.
    assert Datastore(corpus).find([1, 2, 3], 3) == [4]
    assert Datastore(corpus, min_count=3).find([1, 2, 3], 3) == [4]
    assert Datastore(corpus, min_count=4).find([1, 2, 3], 3) == []
    assert Datastore(corpus, min_count=1, min_share=0.0).find([1, 2, 3], 2) == [4, 5]


def test_a_suffix_found_everywhere_is_sampled_evenly() -> None:
    """Of 1000 matches, 10 spread evenly decide: 70 % of them go on with 5, 30 % with 6."""
    corpus = [tok for i in range(1000) for tok in (1, 5 if i % 10 < 7 else 6, 0)]
    assert Datastore(corpus, max_matches=10).find([1], 1) == [5]
    assert Datastore(corpus, max_matches=10, separator=0).find([1], 2) == [5]


def _reference_find(corpus, context, length, min_match, max_context, min_count, min_share):
    """``Datastore.find`` spelled out with lists and a Counter (no sampling)."""
    def starts_of(k):
        return [i + k for i in range(len(corpus) - k + 1) if corpus[i : i + k] == context[-k:]]

    for m in range(min(3, len(context)), min_match - 1, -1):
        if starts_of(m):
            break
    else:
        return []
    starts = [s for s in starts_of(m) if s + length <= len(corpus)]
    for k in range(4, min(max_context, len(context)) + 1) if m == 3 else ():
        longer = [s for s in starts if s - k >= 0 and corpus[s - k] == context[-k]]
        if not longer:
            break
        starts = longer
    rows, path = [corpus[s : s + length] for s in starts], []
    for depth in range(length if rows else 0):
        (token, count), = Counter(r[depth] for r in rows).most_common(1)
        if count < min_count and not (depth == 0 and len(rows) == 1):
            break
        if depth > 0 and count < min_share * len(rows):
            break
        path.append(token)
        rows = [r for r in rows if r[depth] == token]
    return path


@settings(max_examples=200, deadline=None)
@given(
    corpus=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    context=st.lists(st.integers(0, 4), min_size=0, max_size=10),
    length=st.integers(1, 5),
    min_match=st.integers(1, 3),
    min_count=st.integers(1, 3),
)
def test_find_matches_a_reference_written_with_lists(corpus, context, length, min_match, min_count) -> None:
    store = Datastore(corpus, min_match=min_match, max_context=6, min_count=min_count)
    if not context or max(context[-3:]) > max(corpus):
        expected = []
    else:
        expected = _reference_find(corpus, context, length, min_match, 6, min_count, 0.3)
    assert store.find(context, length) == expected


@pytest.mark.parametrize(
    "kwargs, match",
    [({"tokens": []}, "tokens must be a non-empty 1-D"),
     ({"tokens": [[1, 2], [3, 4]]}, "tokens must be a non-empty 1-D"),
     ({"tokens": [1.5, 2.0]}, "tokens must be a non-empty 1-D"),
     ({"tokens": [1, -2, 3]}, "tokens must be token ids"),
     ({"tokens": [1, 2], "min_match": 0}, "min_match"),
     ({"tokens": [1, 2], "min_match": 4}, "min_match"),
     ({"tokens": [1, 2], "min_match": 3, "max_context": 2}, "max_context"),
     ({"tokens": [1, 2], "min_count": 0}, "min_count"),
     ({"tokens": [1, 2], "min_share": 1.5}, "min_share"),
     ({"tokens": [1, 2_000_000]}, "too large to index"),
     ({"tokens": [1, 2], "index": (np.zeros(3, np.int32), np.zeros(3, np.int64))}, "index"),
     ({"tokens": [1, 2], "index": (np.zeros(2, np.int32), np.zeros(2, np.int32))}, "index")],
)  # fmt: skip
def test_bad_datastore_settings_name_the_argument(kwargs, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        Datastore(**kwargs)


class _WordTokenizer:
    """Splits on spaces; ids are the words' first-seen order (EOS = 0). Counts its calls."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab = {"<eos>": 0}
        self.calls = 0

    def __call__(self, texts, add_special_tokens=False):
        self.calls += 1
        return {"input_ids": [[self.vocab.setdefault(w, len(self.vocab)) for w in t.split()]
                              for t in texts]}

    def get_vocab(self):
        return dict(self.vocab)


def test_documents_are_separated_so_no_match_runs_across_them() -> None:
    tokenizer = _WordTokenizer()
    tokens = tokenize_documents(tokenizer, ["a b c", "d e"])
    assert tokens.tolist() == [1, 2, 3, 0, 4, 5, 0]
    assert tokens.dtype == np.int32
    store = Datastore.from_texts(_WordTokenizer(), ["a b c", "a b c d", "x a b c d"])
    # "c" then "d" twice of three; the path stops where both documents end.
    assert store.find([1, 2], 3) == [3, 4]
    assert Datastore(store.tokens).find([1, 2], 3) == [3, 4, 0]  # no separator given


def test_from_files_reads_folders_skips_binaries_and_caches_the_tokens(tmp_path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "one.py").write_text("for i in range ( n ) :")
    (corpus / "sub" / "two.txt").write_text("for i in range ( m ) :")
    (corpus / "blob.bin").write_bytes(b"\xff\xfe\x00\x81")  # not UTF-8: skipped
    tokenizer = _WordTokenizer()
    tokenizer(["for i in range ( n m ) : while True pass"])  # a vocabulary that stays put
    tokenizer.calls = 0
    store = Datastore.from_files(tokenizer, [corpus], cache_dir=tmp_path / "cache")
    assert len(store) == 2 * (8 + 1)  # eight words and a separator per file
    assert tokenizer.calls == 1
    assert list((tmp_path / "cache" / "datastores").glob("*.npy"))
    again = Datastore.from_files(tokenizer, [corpus], cache_dir=tmp_path / "cache")
    assert tokenizer.calls == 1  # loaded from the cache
    assert again.tokens.tolist() == store.tokens.tolist()
    (corpus / "one.py").write_text("while True : pass")  # a changed file is tokenized anew
    Datastore.from_files(tokenizer, [corpus], cache_dir=tmp_path / "cache")
    assert tokenizer.calls == 2


def test_a_cached_store_maps_its_tokens_and_index_and_finds_the_same(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text(" ".join(f"w{w}" for w in rng.integers(0, 12, size=3000)))
    tokenizer = _WordTokenizer()
    tokenizer([corpus.read_text()])  # a vocabulary that stays put
    tokenizer.calls = 0
    built = Datastore.from_files(tokenizer, [corpus], cache_dir=tmp_path)
    cached = sorted(p.name for p in (tmp_path / "datastores").iterdir())
    assert len(cached) == 3 and all(p.endswith(".npy") for p in cached)  # tokens, order, keys
    mapped = Datastore.from_files(tokenizer, [corpus], cache_dir=tmp_path)
    assert tokenizer.calls == 1
    assert all(isinstance(a, np.memmap) for a in (mapped.tokens, *mapped.index))
    tokens = built.tokens.tolist()
    for end in range(3, 600, 7):
        for length in (1, 4):
            assert mapped.find(tokens[:end], length) == built.find(tokens[:end], length)


def test_the_python_datastore_adds_the_installed_packages_to_the_stdlib(tmp_path,
                                                                         monkeypatch) -> None:
    stdlib, site = tmp_path / "lib", tmp_path / "lib" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (stdlib / "os.py").write_text("import sys")
    (site / "pkg" / "mod.py").write_text("import numpy")
    (site / "pkg" / "data.json").write_text("not code")  # only *.py files
    monkeypatch.setattr("lookahead.sources.datastore.sysconfig.get_paths",
                        lambda: {"stdlib": str(stdlib), "purelib": str(site),
                                 "platlib": str(site)})
    tokenizer = _WordTokenizer()
    python = load_datastore("python", tokenizer, cache_dir=tmp_path)
    words = {i: w for w, i in tokenizer.get_vocab().items()}
    assert sorted(words[t] for t in python.tokens.tolist() if t) == [
        "import", "import", "numpy", "sys"]  # each file once, though site is both libs
    only_stdlib = load_datastore("stdlib", tokenizer, cache_dir=tmp_path)
    assert [words[t] for t in only_stdlib.tokens.tolist() if t] == ["import", "sys"]


def test_missing_sources_give_errors_that_say_what_was_expected(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="paths: .*neither a file nor a folder"):
        Datastore.from_files(_WordTokenizer(), [tmp_path / "nope"], cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="paths: no files found"):
        Datastore.from_files(_WordTokenizer(), [tmp_path / "empty"], cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="datastore: expected 'stdlib', 'python' or a"):
        load_datastore(str(tmp_path / "nope"), _WordTokenizer(), cache_dir=tmp_path)


def test_the_python_stdlib_datastore_holds_its_idioms(tmp_path) -> None:
    tokenizer = _WordTokenizer()
    store = load_datastore("stdlib", tokenizer, cache_dir=tmp_path)
    assert len(store) > 100_000
    ids = tokenizer.get_vocab()
    words = {i: w for w, i in ids.items()}
    found = store.find([ids[w] for w in ("if", "__name__", "==")], 1)
    assert [words[t] for t in found] in (["'__main__':"], ['"__main__":'])


def test_proposers_copy_from_the_datastore_when_text_and_memory_have_no_match() -> None:
    store = Datastore([40, 41, 42, 43, 44, 45, 0, 40, 41, 42, 43, 44, 45, 0,
                       2, 51, 52, 60, 0, 2, 51, 52, 60, 0])
    memory = TextMemory()
    memory.add([2, 51, 52, 53])
    context = [1, 2, 40, 41, 42]  # nothing repeats within it; the memory lacks "41 42"
    memory_first = [1, 2, 51, 52]  # both the memory and the store hold "2 51 52"
    for proposer in (
        PromptLookupProposer(PromptLookupConfig(num_draft_tokens=3), memory, datastore=store),
        LookaheadProposer(LookaheadConfig(window=2, ngram=3, guess=2), memory=memory,
                          datastore=store),
    ):
        proposer.start(context[:3])
        assert [43, 44, 45] in proposer.propose(context, max_tokens=3).candidates
        without = type(proposer)(proposer.config, memory=memory)
        without.start(context[:3])
        assert [43, 44, 45] not in without.propose(context, max_tokens=3).candidates
        # The memory comes first: it holds the answers to this request's neighbours.
        proposer.start(memory_first[:2])
        candidates = proposer.propose(memory_first, max_tokens=3).candidates
        assert [53] in candidates and not any(c[:1] == [60] for c in candidates)


@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup"])
def test_copying_from_a_datastore_keeps_the_exact_output(tiny_lm, method) -> None:
    model = tiny_lm("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    expected = reference(model, ids, 24)
    store = Datastore(expected[0].tolist() + [0] + expected[0].tolist())
    plain = lookahead.generate(model, ids, 24, method)
    helped = lookahead.generate(model, ids, 24, method, datastore=store)
    for result in (plain, helped):
        assert result.sequences.tolist() == expected.tolist()
    assert helped.stats.steps < plain.stats.steps  # the answer is in the store


def test_datastore_must_be_a_datastore_and_only_for_copying_methods(tiny_lm) -> None:
    model = tiny_lm("llama")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(TypeError, match="datastore must be a lookahead.Datastore"):
        lookahead.generate(model, ids, 4, "lookahead", datastore=[1, 2])
    with pytest.raises(TypeError, match="unknown option.*datastore"):
        lookahead.generate(model, ids, 4, "autoregressive", datastore=Datastore([1, 2, 3]))
