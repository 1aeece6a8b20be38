"""``logprobs``, penalties and ``logit_bias``, and ``n`` choices through the official ``openai``
client, against references computed here: a plain forward pass's ``log_softmax``, greedy
decoding one token at a time with the penalties written out by hand, and single requests
with seed + i."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import prompt_ids, server_tokenizer, wait_idle

from lookahead.detokenize import Detokenizer
from lookahead.models.load import chat_prompt

MODEL = "tiny-llama"


def log_softmax_after(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: row i is the distribution tokens[i] was drawn from (one pass)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(dim=-1)


# ----------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("method", ["lookahead", "prompt_lookup", "autoregressive"])
def test_chat_logprobs_equal_a_plain_forward_pass(served, client, method) -> None:
    _, _, model, tokenizer = served
    messages = [{"role": "user", "content": "w3 w4 w5 w3 w4 w5 w3 w4"}]
    kwargs = {"model": MODEL, "messages": messages, "max_tokens": 20, "temperature": 0,
              "logprobs": True, "top_logprobs": 3,
              "extra_body": {"lookahead": {"method": method, "ignore_eos": True}}}
    reply = client.chat.completions.create(**kwargs)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 20
    tokens = [SERVER_ID[entry.token] for entry in content]
    prompt = chat_prompt(tokenizer, messages)[0].tolist()
    expected = log_softmax_after(model, prompt, tokens)
    for row, entry in zip(expected, content):
        token = SERVER_ID[entry.token]
        assert entry.bytes == list(entry.token.encode())
        assert math.isclose(entry.logprob, float(row[token]), abs_tol=1e-9)
        top = row.topk(3)
        assert [SERVER_ID[t.token] for t in entry.top_logprobs] == top.indices.tolist()
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(),
                                                                        abs=1e-9)
        assert entry.top_logprobs[0].token == entry.token  # greedy
    streamed = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    pieces = [e for c in streamed if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in pieces] == [(e.token, e.logprob) for e in content]


def test_completion_logprobs_and_text_offsets(served, client) -> None:
    ids = prompt_ids(5, 12)[0].tolist()
    kwargs = {"model": MODEL, "prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 2,
              "extra_body": {"lookahead": {"ignore_eos": True}}}
    reply = client.completions.create(**kwargs)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    tokens = [SERVER_ID[t] for t in logprobs.tokens]
    expected = log_softmax_after(served[2], ids, tokens)
    assert len(tokens) == 12
    assert logprobs.token_logprobs == pytest.approx(
        [float(row[t]) for row, t in zip(expected, tokens)], abs=1e-9)
    for text, top, offset in zip(logprobs.tokens, logprobs.top_logprobs, logprobs.text_offset):
        assert text in top and len(top) == 2  # greedy: the chosen token is among the top 2
        assert choice.text[offset:].lstrip().startswith(text)
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    streamed = client.completions.create(stream=True, **kwargs)
    offsets = [o for c in streamed if c.choices and c.choices[0].logprobs
               for o in c.choices[0].logprobs.text_offset]
    assert offsets == logprobs.text_offset


def test_no_logprobs_unless_asked(client) -> None:
    reply = client.chat.completions.create(model=MODEL, max_tokens=3, temperature=0,
                                           messages=[{"role": "user", "content": "w5"}])
    assert reply.choices[0].logprobs is None


# ----------------------------------------------------------------------------- penalties

SERVER_ID = {word: i for i, word in enumerate(server_tokenizer().convert_ids_to_tokens(
    list(range(96))))}

PENALTIES = {"presence_penalty": 0.8, "frequency_penalty": 0.5,
             "logit_bias": {"20": 2.0, "31": -100.0}}


def reference(model, prompt: list[int], new: int, presence: float, frequency: float,
              repetition: float, bias: dict[int, float]) -> list[int]:
    """Greedy one token at a time, the penalties from their definitions (in float32)."""
    ids = list(prompt)
    for _ in range(new):
        with torch.no_grad():
            scores = model(torch.tensor([ids])).logits[0, -1].float()
        for token, value in bias.items():
            scores[token] += value
        seen = torch.tensor(sorted(set(ids)))
        picked = scores[seen]
        scores[seen] = torch.where(picked < 0, picked * repetition, picked / repetition)
        counts = torch.bincount(torch.tensor(ids[len(prompt):], dtype=torch.long),
                                minlength=scores.shape[0]).float()
        scores = scores - presence * (counts > 0).float() - frequency * counts
        ids.append(int(scores.argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("repetition", [1.0, 1.4])
def test_penalties_give_one_token_at_a_time_greedy_text(served, client, repetition) -> None:
    _, engine, model, tokenizer = served
    ids = prompt_ids(8, 15)[0].tolist()
    bias = {int(k): v for k, v in PENALTIES["logit_bias"].items()}
    wanted = reference(model, ids, 24, PENALTIES["presence_penalty"],
                       PENALTIES["frequency_penalty"], repetition, bias)
    plain = reference(model, ids, 24, 0.0, 0.0, 1.0, {})
    assert wanted != plain
    for method in ("lookahead", "prompt_lookup", "autoregressive"):
        reply = client.completions.create(
            model=MODEL, prompt=ids, max_tokens=24, temperature=0, **PENALTIES,
            extra_body={"repetition_penalty": repetition,
                        "lookahead": {"method": method, "ignore_eos": True}})
        assert reply.choices[0].text == Detokenizer(tokenizer, ids).push(wanted, final=True), method
    assert wait_idle(engine)


# ----------------------------------------------------------------------------- n choices


def test_n_sampled_choices_are_the_requests_with_seed_plus_i(client) -> None:
    """Autoregressive: one draw per token, whatever the batch (a speculative method's draws
    follow its proposals, which depend on the step budget the batch leaves it)."""
    ids = prompt_ids(9, 10)[0].tolist()
    kwargs = {"model": MODEL, "prompt": ids, "max_tokens": 10, "temperature": 1.0,
              "extra_body": {"lookahead": {"method": "autoregressive"}}}
    reply = client.completions.create(n=3, seed=40, **kwargs)
    alone = [client.completions.create(seed=40 + i, **kwargs) for i in range(3)]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == [a.choices[0].text for a in alone]
    assert len({c.text for c in reply.choices}) > 1  # different seeds, different texts
    assert reply.usage.prompt_tokens == 10
    assert reply.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_n_greedy_choices_are_the_same_text_streamed_or_not(client) -> None:
    kwargs = {"model": MODEL, "messages": [{"role": "user", "content": "w7 w8 w7 w8"}],
              "max_tokens": 12, "temperature": 0, "n": 3}
    reply = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in reply.choices]
    assert len(texts) == 3 and len(set(texts)) == 1 and texts[0]
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True},
                                                 **kwargs))
    streamed = ["", "", ""]
    reasons = [None, None, None]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert streamed == texts
    assert reasons == [c.finish_reason for c in reply.choices]
    assert chunks[-1].usage == reply.usage
    assert reply.usage.completion_tokens == 3 * (reply.usage.completion_tokens // 3)
