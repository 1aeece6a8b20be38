"""An OpenAI-compatible server: many requests decoded together, speculation sized to the load.

    engine.py       one thread owning the model: continuous batching of ``Decoder`` requests
    engine_config.py  how the engine shares the model, and its limits (timeout, context)
    requests.py     one request: its events, its handle, the engine's record of it
    (lookahead.batch_cache: the batched KV cache, a row per request, and its step input)
    budget.py       how many input tokens each request's step gets (adapts to load)
    (text deltas with OpenAI ``stop`` strings: ``lookahead.detokenize``)
    protocol.py     the OpenAI wire format: request models, responses, errors
    app.py          the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, ...
    guard.py        Host, API-key and body-size checks before any endpoint runs
    respond.py      a request's answer: server-sent events or one JSON body
    metrics.py      Prometheus metrics (prometheus_client, a registry per server)
    (the ``serve`` and ``loadtest`` parsers: ``lookahead.cli.serve``)
    loadtest.py     the load generator and its report
"""
