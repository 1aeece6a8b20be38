"""An OpenAI-compatible server: many requests decoded together, speculation sized to the load.

    engine.py       one thread owning the model: continuous batching of ``Decoder`` requests
    (lookahead.batch_cache: the batched KV cache, a row per request, and its step input)
    budget.py       how many input tokens each request's step gets (adapts to load)
    detokenize.py   incremental text with OpenAI ``stop`` strings
    protocol.py     the OpenAI wire format: request models, responses, errors
    app.py          the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, ...
    metrics.py      Prometheus metrics
    cli.py          ``lookahead serve`` and ``lookahead loadtest``
    loadtest.py     the load generator and its report
"""
