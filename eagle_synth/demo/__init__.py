"""The demo campaign: a small prompt set and a tiny reasoning-style tokenizer, built locally."""
