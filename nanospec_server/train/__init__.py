"""`nanospec train-eagle`: train a full-vocabulary EAGLE-1 draft head for a target model.

Pipeline: ``prompts`` (chat requests composed offline, split by hash) -> ``distill``
(the target answers them greedily; its hidden states are kept) -> ``features``
(cached to disk) -> ``loop`` (one decoder layer, ``head``, trained with ``loss``) ->
``export`` (a directory SGLang loads as ``--speculative-draft-model-path``).
``recipe`` holds the defaults.
"""
