"""`python -m eagle_synth ...` is `eagle-synth ...`."""

from eagle_synth.cli import main

main()
