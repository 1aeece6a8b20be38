"""``lookahead.generate`` speaks transformers' language: what ``model.generate`` takes, it takes,
and greedy output is ``model.generate``'s token for token, for every method.

Covered: ``**tokenizer(...)`` inputs, a left-padded batch with ragged finishes, settings from a
``GenerationConfig`` and from the model's own ``generation_config`` (a repetition penalty,
applied at every verified position), streamers, stop strings, custom logits processors, and
``model.generate(custom_generate=lookahead.custom_generate)``. Tiny float64 models, few tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import word_tokenizer
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

import lookahead
from lookahead.controls import Controls

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 16
# 64 words, the tiny vocabulary. transformers' stop-string matching tokenizes "abcdef" to
# learn how the tokenizer joins tokens, so it is a word too.
WORDS = ["<unk>", "<s>", "</s>", "abcdef"] + [f"w{i}" for i in range(60)]
METHODS = {
    "autoregressive": {},
    "lookahead": {"window": 2, "ngram": 3, "guess": 2, "token_cost": 0},
    "prompt_lookup": {},
    "draft": {"draft_model": None},  # the other model of the fixture
}
COPYING = ("lookahead", "prompt_lookup")


@pytest.fixture(scope="module")
def models(fresh_lm):
    """(target, draft): fresh float64 Llamas with EOS id 2 (``</s>``), pad unset."""
    target, draft = fresh_lm("llama", seed=0), fresh_lm("llama", seed=1)
    for model in (target, draft):
        model.generation_config.eos_token_id = 2
    return target, draft


@pytest.fixture(scope="module")
def tokenizer():
    tok = word_tokenizer(WORDS)
    tok.pad_token = "<unk>"
    tok.padding_side = "left"
    return tok


def options(method: str, draft) -> dict:
    opts = dict(METHODS[method])
    if "draft_model" in opts:
        opts["draft_model"] = draft
    return opts


def echo(model, seed_ids: list[int], length: int = 12) -> list[int]:
    """``seed_ids`` and the model's own greedy continuation: a text whose continuation repeats,
    so that copying methods have candidates to accept."""
    ids = torch.tensor([seed_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length,
                         do_sample=False, eos_token_id=None)
    return out[0].tolist()


def hf(model, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**kwargs)


@pytest.mark.parametrize("method", list(METHODS))
def test_tokenizer_output_as_keywords(models, tokenizer, method):
    model, draft = models
    inputs = tokenizer(" ".join(WORDS[i] for i in echo(model, [5, 9, 5, 9, 7])),
                       return_tensors="pt")
    assert set(inputs) >= {"input_ids", "attention_mask"}
    ours = lookahead.generate(model, **inputs, max_new_tokens=NEW, method=method,
                              **options(method, draft))
    assert ours.sequences.tolist() == hf(model, **inputs, max_new_tokens=NEW).tolist()
    assert ours.new_tokens.shape[1] == ours.stats.new_tokens


def padded_batch(model, tokenizer):
    """Three prompts of different lengths, left-padded, echo texts so that copies are taken."""
    texts = [echo(model, [5, 9, 5, 9, 7]), echo(model, [11, 4], 4), echo(model, [20, 21, 22], 8)]
    return tokenizer([" ".join(WORDS[i] for i in t) for t in texts], return_tensors="pt",
                     padding=True)


@pytest.mark.parametrize("batched", [True, None], ids=["rows-together", "rows-apart"])
@pytest.mark.parametrize("method", list(METHODS))
def test_left_padded_batch_with_ragged_finishes(models, tokenizer, method, batched):
    model, draft = models
    inputs = padded_batch(model, tokenizer)
    assert len(set(inputs["attention_mask"].sum(1).tolist())) == 3  # three lengths
    # An EOS one row writes early, so that rows end apart and padding follows.
    plain = hf(model, **inputs, max_new_tokens=NEW, eos_token_id=None)
    width = inputs["input_ids"].shape[1]
    eos = plain[1, width + 3].item()
    ref = hf(model, **inputs, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    lengths = [(row != 0).sum().item() for row in ref[:, width:]]
    assert len(set(lengths)) > 1, f"rows end together: {lengths}"
    ours = lookahead.generate(model, **inputs, max_new_tokens=NEW, eos_token_id=eos,
                              pad_token_id=0, method=method, batched=batched,
                              **options(method, draft))
    assert ours.sequences.tolist() == ref.tolist()
    assert len(ours.row_stats) == 3
    assert ours.stats.new_tokens == sum(s.new_tokens for s in ours.row_stats)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("penalty", [1.4, 0.5])
def test_generation_config_with_repetition_penalty(models, method, penalty):
    """A penalty above 1 changes the text; one below 1 keeps it repeating, so that copied
    candidates are accepted through the processor."""
    model, draft = models
    # Below 1 the penalty rewards repeats: a prompt not repeating yet, so that it changes it.
    ids = torch.tensor([echo(model, [5, 9, 5, 9, 7]) if penalty > 1 else [5, 9, 13, 30, 7]])
    config = GenerationConfig(max_new_tokens=NEW, repetition_penalty=penalty, do_sample=False)
    ref = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    plain = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW)
    assert ref.tolist() != plain.tolist(), "the penalty changes nothing here"
    ours = lookahead.generate(model, ids, generation_config=config, method=method,
                              **options(method, draft))
    assert ours.sequences.tolist() == ref.tolist()
    if method in COPYING and penalty < 1:
        assert sum(ours.stats.accepted_per_step) > 0


@pytest.mark.parametrize("method", list(METHODS))
def test_the_models_own_generation_config_is_read(models, method):
    model, draft = models
    model = copy.deepcopy(model)
    model.generation_config.repetition_penalty = 1.4
    model.generation_config.max_new_tokens = NEW
    ids = torch.tensor([echo(model, [5, 9, 5, 9, 7])])
    ref = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    ours = lookahead.generate(model, ids, method=method, **options(method, draft))
    assert ours.sequences.tolist() == ref.tolist()
    assert ours.new_tokens.shape[1] == NEW  # the config's max_new_tokens, not our default


class Recorder:
    """A streamer that writes down what it is handed."""

    def __init__(self) -> None:
        self.puts: list[list] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ends += 1


@pytest.mark.parametrize("method", list(METHODS))
def test_streamer_gets_what_model_generate_gives_it(models, method):
    model, draft = models
    ids = torch.tensor([echo(model, [5, 9, 5, 9, 7])])
    theirs, ours = Recorder(), Recorder()
    hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
       streamer=theirs)
    lookahead.generate(model, ids, max_new_tokens=NEW, streamer=ours, method=method,
                       **options(method, draft))
    assert ours.puts == theirs.puts and ours.ends == theirs.ends == 1
    assert len(ours.puts) == NEW + 1  # the prompt, then one token at a time


@pytest.mark.parametrize("method", list(METHODS))
def test_custom_generate_inside_model_generate(models, tokenizer, method):
    model, draft = models
    inputs = padded_batch(model, tokenizer)
    settings = {"max_new_tokens": NEW, "repetition_penalty": 1.2, "no_repeat_ngram_size": 4}
    ref = hf(model, **inputs, **settings)
    ours = hf(model, **inputs, **settings, custom_generate=lookahead.custom_generate,
              method=method, **options(method, draft))
    assert ours.tolist() == ref.tolist()
    out = hf(model, **inputs, **settings, custom_generate=lookahead.custom_generate,
             return_dict_in_generate=True, method=method, **options(method, draft))
    assert out.sequences.tolist() == ref.tolist()


class ParityBan(LogitsProcessor):
    """Bans token 7 after texts of even length and token 9 after odd ones: the output depends
    on every position seeing its own length (not a row-wise processor we know)."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        even = input_ids.shape[1] % 2 == 0
        scores[:, 7 if even else 9] = -float("inf")
        return scores


