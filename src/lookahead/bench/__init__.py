"""The benchmark harness and the shape tuner (the ``lookahead bench`` and ``lookahead tune``
commands' work; their parsers live in ``lookahead.cli``).

``runner``      every method on the same prompts against HF ``generate``
``methods``     how each method generates and is timed
``report``      summary rows, the Markdown table, ``results.json``
``groups``      tok/s per group of prompts (their category) against ``autoregressive``
``plots``       the PNG figures
``datasets``    the bundled prompt sets (HumanEval, MT-Bench, GSM8K, ...)
``cost_curve``  what a forward pass of k tokens costs here, and the speed it predicts
``shape_search`` the shapes tried and the rule that keeps one
``tune``        measures the curve and the shapes, saves the best as a profile (read by
                ``lookahead.profiles``)
"""
