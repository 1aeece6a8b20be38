"""Shared fixtures: tiny random-weight causal LMs built from configs (no download), in float64.

``tiny_lm(family, seed=..., attn=..., **config_overrides)`` builds (and caches for the session)
a 2-layer model of one of the families in ``FAMILIES``. Its special-token ids are all None and
its generation config has no EOS, so a test sets ``model.generation_config.eos_token_id``
itself when it wants one.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import lookahead

# family -> (model class name, config class name, config fields that family needs)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 8}),
    "gemma3": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        {"head_dim": 8, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {}),
}


def build_tiny_lm(family: str, seed: int = 0, attn: str = "sdpa", **overrides):
    """A fresh tiny model of ``family`` with weights drawn from ``torch.manual_seed(seed)``.
    ``attn="grouped"``: built on "sdpa", then switched to ``lookahead.use_grouped_attention``
    (the same weights as the "sdpa" model of that seed)."""
    model_name, config_name, extra = FAMILIES[family]
    fields = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": False,
    }
    fields.update(extra)
    fields.update(overrides)
    config = getattr(transformers, config_name)(**fields)
    config._attn_implementation = "sdpa" if attn == "grouped" else attn
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(torch.float64).eval()
    if attn == "grouped":
        assert lookahead.use_grouped_attention(model)
    generation = model.generation_config
    generation.eos_token_id = None
    generation.pad_token_id = None
    generation.bos_token_id = None
    generation.do_sample = False
    return model


@pytest.fixture(scope="session")
def tiny_lm():
    """Factory fixture: ``tiny_lm(family, seed=0, attn="sdpa", **overrides)``, cached per session.

    Tests that change ``generation_config`` must restore it (or build with ``build_tiny_lm``).
    """
    cache = {}

    def make(family: str, seed: int = 0, attn: str = "sdpa", **overrides):
        key = (family, seed, attn, tuple(sorted(overrides.items(), key=lambda kv: kv[0])))
        key = repr(key)
        if key not in cache:
            cache[key] = build_tiny_lm(family, seed, attn, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def fresh_lm():
    """Factory fixture: ``build_tiny_lm`` uncached, for tests that change the model."""
    return build_tiny_lm


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest (and disturb neighbours least) on one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Step costs of a tiny model's passes of 1, 2, 3, 4, 6, 8, 12 and 16 tokens, relative to one
# (``steady_step_costs``): flat at first, as a memory-bound model's are.
STEADY_CURVE = (1.0, 1.02, 1.04, 1.06, 1.1, 1.15, 1.25, 1.35)


@pytest.fixture(autouse=True)
def steady_step_costs(request, monkeypatch):
    """Lookahead called without a shape prices its steps on this CPU's measured step costs
    (``lookahead.step_costs``), and each request then on its own timed passes
    (``StepClock.record``). A tiny model's pass takes about a millisecond, and on a busy
    machine such timings say anything: priced on them, the same call fed x0 alone in one run
    and several tokens in the next, and tests that need multi-token steps failed at random.
    So tests price on ``STEADY_CURVE``, measured by no clock and moved by no pass; a test of
    the timing itself asks for the real one with ``@pytest.mark.timed_step_costs``."""
    if request.node.get_closest_marker("timed_step_costs"):
        yield
        return
    from lookahead import step_costs
    from lookahead.proposers import gauges
    from lookahead.proposers.step_clock import StepClock

    def steady_curve(model, tokens=step_costs.MEASURED_TOKENS,
                     prompt_tokens=step_costs.MEASURED_PROMPT_TOKENS):
        sizes = list(tokens)
        costs = dict(zip(step_costs.MEASURED_TOKENS, STEADY_CURVE))
        return dict(tokens=sizes, seconds=[costs.get(k, STEADY_CURVE[-1]) for k in sizes],
                    prompt_tokens=prompt_tokens)

    class UntimedClock(StepClock):
        def record(self, tokens: int, seconds: float) -> None:
            """Passes do not move the costs (the fixture's note)."""

    monkeypatch.setattr(step_costs, "measure_curve", steady_curve)
    monkeypatch.setattr(gauges, "StepClock", UntimedClock)
    yield


@pytest.fixture(scope="session", autouse=True)
def private_profiles(tmp_path_factory):
    """Tuned profiles and measured step costs go to a folder of the session's own, not the
    user's cache: a profile or curve left there would change what a test measures, and the
    curves of the tests' temporary models would pile up there. A test that points the user
    cache elsewhere itself (``HOME``, ``XDG_CACHE_HOME``) keeps its own folder; the models
    installed in the user cache are still found (only ``lookahead.profiles`` is pointed).
    Commands run in a subprocess get a cache folder of their own where they are run
    (``tests/cli/test_chat.py``)."""
    from lookahead import profiles
    from lookahead.models import registry

    user = registry.default_cache_dir()
    own = tmp_path_factory.mktemp("user-cache")

    def cache_root():
        root = registry.default_cache_dir()
        return own if root == user else root

    patch = pytest.MonkeyPatch()
    patch.setattr(profiles, "default_cache_dir", cache_root)
    yield own
    patch.undo()
