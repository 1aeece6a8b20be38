"""The benchmark harness and the shape tuner (the ``lookahead bench`` and ``lookahead tune``
commands' work; their parsers live in ``lookahead.cli``).

``runner``      every method on the same prompts against HF ``generate``
``methods``     how each method generates and is timed
``report``      summary rows, the Markdown table, ``results.json``
``plots``       the PNG figures
``datasets``    the bundled prompt sets (HumanEval, MT-Bench, GSM8K, ...)
``tune``        this machine's forward-cost curve and the best lookahead shape; the profiles it
                saves are read by ``lookahead.profiles``
"""
