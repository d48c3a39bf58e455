"""Keeping a long multi-node job honest about its failures: collective hangs named by rank, op and step."""
