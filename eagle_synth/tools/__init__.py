"""Tools over campaigns and their records: status, failures, export, verify, inspect, compact."""
