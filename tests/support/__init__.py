"""Helpers shared by the test domains (tests/<domain>/); import them as `support.<module>`."""
