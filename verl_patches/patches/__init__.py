"""Patch declarations and the code they install, laid out to mirror the upstream area each touches."""
