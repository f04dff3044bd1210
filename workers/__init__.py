"""The worker side: claims batches, gates on server health, calls /generate, writes records."""
