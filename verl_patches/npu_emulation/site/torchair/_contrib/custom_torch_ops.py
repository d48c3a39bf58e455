"""Import-only on a CPU host: the custom ops it registers exist for graph mode, which never runs here."""
