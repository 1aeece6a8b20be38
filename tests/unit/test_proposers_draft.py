"""The draft proposer."""

from __future__ import annotations

import pytest
import torch

from lookahead.config import DraftConfig, SamplingConfig
from lookahead.proposers.base import StepOutcome
from lookahead.proposers.draft import DraftProposer
from lookahead.proposers import shortlist
from lookahead.proposers.shortlist import ShortlistHead, shortlist_head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_greedy_draft_with_lookup_drafts_the_same_tokens_in_fewer_passes(tiny_lm):
    """Prompt lookup inside the draft model changes how many draft passes run, not the draft:
    over several steps (the target taking part of each draft, then its own token) the drafts
    equal those of plain one-token-per-pass drafting, so the draft cache stays right too."""
    draft = tiny_lm("llama", seed=1)
    context = [3, 1, 4, 1, 5, 9, 2, 6] * 3
    plain, fast = (
        DraftProposer(draft, DraftConfig(num_draft_tokens=12, lookup_tokens=tokens),
                      SamplingConfig(), None)
        for tokens in (0, 8)
    )
    for proposer in (plain, fast):
        proposer.start(context)
    for accepted in (6, 0, 12, 3):
        drafts = [p.propose(context, 12).candidates[0] for p in (plain, fast)]
        assert drafts[0] == drafts[1] and len(drafts[0]) == 12
        committed = drafts[0][:accepted] + ([7] if accepted < 12 else [])
        context = context + committed
        for proposer in (plain, fast):
            proposer.update(context, StepOutcome(committed, accepted))
    assert plain.forwards == 4 * 12
    assert fast.forwards < plain.forwards



def _greedy_over(model, context: list[int], length: int, allowed: set[int]) -> list[int]:
    """The model's greedy continuation when only the ``allowed`` ids may be chosen."""
    ids = list(context)
    mask = torch.full((model.config.vocab_size,), float("-inf"))
    mask[sorted(allowed)] = 0
    with torch.inference_mode():
        for _ in range(length):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int((logits + mask).argmax()))
    return ids[len(context):]


@pytest.mark.parametrize("lookup_tokens", [0, 8])
def test_a_shortlisted_draft_drafts_over_the_first_ids_and_those_of_the_text(tiny_lm,
                                                                            lookup_tokens):
    draft = tiny_lm("llama", seed=1)
    context = [3, 1, 4, 41, 5, 9, 2, 6, 50] * 3
    config = DraftConfig(num_draft_tokens=6, lookup_tokens=lookup_tokens, draft_vocab=20)
    proposer = DraftProposer(draft, config, SamplingConfig(), None)
    assert proposer.head is not None
    proposer.start(context)
    for accepted, extra in ((2, 60), (6, 7), (0, 33)):
        drafted = proposer.propose(context, 6).candidates[0]
        assert drafted == _greedy_over(draft, context, 6, set(range(20)) | set(context))
        committed = drafted[:accepted] + ([extra] if accepted < 6 else [])
        context = context + committed
        proposer.update(context, StepOutcome(committed, accepted))
    # over the whole vocabulary the draft writes other ids: the shortlist changed the drafts
    whole = DraftProposer(draft, DraftConfig(num_draft_tokens=24, draft_vocab=0),
                          SamplingConfig(), None)
    assert whole.head is None
    whole.start(context)
    assert not set(whole.propose(context, 24).candidates[0]) <= set(range(20)) | set(context)


def test_a_shortlisted_draft_samples_from_a_distribution_over_the_whole_vocabulary(tiny_lm):
    draft = tiny_lm("llama", seed=1)
    proposer = DraftProposer(draft, DraftConfig(num_draft_tokens=3, draft_vocab=20),
                             SamplingConfig(do_sample=True, seed=0),
                             torch.Generator().manual_seed(0))
    proposer.start([3, 1, 44])
    proposal = proposer.propose([3, 1, 44], 3)
    probs = proposal.draft_probs[0]
    listed = list(range(20)) + [44]
    assert probs.shape == (3, draft.config.vocab_size)
    assert torch.allclose(probs[:, listed].sum(-1), torch.ones(3, dtype=probs.dtype))
    assert all(token in listed for token in proposal.candidates[0])


def test_the_head_is_cut_only_where_that_is_a_plain_output_layer(tiny_lm, fresh_lm,
                                                                  monkeypatch):
    draft = tiny_lm("llama", seed=1)
    vocab = draft.config.vocab_size
    assert shortlist_head(draft, 0) is None and shortlist_head(draft, vocab) is None
    # None: the CPU's list, here longer than the vocabulary, so no list at all
    assert shortlist_head(draft, None) is None
    monkeypatch.setattr(shortlist, "CPU_SIZE", 20)
    assert shortlist_head(draft, None).size == 20
    head = shortlist_head(draft, 20)
    head.add([30, 2, 30])
    hidden = torch.randn(2, draft.config.hidden_size, dtype=draft.dtype)
    logits, full = head(hidden), draft.get_output_embeddings()(hidden)
    listed = list(range(20)) + [30]
    # (a product over fewer rows may round in another order: the draft's choice, not the text)
    assert torch.allclose(logits[:, listed], full[:, listed], rtol=1e-12, atol=1e-12)
    assert torch.all(logits[:, 20:30] == float("-inf"))
    assert torch.all(logits[:, 31:] == float("-inf"))
    capped = fresh_lm("llama", seed=1)
    capped.config.final_logit_softcapping = 30.0
    assert shortlist_head(capped, 20) is None
    ending = fresh_lm("llama", seed=1)
    ending.config.eos_token_id = [50, 51]
    head = shortlist_head(ending, 20)
    head.add([30])
    head.reset()  # a new text: the end-of-text ids stay listed, the text's go
    logits = head(hidden)
    assert torch.isfinite(logits[:, [50, 51]]).all() and torch.isinf(logits[:, 30]).all()
    with pytest.raises(ValueError, match="draft_vocab must be in"):
        DraftConfig(draft_vocab=-1)


def test_a_quantized_head_lists_ids_in_groups_of_16():
    """On a QuantLinear the first ids share its records and an added id brings its group."""
    import gguf
    import numpy as np
    from lookahead.kernels.quant_linear import QuantLinear

    qtype = gguf.GGMLQuantizationType.Q8_0
    weights = np.random.default_rng(0).standard_normal((72, 256)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(weights, qtype))
    layer = QuantLinear(raw, qtype, 256, bias=torch.randn(72))
    head = ShortlistHead(layer, 16)
    assert head.first.records.data_ptr() == layer.records.data_ptr()
    head.add([40, 70])  # groups 2 (32..47) and 4 (64..79, of which 72..79 are padding)
    x = torch.randn(3, 256)
    logits, full = head(x), layer(x)
    listed = list(range(16)) + list(range(32, 48)) + list(range(64, 72))
    assert torch.equal(logits[:, listed], full[:, listed])
    assert torch.all(logits[:, 16:32] == float("-inf"))
    assert torch.all(logits[:, 48:64] == float("-inf"))
    head.reset()
    assert torch.all(head(x)[:, 16:] == float("-inf"))
