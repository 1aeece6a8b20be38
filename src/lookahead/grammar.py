"""Structured output: a logits processor that keeps the generated text inside a grammar.

    compiler = GrammarCompiler(tokenizer, vocab_size=model.config.vocab_size,
                               stop_token_ids=[tokenizer.eos_token_id])
    grammar = compiler.json_schema({"type": "object", ...})  # or .json(), .ebnf(), .regex()
    out = lookahead.generate(model, ids, logits_processor=[grammar.processor()], ...)

The grammar library is xgrammar (``pip install 'lookahead-exact[structured]'``), chosen by
``benchmarks/grammar_mask.py``: the cheapest mask per token and per rollback of the three
measured, and its matcher rolls back any number of tokens.

Speculative decoding verifies many positions at once: ``Controls.scores`` calls this
processor once per node of the candidate tree, with that node's whole sequence (the
committed text, then the candidate tokens above it). The grammar state of a sequence depends
on its generated tokens alone, so one matcher serves every call: it rolls back to the longest
prefix it shares with the new sequence's generated tokens, then accepts the rest. A rollback
restores exactly the state after that prefix, so a proposal the model rejects leaves no trace
in the state of the committed text; where the matcher cannot roll back, it is rebuilt from
the start of the generated text. The next step's root call (the committed text) rolls back
the rejected candidates of the last node visited, usually a few tokens.

Every row gets ``-inf`` on the tokens the grammar forbids before any warper (temperature,
top-k, top-p run after the processors), so greedy decoding takes the model's best allowed
token and rejection sampling draws from the constrained distribution exactly. Once the
grammar is complete and admits nothing more, only the stop tokens are allowed. A sequence
the grammar rejects (a candidate through a forbidden token, which verification never accepts
since its parent gave that token probability zero; or text after a stop token) gets the stop
tokens only: its row is never used, and a row that is all ``-inf`` would be NaN once warped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'lookahead-exact[structured]' (or: pip install xgrammar)"


def require_xgrammar():
    """The xgrammar module, or an ImportError that says how to install it."""
    try:
        import xgrammar
    except ImportError as error:
        raise ImportError(f"structured output and tool calls need xgrammar: {INSTALL_HINT}") \
            from error
    return xgrammar


class GrammarCompiler:
    """Compiles grammars for one tokenizer; keep one per model (it caches what it compiled).

    tokenizer: the model's Hugging Face tokenizer. vocab_size: the model's logits width (the
    embedding rows, which may exceed the tokenizer's ids, as Qwen2.5's 151936 do); None:
    ``len(tokenizer)``. stop_token_ids: the ids that end generation once the grammar is
    complete (the model's EOS ids); None: the tokenizer's EOS. threads: compile threads.
    """

    def __init__(self, tokenizer, *, vocab_size: int | None = None,
                 stop_token_ids: Sequence[int] | int | None = None, threads: int = 2) -> None:
        xgr = require_xgrammar()
        if stop_token_ids is None:
            stop_token_ids = tokenizer.eos_token_id
        if isinstance(stop_token_ids, int):
            stop_token_ids = [stop_token_ids]
        if not stop_token_ids or any(not isinstance(t, int) or t < 0 for t in stop_token_ids):
            raise ValueError("stop_token_ids must name at least one token id (the model's EOS), "
                             f"got {stop_token_ids!r}: a complete grammar allows only them")
        self.vocab_size = int(vocab_size or len(tokenizer))
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=threads)

    def json(self, *, any_whitespace: bool = True) -> Grammar:
        """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return self.json_schema({"type": "object"}, any_whitespace=any_whitespace)

    def json_schema(self, schema: Mapping[str, Any] | str, *, any_whitespace: bool = True,
                    strict: bool = True) -> Grammar:
        """Text that parses as JSON valid under ``schema`` (a dict or its JSON text).

        any_whitespace: let the model place whitespace as it likes (False: compact, one
        space after ``,`` and ``:``, which bounds the length of the output). strict: objects
        take no properties beyond the schema's unless it says otherwise.
        """
        text = _schema_text(schema)
        options: dict[str, Any] = {"any_whitespace": any_whitespace, "strict_mode": strict}
        if not any_whitespace:
            options["separators"] = (",", ":")
        return self._compiled(lambda: self._compiler.compile_json_schema(text, **options),
                              f"JSON schema {text[:80]}")

    def ebnf(self, grammar: str, *, root: str = "root") -> Grammar:
        """Text in a GBNF/EBNF grammar (llama.cpp's notation), starting at rule ``root``."""
        _check_text("grammar", grammar)
        return self._compiled(lambda: self._compiler.compile_grammar(grammar, root_rule_name=root),
                              "EBNF grammar")

    def regex(self, pattern: str) -> Grammar:
        """Text that matches the regular expression ``pattern`` whole."""
        _check_text("pattern", pattern)
        return self._compiled(lambda: self._compiler.compile_regex(pattern), "regex")

    def grammar(self, grammar) -> Grammar:
        """An ``xgrammar.Grammar`` built by hand (e.g. ``Grammar.concat``), compiled."""
        return self._compiled(lambda: self._compiler.compile_grammar(grammar), "grammar")

    def response_format(self, response_format: Mapping[str, Any] | None) -> Grammar | None:
        """The grammar of an OpenAI ``response_format``: ``{"type": "text"}`` or None gives
        None (no constraint), ``{"type": "json_object"}`` any JSON object, ``{"type":
        "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`` that
        schema."""
        if response_format is None:
            return None
        if not isinstance(response_format, Mapping) or "type" not in response_format:
            raise ValueError("response_format must be an object with a 'type' of 'text', "
                             f"'json_object' or 'json_schema', got {response_format!r}")
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return self.json()
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
                raise ValueError("response_format.json_schema must be an object with a "
                                 f"'schema' object, got {spec!r}")
            return self.json_schema(spec.get("schema", {}), strict=bool(spec.get("strict")))
        raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                         f"got {kind!r}")

    def _compiled(self, compile_, what: str) -> Grammar:
        try:
            compiled = compile_()
        except (RuntimeError, ValueError) as error:
            raise ValueError(f"cannot compile the {what}: {error}") from error
        return Grammar(compiled, self.vocab_size, self.stop_token_ids)


