"""Fitting the simulator's constants from measurements."""
