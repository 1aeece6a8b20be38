"""An OpenAI-compatible server: many requests decoded together, speculation sized to the load.

    engine.py       one thread owning the model: continuous batching of ``Decoder`` requests
    batch_cache.py  the batched KV cache (a row per request, per-column validity) and step input
    budget.py       how many input tokens each request's step gets (adapts to load)
    (text deltas with OpenAI ``stop`` strings: ``lookahead.detokenize``)
    protocol.py     the OpenAI wire format: request models, responses, errors
    app.py          the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, ...
    metrics.py      Prometheus metrics
    (the ``serve`` and ``loadtest`` parsers: ``lookahead.cli.serve``)
    loadtest.py     the load generator and its report
"""
