"""Our trainer entry, its config and the tiny local profile."""
