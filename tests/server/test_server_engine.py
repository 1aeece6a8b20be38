"""The batched engine against ``lookahead.generate`` alone, on tiny float64 models.

Also holds the tiny model, tokenizer and prompts that ``test_server.py`` serves.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from tiny import CHAT_TEMPLATE, tiny_llama, word_tokenizer

import lookahead
from lookahead.api import make_decoder
from lookahead.batch_cache import BatchedCache
from lookahead.server.budget import BudgetPolicy
from lookahead.detokenize import Detokenizer
from lookahead.server.engine import (
    Engine,
    EngineClosedError,
    EngineConfig,
    ErrorEvent,
    FinishEvent,
    QueueFullError,
    TokenEvent,
)

SPECIAL = ["<unk>", "<s>", "</s>", "user", "assistant", "system", ":"]
WORDS = SPECIAL + [f"w{i}" for i in range(89)]  # 96 tokens
CONTEXT = 512


def server_tokenizer():
    """Word-level over WORDS with the tests' chat template; decoding joins words with spaces."""
    return word_tokenizer(WORDS, CHAT_TEMPLATE)


def server_llama(seed: int = 0):
    """A tiny random Llama over WORDS in float64 (ties in argmax are then out of the way)."""
    return tiny_llama(len(WORDS), max_positions=CONTEXT, seed=seed).to(torch.float64)


