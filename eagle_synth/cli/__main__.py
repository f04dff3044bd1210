"""`python -m eagle_synth.cli ...` is `eagle-synth ...`."""

from eagle_synth.cli import main

main()
