"""One folder per paper: its policy, router, building blocks, theory and reproduction.

Each design's ``__init__`` imports the modules that register its policy, router and cluster
presets; the registries load every sub-package here, so adding a design touches its folder
only. Reproductions live in ``<design>/reproduce`` and are found by name by the CLI.
"""