def prompt_ids(seed: int, length: int) -> torch.Tensor:
    """A prompt with repeats (so that lookup methods find something to propose)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(len(SPECIAL), len(WORDS), (max(2, length // 3),), generator=g)
    return base.repeat(4)[:length].unsqueeze(0)


@pytest.fixture(scope="module")
def model():
    return server_llama()


@pytest.fixture(scope="module")
def tokenizer():
    return server_tokenizer()


def wait_idle(engine, timeout: float = 10.0) -> bool:
    """Whether the engine has no request left within ``timeout`` (events come before cleanup)."""
    deadline = time.monotonic() + timeout
    while engine.active_count and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.active_count == 0


def _collect(handle, timeout=60):
    text, finish = "", None
    for event in handle.events(timeout=timeout):
        if isinstance(event, TokenEvent):
            text += event.text
        elif isinstance(event, ErrorEvent):
            pytest.fail(event.message)
        else:
            finish = event
    return text, finish


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
            _, finish = _collect(handle)
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
        _, finish = _collect(engine.submit(decoder))
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
            assert _collect(handle)[1].token_ids == want
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
        assert _collect(handle)[1].token_ids == want


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
            assert _collect(handle)[1].token_ids == alone
        assert _collect(spec[0])[1].token_ids == _collect(spec[1])[1].token_ids
    finally:
        engine.stop()


def test_cancel_frees_the_row(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    try:
        long = engine.submit(make_decoder(model, prompt_ids(1, 10), 140, "autoregressive",
                                          eos_token_id=[]))
        short = engine.submit(make_decoder(model, prompt_ids(2, 10), 5, "autoregressive"))
        next(long.events(timeout=30))  # it is running
        long.cancel()
        _collect(short)
        events = list(long.events(timeout=30))
        assert isinstance(events[-1], FinishEvent) and events[-1].reason == "cancelled"
        assert events[-1].completion_tokens < 140
        assert wait_idle(engine)
        assert engine._cache.cache is None  # memory freed
    finally:
        engine.stop()


def test_queue_limit(model, tokenizer) -> None:
    engine = Engine(model, tokenizer, EngineConfig(max_queue=2))  # not started: nothing drains
    ids = prompt_ids(0, 4)
    engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    with pytest.raises(QueueFullError, match="max_queue=2"):
        engine.submit(make_decoder(model, ids, 4, "autoregressive"))
    assert engine.metrics.requests.value("rejected", "queue_full") == 1


def test_a_failing_request_does_not_stop_the_others(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    try:
        bad = make_decoder(model, prompt_ids(3, 8), 20, "autoregressive")
        bad.plan = lambda past, budget=None: (_ for _ in ()).throw(RuntimeError("boom"))
        good_ids = prompt_ids(4, 8)
        want = lookahead.generate(model, good_ids, 20, "lookahead").new_tokens[0].tolist()
        h_bad = engine.submit(bad)
        h_good = engine.submit(make_decoder(model, good_ids, 20, "lookahead"))
        assert isinstance(list(h_bad.events(timeout=30))[-1], ErrorEvent)
        assert _collect(h_good)[1].token_ids == want
        assert engine.alive
    finally:
        engine.stop()


def test_run_serves_in_the_calling_thread_until_stopped(model, tokenizer) -> None:
    """``lookahead serve`` runs the loop on the thread that loaded the model (Engine.run) and
    submits from the HTTP thread."""
    engine = Engine(model, tokenizer)
    ids = prompt_ids(5, 10)
    want = lookahead.generate(model, ids, 16, "lookahead").new_tokens[0].tolist()
    got = {}

    def client() -> None:
        handle = engine.submit(make_decoder(model, ids, 16, "lookahead"))
        got["tokens"] = _collect(handle)[1].token_ids
        # Read once the answer is in: before, run() on the main thread may not have begun.
        got["alive"] = engine.alive
        engine.stop()

    thread = threading.Thread(target=client)
    thread.start()
    engine.run()  # returns once the client has stopped it
    thread.join(10)
    assert got == {"alive": True, "tokens": want}
    assert not engine.alive
    with pytest.raises(EngineClosedError):
        engine.submit(make_decoder(model, ids, 4, "autoregressive"))


def test_stop_string_cuts_the_text(model, tokenizer) -> None:
    ids = prompt_ids(5, 12)
    engine = Engine(model, tokenizer).start()
    try:
        full, _ = _collect(engine.submit(make_decoder(model, ids, 30, "autoregressive")))
        stop = " ".join(full.split()[3:5])
        handle = engine.submit(make_decoder(model, ids, 30, "autoregressive"), stop=[stop, "zz"])
        text, finish = _collect(handle)
    finally:
        engine.stop()
    assert finish.reason == "stop"
    assert text == full[: full.index(stop)]


# ----------------------------------------------------------------------------- pure parts


class _CharTokenizer:
    """Token i decodes to chr(i); 0xFF stands for half a character (shown as U+FFFD)."""

    def decode(self, tokens, skip_special_tokens=True):
        return "".join("\ufffd" if t == 0xFF else chr(t) for t in tokens)


def _push_all(stop, pieces):
    detok = Detokenizer(_CharTokenizer(), [ord("p")], stop)
    sent = [detok.push([ord(c) if c != "?" else 0xFF for c in piece]) for piece in pieces]
    return sent, detok


def test_detokenizer_holds_back_a_possible_stop_string() -> None:
    sent, detok = _push_all(["\n\n"], ["a\n", "b", "\n\nc"])
    assert sent == ["a", "\nb", ""]
    assert detok.stopped and detok.text == "a\nb"


def test_detokenizer_flushes_when_final_and_holds_incomplete_characters() -> None:
    sent, detok = _push_all(["xyz"], ["ab?", "xy"])
    assert sent == ["ab", "\ufffd"]  # held while it ended the text, sent once followed
    assert detok.push([], final=True) == "xy"


def test_compact_keeps_each_rows_entries() -> None:
    from transformers import DynamicCache

    cache = BatchedCache()
    for length in (3, 5):
        single = DynamicCache()
        keys = torch.arange(length, dtype=torch.float32).view(1, 1, length, 1) + 10 * length
        single.update(keys, keys.clone(), 0)
        cache.add_row(single)
    assert cache.valid.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    # A step of 3 columns; row 0 keeps its third entry, row 1 nothing (as if it failed).
    step = torch.tensor([[[[-1.0], [-2.0], [-3.0]]], [[[-4.0], [-5.0], [-6.0]]]])
    cache.cache.update(step, step.clone(), 0)
    cache.extend(torch.tensor([[3, 4, 5], [5, 6, 7]]))
    cache.keep(3, [[2], []])
    assert cache.columns == 6  # the step's columns no row kept are cut at once
    assert cache.cache.layers[0].keys[0, 0, 5, 0] == -3 and cache.positions[0, 5] == 5
    assert cache.valid.tolist() == [[True] * 3 + [False] * 2 + [True], [True] * 5 + [False]]
    cache.compact()
    assert cache.columns == 5
    assert cache.cache.layers[0].keys[0, 0, :4, 0].tolist() == [30, 31, 32, -3]
    assert cache.positions[0, :4].tolist() == [0, 1, 2, 5]
    assert cache.valid.tolist() == [[True] * 4 + [False], [True] * 5]
    cache.remove_rows([1])
    assert cache.columns == 4 and cache.rows == 1


def test_keep_packs_each_rows_entries_and_cuts_what_no_row_kept() -> None:
    from transformers import DynamicCache

    cache = BatchedCache()
    single = DynamicCache()
    prompt = torch.zeros(1, 1, 2, 1)
    single.update(prompt, prompt.clone(), 0)
    cache.add_row(single)
    cache.add_row(single)
    # One step of 4 columns per row, values = 10 * row + column.
    step = (torch.arange(4.0) + torch.tensor([[0.0], [10.0]])).view(2, 1, 4, 1)
    cache.cache.update(step, step + 100, 0)
    cache.extend(torch.tensor([[2, 3, 3, 4], [2, 3, 4, 5]]))
    cache.keep(4, [[0, 2, 3], [0, 1]])
    layer = cache.cache.layers[0]
    assert cache.columns == 5  # 2 prompt + the 3 the longest row kept
    assert layer.keys[0, 0, 2:, 0].tolist() == [0, 2, 3]
    assert layer.keys[1, 0, 2:4, 0].tolist() == [10, 11]  # and one column of waste
    assert layer.values[0, 0, 2:, 0].tolist() == [100, 102, 103]
    assert cache.positions[0, 2:].tolist() == [2, 3, 4]
    assert cache.positions[1, 2:4].tolist() == [2, 3]
    assert cache.valid[:, 2:].tolist() == [[True, True, True], [True, True, False]]
    cache.keep(0, [[], []])  # nothing was fed: nothing changes
    assert cache.columns == 5


def test_threads_submitting_at_once(model, tokenizer) -> None:
    engine = Engine(model, tokenizer).start()
    results = {}

    def client(i):
        ids = prompt_ids(200 + i, 6 + i)
        handle = engine.submit(make_decoder(model, ids, 15, "lookahead"))
        results[i] = _collect(handle)[1].token_ids

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


def test_budget_ceiling_is_the_fixed_rule() -> None:
    policy = BudgetPolicy(64, adaptive=False)
    assert [policy.choose(["lookahead"] * n) for n in (1, 2, 8, 100)] == [64, 32, 8, 1]
    assert BudgetPolicy(64).levels(5) == [1, 2, 4, 8, 12]


def test_budget_policy_settles_on_the_share_that_pays_best() -> None:
    """8 requests; a step costs 50 ms + 1 ms per token; a share of k tokens commits gain[k]
    tokens per request: 8 * gain / cost is best at k = 4 (8 * 2.0 / 0.082 = 195 tokens/s)."""
    policy = BudgetPolicy(64, explore=0.1, seed=1)
    gain = {1: 1.0, 2: 1.5, 4: 2.0, 8: 2.3}
    batch = ["lookahead"] * 8
    chosen = []
    for _ in range(300):
        share = policy.choose(batch)
        chosen.append(share)
        policy.observe(batch, share, [gain[share]] * 8, forward_tokens=8 * share,
                       seconds=0.05 + 0.001 * 8 * share)
    assert chosen[0] == 8  # it starts from the ceiling (the fixed rule) ...
    assert chosen[-100:].count(4) >= 80  # ... and settles on the best share
    assert policy.table()["gain lookahead@4"] == 2.0
    # Four requests (shares up to 16): 4 is best again (4 * 2.0 / 0.066 s beats
    # 4 * 2.3 / 0.082 s at 8), its neighbours and plain decoding explored. Alone, a request
    # gets the whole budget.
    assert {policy.choose(["lookahead"] * 4) for _ in range(100)} == {1, 2, 4, 8}
    assert policy.choose(["lookahead"]) == 64
    # Plain decoding gains nothing from a share: a batch of it takes one token each.
    assert sum(policy.choose(["autoregressive"] * 8) == 1 for _ in range(100)) >= 85


def test_budget_policy_falls_back_to_plain_decoding_when_speculation_measures_slower() -> None:
    """The cost line is fitted on 1 to 8 requests, where a step costs 50 ms + 1 ms per token,
    so it predicts that 16 requests gain from a share of 2. But 16 requests pay 4 ms each for
    their proposals, which the line cannot see: measured, one token each is faster, and the
    policy must settle there."""
    policy = BudgetPolicy(64, explore=0.1, seed=3)
    gain = {1: 1.0, 2: 1.6, 4: 2.0, 8: 2.2, 16: 2.3, 32: 2.4, 64: 2.5}
    for _ in range(200):
        for running in (1, 2, 4, 8):
            batch = ["lookahead"] * running
            share = policy.choose(batch)
            policy.observe(batch, share, [gain[share]] * running, forward_tokens=running * share,
                           seconds=0.05 + 0.001 * running * share)
    batch = ["lookahead"] * 16
    assert policy.predicted_rate(batch, 2) > 1.2 * policy.predicted_rate(batch, 1)  # the line
    chosen = []
    for _ in range(300):
        share = policy.choose(batch)
        chosen.append(share)
        seconds = 0.05 + 0.001 * 16 * share + (0.004 * 16 if share > 1 else 0.0)
        policy.observe(batch, share, [gain[share]] * 16, forward_tokens=16 * share,
                       seconds=seconds)
    assert chosen[-100:].count(1) >= 80
    # Settled: its neighbour (2) is measured too, so it explores a quarter as often -- each
    # try costs time here -- but still does: 1000 steps at explore=0.1 would try 2 about 33
    # times, a quarter as often about 8.
    tries = sum(policy.choose(batch) != 1 for _ in range(1000))
    assert 1 <= tries <= 20


def test_budget_policy_needs_a_clear_predicted_lead_to_speculate_in_a_new_batch() -> None:
    """Small batches teach the line (50 ms + 1 ms per token) and the gains. For 16 requests it
    then predicts a share of 2 (1.34 tokens each in 82 ms) 8 % faster than one token each
    (16 ms less) -- within the line's error for many requests, so the new batch starts with
    one token each; a share predicted 20 % faster is taken at once."""
    for gain_2, first in ((1.34, 1), (1.49, 2)):
        policy = BudgetPolicy(64, explore=0.1, seed=3)
        gain = {1: 1.0, 2: gain_2, 4: 1.6, 8: 1.8, 16: 1.9, 32: 2.0, 64: 2.1}
        for _ in range(100):
            for running in (1, 2, 4, 8):
                batch = ["lookahead"] * running
                share = policy.choose(batch)
                policy.observe(batch, share, [gain[share]] * running,
                               forward_tokens=running * share,
                               seconds=0.05 + 0.001 * running * share)
        batch = ["lookahead"] * 16
        lead = policy.predicted_rate(batch, 2) / policy.predicted_rate(batch, 1)
        assert lead == pytest.approx(gain_2 * 66 / 82, rel=0.02)
        policy.explore = 0.0
        assert policy.choose(batch) == first


def test_budget_policy_speculates_where_it_measures_faster_than_predicted() -> None:
    """The reverse case. Small batches (1 to 8 requests) pay 50 ms + 3 ms per token, and
    keep the cost line steep: it predicts that 16 requests do best with one token each. But a
    step of 16 requests costs 100 ms + 0.5 ms per token (its fixed work dominates): measured,
    a share of 4 commits 16 * 1.6 tokens in 132 ms against 16 in 108 ms, so the policy must
    find it by exploring and settle there, while the small batches go on."""
    policy = BudgetPolicy(64, explore=0.1, seed=5)
    gain = {1: 1.0, 2: 1.3, 4: 1.6, 8: 1.8, 16: 1.9, 32: 2.0, 64: 2.1}

    def step(running: int) -> int:
        batch = ["lookahead"] * running
        share = policy.choose(batch)
        tokens = running * share
        seconds = 0.1 + 0.0005 * tokens if running == 16 else 0.05 + 0.003 * tokens
        policy.observe(batch, share, [gain[share]] * running, forward_tokens=tokens,
                       seconds=seconds)
        return share

    chosen = []
    for _ in range(400):
        for running in (1, 2, 4, 8):
            step(running)
        chosen.append(step(16))
    batch = ["lookahead"] * 16
    assert policy.predicted_rate(batch, 1) > 1.2 * policy.predicted_rate(batch, 4)  # the line
    assert chosen[-100:].count(4) >= 80


def test_sliding_window_model_in_a_batch(tokenizer) -> None:
    """A window shorter than the text: the batched mask must apply it by position."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=CONTEXT, sliding_window=12,
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
            assert _collect(handle)[1].token_ids == want
    finally:
        engine.stop()