class Grammar:
    """A compiled grammar for one tokenizer, shared by every request that uses it; each
    generation takes its own ``processor()``."""

    def __init__(self, compiled, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)

    def processor(self, prompt_length: int | None = None) -> GrammarLogitsProcessor:
        """A fresh logits processor for one generation (see ``GrammarLogitsProcessor``)."""
        return GrammarLogitsProcessor(self, prompt_length)

    def matches(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (generated ids, a final stop token included or not) are a
        complete text of the grammar."""
        matcher = require_xgrammar().GrammarMatcher(self.compiled)
        for token in tokens:
            if not matcher.accept_token(int(token)):
                return False
        return matcher.is_terminated() or matcher.is_completed()


class GrammarLogitsProcessor:
    """A Hugging Face logits processor: ``-inf`` on every token the grammar forbids next.

    Called with input_ids LongTensor [B, L] and scores FloatTensor [B, V], it sets the
    forbidden tokens of each row to ``-inf`` (in place) and returns the scores. The text it
    constrains starts after ``prompt_length`` tokens; None: after the ids of its first call
    (the prompt, as ``model.generate`` and ``lookahead.generate`` make it). One processor
    follows one generation (``copy.copy`` gives a fresh one, as a batch's rows need);
    ``reset()`` readies it for another.
    """

    def __init__(self, grammar: Grammar, prompt_length: int | None = None) -> None:
        xgr = require_xgrammar()
        self.grammar = grammar
        self.prompt_length = self._given_length = prompt_length
        self._matcher = xgr.GrammarMatcher(grammar.compiled)
        self._tokens: list[int] = []  # the generated tokens the matcher has accepted
        self._bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)

    def __copy__(self) -> GrammarLogitsProcessor:
        return GrammarLogitsProcessor(self.grammar, self._given_length)

    def reset(self, prompt_length: int | None = None) -> None:
        """Forget the generation followed so far; the next call's ids are the new prompt
        unless ``prompt_length`` says where the constrained text starts."""
        self.prompt_length = self._given_length = prompt_length
        self._matcher.reset()
        self._tokens = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[-1] < self.grammar.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} columns but the grammar was built "
                             f"for vocab_size={self.grammar.vocab_size}: give GrammarCompiler "
                             "the model's logits width")
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        if input_ids.shape[1] < self.prompt_length:
            raise ValueError(f"input_ids hold {input_ids.shape[1]} tokens, fewer than the "
                             f"prompt's {self.prompt_length}: call reset() before another "
                             "generation")
        # In place, as the scores are the caller's copy (Controls' rows, model.generate's
        # float32 copy of the logits): a copy of 150k scores per tree node is not free.
        rows = input_ids[:, self.prompt_length:].tolist()
        for row, generated in enumerate(rows):
            if self._follow(generated) and not self._matcher.is_terminated():
                self._mask(scores, row)
            else:
                self._stops_only(scores, row)
        return scores

    def _follow(self, generated: list[int]) -> bool:
        """Bring the matcher to the state after ``generated``; False where the grammar
        rejects a token of it (the matcher then stays at the longest accepted prefix)."""
        tokens = self._tokens
        shared = 0
        limit = min(len(tokens), len(generated))
        while shared < limit and tokens[shared] == generated[shared]:
            shared += 1
        if shared < len(tokens):
            try:
                self._matcher.rollback(len(tokens) - shared)
            except (RuntimeError, ValueError):  # history too short: rebuild from the start
                logger.debug("grammar matcher rebuilt at %d tokens", shared)
                self._matcher.reset()
                for token in tokens[:shared]:
                    self._matcher.accept_token(token)
            del tokens[shared:]
        for token in generated[shared:]:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token):
                return False
            tokens.append(token)
        return True

    def _mask(self, scores: torch.Tensor, row: int) -> None:
        """-inf on ``scores[row]``'s tokens the matcher's state forbids (in place)."""
        bitmask = self._bitmask
        self._matcher.fill_next_token_bitmask(bitmask)
        vocab = self.grammar.vocab_size
        line = scores[row : row + 1]
        if line.dtype == torch.float32 and line.device.type == "cpu":
            # xgrammar's own CPU kernel, without building a bool mask per node.
            require_xgrammar().apply_token_bitmask_inplace(line, bitmask, vocab_size=vocab)
        else:
            allowed = _unpack(bitmask[0].to(scores.device), vocab)
            line[0, :vocab].masked_fill_(~allowed, float("-inf"))
        if line.shape[1] > vocab:  # ids past the tokenizer's: never text of the grammar
            line[0, vocab:] = float("-inf")

    def _stops_only(self, scores: torch.Tensor, row: int) -> None:
        """Only the stop tokens allowed on ``scores[row]``."""
        line = scores[row]
        # A few scalar reads and writes: no index tensor to build per node.
        kept = [(token, line[token].item()) for token in self.grammar.stop_token_ids]
        line.fill_(float("-inf"))
        for token, value in kept:
            line[token] = value


def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool [vocab] from xgrammar's int32 bitmask [ceil(vocab / 32)] (bit j of word i: token
    32 i + j allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(-1)[:vocab].bool()


def _schema_text(schema) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"schema must be a JSON object or its JSON text: {error}") from error
    if not isinstance(schema, Mapping):
        raise ValueError(f"schema must be a JSON object (dict), got {type(schema).__name__}")
    return json.dumps(schema)


def _check_text(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
