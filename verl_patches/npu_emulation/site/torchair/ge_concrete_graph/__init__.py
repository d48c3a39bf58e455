"""Older torchair layout; the CPU stand-in provides the newer `torchair.ge` API, so this stays empty."""
