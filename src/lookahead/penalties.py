"""The OpenAI API's penalties and ``logit_bias`` (and vLLM's ``repetition_penalty``) as Hugging
Face logits processors, which ``lookahead.controls.Controls`` applies at every verified
position of a speculative step exactly as one-token-at-a-time decoding would.

* ``logit_bias`` {token id: bias in [-100, 100]}: added to that token's logit (transformers'
  ``SequenceBiasLogitsProcessor`` with one-token sequences).
* ``repetition_penalty`` r > 0 (vLLM's extension, as in ``model.generate``): the logit of
  every token in the prompt or the output so far is divided by r where positive, multiplied
  by r where negative (transformers' ``RepetitionPenaltyLogitsProcessor``).
* ``presence_penalty`` p and ``frequency_penalty`` f in [-2, 2] (OpenAI's): with c the number
  of times a token occurs in the *output so far* (the prompt is not counted, as in OpenAI's
  and vLLM's definition), its logit becomes ``logit - p * (c > 0) - f * c``
  (``PresenceFrequencyPenalty``).

They apply in that order (bias, repetition, presence/frequency), the order of vLLM's sampler,
before temperature, top-k and top-p.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers.generation import logits_process as lp

MAX_PENALTY = 2.0  # OpenAI's range for presence_penalty and frequency_penalty: [-2, 2]
MAX_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


class PresenceFrequencyPenalty(lp.LogitsProcessor):
    """OpenAI's presence and frequency penalties over the tokens after ``prompt_length``.

    Row-wise and stateless: each row of ``input_ids`` [B, L] penalizes its own row of
    ``scores`` [B, V], so the rows of a candidate tree can go through it in one call.
    """

    def __init__(self, presence: float, frequency: float, prompt_length: int) -> None:
        for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
            _check_number(name, value, -MAX_PENALTY, MAX_PENALTY)
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length must be an int >= 0, got {prompt_length!r}")
        self.presence, self.frequency = float(presence), float(frequency)
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        output = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores)
        # Ids past the scores' width (an embedding larger than the head) cannot be chosen.
        output = output.clamp(max=scores.shape[-1])
        counts = torch.nn.functional.pad(counts, (0, 1))
        counts.scatter_add_(1, output, torch.ones_like(output, dtype=counts.dtype))
        counts = counts[:, :-1]
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


def penalty_processors(prompt_length: int, *, presence_penalty: float = 0.0,
                       frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                       logit_bias: Mapping[int, float] | None = None,
                       vocab_size: int | None = None) -> lp.LogitsProcessorList:
    """The processors for these settings (empty where all are at their defaults).

    prompt_length: the tokens in front of the output (not counted by presence and frequency).
    vocab_size: where given, ``logit_bias`` ids must be below it.
    """
    processors = lp.LogitsProcessorList()
    if logit_bias:
        processors.append(lp.SequenceBiasLogitsProcessor(_bias_list(logit_bias, vocab_size)))
    _check_number("repetition_penalty", repetition_penalty, 0.0, float("inf"), low_open=True)
    if repetition_penalty != 1.0:
        processors.append(lp.RepetitionPenaltyLogitsProcessor(float(repetition_penalty)))
    if presence_penalty or frequency_penalty:
        processors.append(PresenceFrequencyPenalty(presence_penalty, frequency_penalty,
                                                   prompt_length))
    else:  # checked all the same: a bad value is an error, not a silent 0
        PresenceFrequencyPenalty(presence_penalty, frequency_penalty, prompt_length)
    return processors


def _bias_list(logit_bias: Mapping[int, float], vocab_size: int | None) -> list:
    """``logit_bias`` as ``SequenceBiasLogitsProcessor`` takes it: [[[id], bias], ...]."""
    out = []
    for token, bias in logit_bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (
                vocab_size is not None and token >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"logit_bias keys must be token ids in {bound}, got {token!r}")
        _check_number(f"logit_bias[{token}]", bias, -MAX_BIAS, MAX_BIAS)
        out.append([[token], float(bias)])
    return out


def _check_number(name: str, value, low: float, high: float, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        opening = "(" if low_open else "["
        closing = ")" if high == float("inf") else "]"
        raise ValueError(f"{name} must be a number in {opening}{low:g}, {high:g}{closing}, "
                         f"got {value!r}")
