"""What the demo, the tests and the benchmarks share to run a campaign's processes locally
(`harness`: redis-server, devservers, workers). Nothing in producer/ or workers/ imports it."""
