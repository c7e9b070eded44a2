"""The ``podracer`` command: training with Anakin or Sebulba, presets, evaluation and plots.

``main(argv)`` is the entry point (:mod:`podracer.cli.main`); :mod:`podracer.cli.presets` holds the ready-made
settings and :mod:`podracer.cli.eval` the ``podracer eval`` command.
"""