def test_a_longrope_model_is_served_up_to_its_original_context(model, tokenizer) -> None:
    """Past its original context a longrope model rotates with other factors, chosen by the
    batch's largest position: the engine serves texts up to that switch, not beyond."""
    from transformers import Phi3Config, Phi3ForCausalLM

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
            "long_factor": [4.0] * 4, "original_max_position_embeddings": 32}
    config = Phi3Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                        max_position_embeddings=128, original_max_position_embeddings=32,
                        rope_parameters=rope, pad_token_id=0)
    assert Engine(Phi3ForCausalLM(config), tokenizer).context_length == 32
    assert Engine(model, tokenizer).context_length == model.config.max_position_embeddings


def test_sigterm_caught_by_another_thread_still_stops_an_idle_engine(model, tokenizer) -> None:
    """``lookahead serve`` stops on SIGTERM by raising KeyboardInterrupt in the main thread,
    which runs the engine. The kernel may hand a process's SIGTERM to any thread; Python runs
    the handler in the main thread only when it next runs bytecode. So an idle engine must
    not block in its wait for good, or the server stays up (a CI run hung this way)."""
    import signal

    from lookahead.cli.serve import _interrupt_on_sigterm

    engine = Engine(model, tokenizer, EngineConfig(warm_up=False))

    def other_thread() -> None:
        time.sleep(0.3)  # the engine is waiting for work by now
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not main
        time.sleep(5)
        engine.stop()  # the watchdog: without a bounded wait, run() returns only now

    threading.Thread(target=other_thread, daemon=True).start()
    started = time.monotonic()
    with _interrupt_on_sigterm(), pytest.raises(KeyboardInterrupt):
        engine.run()
    assert time.monotonic() - started < 3
