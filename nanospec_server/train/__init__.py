"""`nanospec train-eagle`: train a full-vocabulary EAGLE-1 draft head for a target model.

Pipeline: ``corpus`` (Python standard-library sources, split by file) ->
``features`` (teacher-forced target hidden states, cached to disk) -> ``loop``
(one decoder layer, ``head``, trained with ``loss``) -> ``export`` (a directory
SGLang loads as ``--speculative-draft-model-path``). ``recipe`` holds the defaults.
"""
