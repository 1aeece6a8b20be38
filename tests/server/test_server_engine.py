"""The batched engine against ``lookahead.generate`` alone, on tiny float64 models: every
request of a batch writes what it writes alone, whatever the budget, arrivals, sampling seed,
draft model or attention."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from tiny import (
    SERVER_CONTEXT,
    SERVER_WORDS,
    collect_events,
    prompt_ids,
    server_llama,
    wait_idle,
)

import lookahead
from lookahead.request import make_decoder
from lookahead.server.engine import Engine, EngineConfig

CASES = [  # (method, options, prompt length, max_new_tokens)
    ("lookahead", {"window": 4, "ngram": 3, "guess": 4}, 12, 40),
    ("autoregressive", {}, 5, 30),
    ("prompt_lookup", {"num_draft_tokens": 6}, 30, 50),
    ("lookahead", {}, 20, 25),
    ("prompt_lookup", {}, 9, 45),
    ("autoregressive", {}, 40, 12),
]


@pytest.mark.parametrize("budget", [64, 8, 1])
def test_batched_greedy_equals_generate_alone(model, tokenizer, budget) -> None:
    engine = Engine(model, tokenizer, EngineConfig(step_token_budget=budget)).start()
    try:
        handles, expected = [], []
        for seed, (method, options, length, new) in enumerate(CASES):
            ids = prompt_ids(seed, length)
            alone = lookahead.generate(model, ids, new, method, **options)
            expected.append(alone.new_tokens[0].tolist())
            handles.append(engine.submit(make_decoder(model, ids, new, method, **options)))
        for handle, want in zip(handles, expected):
            _, finish = collect_events(handle)
            assert finish.token_ids == want
            assert finish.completion_tokens == len(want)
        assert wait_idle(engine)
    finally:
        engine.stop()


def test_a_request_capping_its_steps_is_capped_in_the_batch(model, tokenizer) -> None:
    """A request's own ``max_step_tokens`` holds under the engine's larger budget."""
    engine = Engine(model, tokenizer, EngineConfig(step_token_budget=64)).start()
    try:
        ids = prompt_ids(2, 30)
        want = lookahead.generate(model, ids, 50, "autoregressive").new_tokens[0].tolist()
        decoder = make_decoder(model, ids, 50, "prompt_lookup", max_step_tokens=2)
        _, finish = collect_events(engine.submit(decoder))
        assert finish.token_ids == want
        fed = decoder.stats.forward_tokens_per_step[1:]
        assert fed and max(fed) == 2, fed
        assert wait_idle(engine)
    finally:
        engine.stop()


def test_batched_greedy_with_grouped_attention_equals_stock_generate(model, tokenizer) -> None:
    """The server's model runs on ``grouped_sdpa`` (``load_model`` switches it): batched steps
    of several tokens each must still give what the stock model gives alone."""
    grouped = server_llama()
    assert lookahead.use_grouped_attention(grouped)
    engine = Engine(grouped, tokenizer, EngineConfig(step_token_budget=32)).start()
    try:
        pending = []
        for seed, (method, options, length, new) in enumerate(CASES):
            ids = prompt_ids(seed, length)
            want = lookahead.generate(model, ids, new, method, **options).new_tokens[0].tolist()
            pending.append((engine.submit(make_decoder(grouped, ids, new, method, **options)), want))
        for handle, want in pending:
            assert collect_events(handle)[1].token_ids == want
    finally:
        engine.stop()


def _check_against_generate(engine, model, cases, first_seed: int) -> None:
    """Submit each (method, options, prompt length, new tokens) case at once, then check that
    every output equals ``lookahead.generate`` alone."""
    pending = []
    for seed, (method, options, length, new) in enumerate(cases, start=first_seed):
        ids = prompt_ids(seed, length)
        want = lookahead.generate(model, ids, new, method, **options).new_tokens[0].tolist()
        pending.append((engine.submit(make_decoder(model, ids, new, method, **options)), want))
    for handle, want in pending:
        assert collect_events(handle)[1].token_ids == want


def test_warm_up_then_serve(model, tokenizer, monkeypatch, caplog) -> None:
    """The start-up warm-up runs every step size and prefill length once; a warm-up that fails
    is logged and the engine serves anyway."""
    from lookahead.server import engine as engine_module

    config = EngineConfig(step_token_budget=16, prefill_token_budget=40, warm_up=True)
    for broken in (False, True):
        if broken:
            monkeypatch.setattr(engine_module, "warm_up", lambda *args: 1 / 0)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lookahead.server"):
            engine = Engine(model, tokenizer, config).start()
            try:
                _check_against_generate(engine, model, CASES[:2], first_seed=30)
            finally:
                engine.stop()
        logged = caplog.text
        if broken:
            assert "warm-up failed" in logged
        else:  # prefill lengths up to 40 tokens: 8, 16, 24, 32, 40
            assert "kernels of 16 step sizes and 5 prefill lengths" in logged


def test_requests_arriving_mid_batch_and_compaction(model, tokenizer) -> None:
    """Late arrivals join a running batch; a small compaction threshold forces compactions."""
    config = EngineConfig(step_token_budget=32, compact_min_columns=8, max_batch_size=3)
    engine = Engine(model, tokenizer, config).start()
    try:
        _check_against_generate(engine, model, [CASES[i % len(CASES)] for i in range(5)], 100)
    finally:
        engine.stop()


def test_sampling_with_a_seed_is_reproducible_in_a_batch(model, tokenizer) -> None:
    """A seed fixes the output. (With speculation the draws depend on the proposals, which
    depend on the budget share, so only plain decoding is compared with ``generate``.)"""
    engine = Engine(model, tokenizer).start()
    try:
        ids = prompt_ids(7, 10)
        # top_k=0: lookahead.generate would otherwise cut at model.generate's default of 50.
        opts = {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "top_k": 0, "seed": 123}
        alone = lookahead.generate(model, ids, 30, "autoregressive", **opts).new_tokens[0].tolist()
        plain = [engine.submit(make_decoder(model, ids, 30, "autoregressive", **opts))
                 for _ in range(2)]
        spec = [engine.submit(make_decoder(model, ids, 30, "lookahead", **opts)) for _ in range(2)]
        for handle in plain:
            assert collect_events(handle)[1].token_ids == alone
        assert collect_events(spec[0])[1].token_ids == collect_events(spec[1])[1].token_ids
    finally:
        engine.stop()


def test_threads_submitting_at_once(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    results = {}

    def client(i):
        ids = prompt_ids(200 + i, 6 + i)
        handle = engine.submit(make_decoder(model, ids, 15, "lookahead"))
        results[i] = collect_events(handle)[1].token_ids

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        engine.stop()
    for i in range(6):
        ids = prompt_ids(200 + i, 6 + i)
        assert results[i] == lookahead.generate(model, ids, 15, "lookahead").new_tokens[0].tolist()


def test_draft_model_requests_in_a_batch(model, tokenizer) -> None:
    draft = server_llama(seed=1)
    engine = Engine(model, tokenizer, EngineConfig(step_token_budget=12)).start()
    try:
        cases = [("draft", {"draft_model": draft, "num_draft_tokens": 4}, 9, 30),
                 ("draft", {"draft_model": draft}, 14, 20),
                 ("lookahead", {}, 11, 25)]
        _check_against_generate(engine, model, cases, 300)
    finally:
        engine.stop()


def test_sliding_window_model_in_a_batch(tokenizer) -> None:
    """A window shorter than the text: the batched mask must apply it by position."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=len(SERVER_WORDS), hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=SERVER_CONTEXT, sliding_window=12,
                           bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = MistralForCausalLM(config).to(torch.float64).eval()
    engine = Engine(model, tokenizer, EngineConfig(step_token_budget=24)).start()
    try:
        pending = []
        for seed, (method, length, new) in enumerate(
            [("lookahead", 20, 30), ("autoregressive", 7, 35), ("prompt_lookup", 15, 30)]
        ):
            ids = prompt_ids(400 + seed, length)
            want = lookahead.generate(model, ids, new, method).new_tokens[0].tolist()
            pending.append((engine.submit(make_decoder(model, ids, new, method)), want))
        for handle, want in pending:
            assert collect_events(handle)[1].token_ids == want
    finally:
        engine.stop()


def test_a_longrope_model_is_served_up_to_its_original_context(model, tokenizer) -> None:
    """Past its original context a longrope model rotates with other factors, chosen by the
    batch's largest position: the engine serves texts up to that switch, not beyond."""
    from transformers import Phi3Config, Phi3ForCausalLM

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
            "long_factor": [4.0] * 4, "original_max_position_embeddings": 32}
    config = Phi3Config(vocab_size=len(SERVER_WORDS), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                        max_position_embeddings=128, original_max_position_embeddings=32,
                        rope_parameters=rope, pad_token_id=0)
    assert Engine(Phi3ForCausalLM(config), tokenizer).context_length == 32
    assert Engine(model, tokenizer).context_length == model.config.max_position_embeddings
