"""The ``servelab`` command line; each command is a thin shell over ``servelab.api``."""
