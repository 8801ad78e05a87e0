"""toy_mlp: the smallest family that keeps the whole contract, and the template for a new one.

Its files are the ones every family has: `options.py` (the config section, `model.toy_mlp`),
`family.py` (typed config, model, processor and the `ModelFamily`); one line in
`models/registry.py` registers it.
"""
