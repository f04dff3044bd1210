"""eagle-synth benchmarks: `python -m benchmarks [--quick]` (or `make bench`) writes BENCHMARKS.md.

Not part of the test run. One module per figure of the benchmarks issue, each exposing
`run(quick: bool)`; `common` holds what they share. See docs/benchmarks.md.
"""
