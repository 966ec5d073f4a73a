"""judge-demo: the whole toolkit end to end on a tiny random judge (see demo/cli.py)."""