@pytest.mark.parametrize("method", list(METHODS))
def test_custom_processor_sees_each_positions_own_prefix(models, method):
    model, draft = models
    ids = torch.tensor([echo(model, [7, 9, 7, 9, 7])])
    kwargs = {"max_new_tokens": NEW, "logits_processor": [ParityBan()], "min_new_tokens": 6}
    ref = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    ours = lookahead.generate(model, ids, method=method, **kwargs, **options(method, draft))
    assert ours.sequences.tolist() == ref.tolist()


@pytest.mark.parametrize("method", ["autoregressive", "lookahead"])
def test_stop_strings(models, tokenizer, method):
    model, draft = models
    ids = torch.tensor([echo(model, [5, 9, 5, 9, 7])])
    plain = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW)
    new = plain[0, ids.shape[1] :].tolist()
    stop = f"{WORDS[new[4]]} {WORDS[new[5]]}"  # ends at the 6th new token at the latest
    kwargs = {"max_new_tokens": NEW, "stop_strings": [stop], "tokenizer": tokenizer}
    ref = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert ref.shape[1] <= ids.shape[1] + 6
    ours = lookahead.generate(model, ids, method=method, **kwargs, **options(method, draft))
    assert ours.sequences.tolist() == ref.tolist()


def test_sampling_settings_come_from_the_models_config(models):
    """A model whose config samples makes lookahead sample too (seeded: reproducible)."""
    model = copy.deepcopy(models[0])
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.5
    ids = torch.tensor([[5, 9, 5, 9, 7]])
    runs = {tuple(lookahead.generate(model, ids, max_new_tokens=8, seed=s).sequences[0].tolist())
            for s in range(6)}
    assert len(runs) > 1
    greedy = lookahead.generate(model, ids, max_new_tokens=8, do_sample=False)
    ref = hf(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
             do_sample=False)
    assert greedy.sequences.tolist() == ref.tolist()
    assert lookahead.generate(model, ids, max_new_tokens=8, seed=3).sequences.tolist() == \
        lookahead.generate(model, ids, max_new_tokens=8, seed=3).sequences.tolist()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_beams": 2}, "num_beams"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
        ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
        ({"prompt_lookup_num_tokens": 3}, "prompt_lookup"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
        ({"guidance_scale": 1.5}, "guidance_scale"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(models, kwargs, name):
    ids = torch.tensor([[5, 9, 5]])
    with pytest.raises((ValueError, TypeError)) as info:
        lookahead.generate(models[0], ids, max_new_tokens=4, **kwargs)
    assert name in str(info.value)


def test_assistant_model_points_to_the_draft_method(models):
    with pytest.raises(ValueError, match="draft_model"):
        lookahead.generate(models[0], torch.tensor([[5, 9]]), max_new_tokens=4,
                           assistant_model=models[1])


def test_controls_give_each_tree_node_its_prefix():
    """Unit: a repetition penalty at node n sees the context and the tokens above n."""
    from lookahead.attention import TokenTree

    tree = TokenTree(3, [[4, 5], [6]])  # nodes x0=3, 4, 5, 6 (parents -1, 0, 1, 0)
    logits = torch.zeros(len(tree), 8, dtype=torch.float64)
    logits[:, :] = 1.0
    controls = Controls([RepetitionPenaltyLogitsProcessor(2.0)], prefix=[0])
    scores = controls.scores([1, 3], tree, logits)
    assert scores.dtype == torch.float32
    penalised = [set((row < 1.0).nonzero().flatten().tolist()) for row in scores]
    assert penalised == [{0, 1, 3}, {0, 1, 3, 4}, {0, 1, 3, 4, 5}, {0, 1, 3, 6}]
