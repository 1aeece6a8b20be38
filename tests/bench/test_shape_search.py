"""Which shape the tuner keeps."""


from __future__ import annotations

import pytest
from lookahead.bench.shape_search import choose_shape, versus_default
from lookahead.profiles import (
    DEFAULT_SHAPE,
    SHAPE_KEYS,
)


@pytest.mark.parametrize(("lead", "chosen"), [(0.02, "default"), (0.05, "other")])
def test_tuner_keeps_the_default_unless_another_clearly_leads(lead, chosen) -> None:
    default = dict(DEFAULT_SHAPE, predicted_tokens_per_second=40.0)
    other = dict(window=1, ngram=4, guess=6, predicted_tokens_per_second=40.0 * (1 + lead))
    rows = [other, default]
    assert choose_shape(rows, margin=0.03) is (default if chosen == "default" else other)
    assert choose_shape(rows, margin=0.0) is other
    assert choose_shape([other], margin=0.5) is other  # no default among the shapes


def test_tuner_keeps_the_default_over_a_shape_that_is_slower_on_one_data_set() -> None:
    def row(shape, code, chat):
        per_set = dict(humaneval=code, mtbench=chat)
        return dict(zip(("window", "ngram", "guess"), shape), predicted_per_dataset=per_set,
                    predicted_tokens_per_second=(code + chat) / 2)

    default = row(tuple(DEFAULT_SHAPE.values()), 50.0, 30.0)
    chat_only = row((2, 4, 4), 49.0, 40.0)  # 10 % faster overall, 2 % slower on code
    assert choose_shape([default, chat_only], margin=0.03) is default
    both = row((1, 4, 6), 50.5, 34.0)  # only 6 % faster overall, but on both sets
    assert choose_shape([default, chat_only, both], margin=0.03) is both
    # Chosen by measured timing, the per-set predictions do not apply.
    chat_only["measured_tokens_per_second"], default["measured_tokens_per_second"] = 45.0, 40.0
    both["measured_tokens_per_second"] = 41.0
    assert choose_shape([default, chat_only, both], "measured", margin=0.03) is chat_only


def test_tuner_ranks_shapes_prompt_by_prompt_against_the_default() -> None:
    def row(shape, code, chat=(40.0,)):
        per_prompt = dict(humaneval=list(code), mtbench=list(chat))
        rates = [*code, *chat]  # the sum over the sample, as if every output were as long
        return dict(zip(SHAPE_KEYS, shape), predicted_per_prompt=per_prompt,
                    predicted_tokens_per_second=sum(rates) / len(rates))

    default = row((*DEFAULT_SHAPE.values(), 8), [40.0, 40.0, 40.0, 40.0])
    copier = row((1, 5, 3, 16), [90.0, 70.0, 38.0, 36.0])  # 29 % ahead, on 2 of 5 prompts
    steady = row((2, 4, 4), [42.0, 43.0, 39.0, 42.0], [41.0])  # 3.5 % ahead, on 4 of 5
    versus = versus_default(copier, default)
    assert (versus.won, versus.prompts) == (2, 5)
    assert versus.speedup == pytest.approx((90 * 70 * 38 * 36 / 40**4) ** 0.2)
    assert versus.per_dataset["mtbench"] == pytest.approx(1.0)
    assert choose_shape([default, copier], margin=0.03) is default  # though its sum leads
    assert copier["predicted_tokens_per_second"] > 1.2 * default["predicted_tokens_per_second"]
    assert choose_shape([default, copier, steady], margin=0.03) is steady
    assert choose_shape([default, copier, steady], margin=0.05) is default
    # Faster on most prompts and overall, but slower on one data set: not chosen.
    chat_loser = row((2, 4, 6), [50.0, 50.0, 50.0, 50.0], [39.0])
    assert versus_default(chat_loser, default).speedup > 1.1
    assert choose_shape([default, chat_loser], margin=0.03) is default
    # Ahead on every prompt, but not in sum (a long output where it is slow): not chosen.
    lopsided = row((1, 4, 6), [44.0, 44.0, 44.0, 44.0], [41.0])
    lopsided["predicted_tokens_per_second"] = 40.5
    assert versus_default(lopsided, default).speedup > 1.08
    assert choose_shape([default, lopsided], margin=0.03) is default
    lopsided["predicted_tokens_per_second"] = 42.0
    assert choose_shape([default, lopsided], margin=0.03) is lopsided
    # Rows without per-prompt figures (older profiles): no comparison.
    assert versus_default(steady, dict(DEFAULT_SHAPE)) is None
