"""The benchmark harness and the shape tuner.

``runner``   every method on the same prompts against HF ``generate`` (``lookahead bench``)
``methods``  how each method generates and is timed
``report``   summary rows, the Markdown table, ``results.json``
``plots``    the PNG figures
``tune``     this machine's forward-cost curve and the best lookahead shape (``lookahead tune``)
``cli``, ``tune_cli``, ``args``  the two subcommands and their shared arguments
"""

from lookahead.bench.tune import load_profile, resolve_shape

__all__ = ["load_profile", "resolve_shape"]
