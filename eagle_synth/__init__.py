"""eagle-synth: regenerate prompt sets through a target model and keep the exact token ids.

The shared core: what the producer and the workers both rely on lives in this package
(settings, Redis key names, task payload, record format, campaign state, templating).
"""

__version__ = "0.1.0"
