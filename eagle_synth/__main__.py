"""`python -m eagle_synth ...` is `eagle-synth ...`."""

from eagle_synth.cli import main

# Guarded: processes started with the spawn method (the worker's renderers) import this module.
if __name__ == "__main__":
    main()
